//! ipkeep's operator: the IPReservation resource ([`api`]), the controller that keeps reservations
//! in step with annotated pods and expires them ([`controller`]), and the node agent that mirrors
//! its node's reservations to the files the plugin reads ([`agent`]). Both are built the same way:
//! the decisions in [`rules`] (no Kubernetes types), the machinery in [`runtime`].

pub mod agent;
pub mod api;
pub mod check;
pub mod controller;
pub mod crd_apply;
pub mod host_root;
pub mod install_cni;
pub mod recover;
pub mod rules;
pub mod runtime;
