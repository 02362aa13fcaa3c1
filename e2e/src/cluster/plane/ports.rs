//! The ports of one control plane, found free on loopback, and the API server's URL on them.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};

use super::{ControlPlaneError, ControlPlaneOptions};

/// The ports of one control plane.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Ports {
    /// etcd clients (plain HTTP on loopback).
    pub etcd_client: u16,
    /// etcd peers.
    pub etcd_peer: u16,
    /// kube-apiserver (HTTPS).
    pub apiserver: u16,
    /// kube-controller-manager's health and metrics (HTTPS).
    pub controller_manager: u16,
    /// kube-scheduler's health and metrics (HTTPS).
    pub scheduler: u16,
}

/// The API server's URL: on the nodes' address when it serves nodes, else on loopback.
pub(super) fn api_url(options: &ControlPlaneOptions, ports: Ports) -> String {
    let host = options
        .node_access
        .as_ref()
        .map_or(Ipv4Addr::LOCALHOST, |a| a.address);
    format!("https://{host}:{}", ports.apiserver)
}

pub(super) fn free_port() -> Result<u16, ControlPlaneError> {
    let l = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .map_err(ControlPlaneError::NoFreePort)?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(ControlPlaneError::NoFreePort)
}

pub(super) fn check_port_free(port: u16, what: &str) -> Result<u16, ControlPlaneError> {
    match TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
        Ok(_) => Ok(port),
        Err(_) => Err(ControlPlaneError::PortTaken {
            port,
            what: what.to_owned(),
        }),
    }
}
