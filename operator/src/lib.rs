//! ipkeep's operator: the IPReservation resource ([`api`]), the controller that keeps reservations
//! in step with annotated pods and expires them ([`controller`]), and the node agent that mirrors
//! its node's reservations to the files the plugin reads ([`agent`]).

pub mod agent;
pub mod api;
pub mod backoff;
pub mod check;
pub mod controller;
pub mod crd_apply;
pub mod events;
pub mod install_cni;
pub mod logging;
pub mod probes;
pub mod rules;
pub mod shutdown;
