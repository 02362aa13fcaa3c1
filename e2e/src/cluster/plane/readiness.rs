//! Waiting for a component to answer its readiness probe, failing with its log when it dies or
//! never answers.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use kube::Client;

use super::{ComponentReport, ControlPlaneError, processes::Running};
use crate::cluster::process::Component;

/// How long each component may take to become ready (a busy 2-core machine, a cold page cache).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits until component `name` answers `path` on `config`'s URL, and keeps that probe for a
/// restart.
pub(super) async fn wait_ready(
    running: &mut Running,
    name: &str,
    config: kube::Config,
    path: &'static str,
) -> Result<(), ControlPlaneError> {
    let Some(component) = running.components.iter().find(|c| c.name() == name) else {
        return Err(ControlPlaneError::Invalid {
            what: "component",
            value: name.to_owned(),
            why: "not started",
        });
    };
    let component = Arc::clone(component);
    if let Some(launch) = running.launches.get_mut(name) {
        launch.probe = Some((config.clone(), path));
    }
    probe_ready(&component, config, path).await
}

pub(super) async fn probe_ready(
    component: &Component,
    mut config: kube::Config,
    path: &str,
) -> Result<(), ControlPlaneError> {
    let name = component.name();
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let url = format!(
        "{}{}",
        config.cluster_url.to_string().trim_end_matches('/'),
        path
    );
    let client = Client::try_from(config).map_err(|source| ControlPlaneError::Api {
        what: format!("build a client to probe {name}"),
        source,
    })?;
    let started = Instant::now();
    let mut last: String;
    loop {
        if let Some(status) = component.exit_status() {
            return Err(ControlPlaneError::Exited {
                report: ComponentReport::of(component),
                status,
            });
        }
        let request = http::Request::get(path).body(Vec::new());
        match request {
            Ok(req) => match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" || body.contains("\"health\":\"true\"") => {
                    return Ok(());
                }
                Ok(body) => last = body.chars().take(300).collect(),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        if started.elapsed() > READY_TIMEOUT {
            return Err(ControlPlaneError::NotReady {
                report: ComponentReport::of(component),
                why: format!(
                    "{url} was not ready after {}s (last answer: {last})",
                    started.elapsed().as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
