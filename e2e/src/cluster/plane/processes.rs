//! The control plane's processes once started: which run, their pids and memory, a component
//! restarted as after a crash, another process started under the same supervision, and all of
//! them stopped.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use super::{ComponentReport, ControlPlane, ControlPlaneError, readiness::probe_ready};
use crate::cluster::process::{self, Component, Watchdog};

/// How a component was started and is probed, so it can be started again the same way.
pub(super) struct Launch {
    pub(super) program: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) log: PathBuf,
    /// The readiness probe: a client configuration and the path that answers `ok`.
    pub(super) probe: Option<(kube::Config, &'static str)>,
}

pub(super) struct Running {
    pub(super) components: Vec<Arc<Component>>,
    /// By component name.
    pub(super) launches: BTreeMap<String, Launch>,
    /// Seconds from the first process start to each component's readiness.
    pub(super) ready_after: Vec<(String, f64)>,
    pub(super) watchdog: Watchdog,
}

impl ControlPlane {
    /// Seconds from starting etcd to each component's readiness, in the order they got ready.
    pub fn ready_after(&self) -> Vec<(String, f64)> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .as_ref()
            .map(|r| r.ready_after.clone())
            .unwrap_or_default()
    }

    /// Process ids by component name (empty once stopped).
    pub fn pids(&self) -> BTreeMap<String, u32> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .flat_map(|r| r.components.iter())
            .map(|c| (c.name().to_owned(), c.pid()))
            .chain(
                running
                    .iter()
                    .map(|r| ("watchdog".to_owned(), r.watchdog.pid())),
            )
            .collect()
    }

    /// Resident memory of each component, in KiB, from `/proc/<pid>/status`.
    pub fn rss_kib(&self) -> BTreeMap<String, u64> {
        self.pids()
            .into_iter()
            .filter(|(name, _)| name != "watchdog")
            .filter_map(|(name, pid)| Some((name, process::rss_kib(pid)?)))
            .collect()
    }

    /// Starts another process under this control plane's supervision (a node's containerd,
    /// kubelet, kube-proxy): in its own process group, dying with the owner like the
    /// components, its group killed by the watchdog if the owner dies. `args` must name the
    /// state directory (the watchdog kills only groups whose leader does). The caller stops it.
    pub fn start_process(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Component, ControlPlaneError> {
        let c = Component::start(
            &self.spawner,
            name,
            program,
            args,
            log,
            &self.state_dir.join("pgids"),
        )?;
        c.announce_death();
        Ok(c)
    }

    /// Ok while every component runs; else which one died, how, and the end of its log.
    pub fn check(&self) -> Result<(), ControlPlaneError> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let Some(r) = running.as_ref() else {
            return Err(ControlPlaneError::Stopped(self.state_dir.clone()));
        };
        for c in &r.components {
            if let Some(status) = c.exit_status() {
                return Err(ControlPlaneError::Died {
                    report: ComponentReport::of(c),
                    pid: c.pid(),
                    status,
                });
            }
        }
        Ok(())
    }

    /// Kills component `name` (`etcd`, `kube-apiserver`, ...) with SIGKILL as a crash would,
    /// leaves it down for `down`, starts it again with the same flags, state and port, and
    /// returns once it is ready again. The others keep running (and reconnect on their own).
    pub async fn restart_component(
        &self,
        name: &str,
        down: Duration,
    ) -> Result<(), ControlPlaneError> {
        // Zero grace: SIGTERM and SIGKILL at once, no graceful shutdown.
        // An async block: the pause starts once the component is down, not before.
        self.restart_component_with(name, Duration::ZERO, async move {
            tokio::time::sleep(down).await;
        })
        .await
    }

    /// etcd's data directory (what a volume snapshot of an etcd member would hold).
    pub fn etcd_data_dir(&self) -> PathBuf {
        self.state_dir.join("etcd")
    }

    /// etcd's client URL (what `etcdctl --endpoints` takes).
    pub fn etcd_client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }

    /// etcd's peer URL (what a restored member must advertise).
    pub fn etcd_peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_peer)
    }

    /// Stops component `name` (SIGTERM, SIGKILL after `grace`), runs `while_down` (a restore puts
    /// an older etcd data directory in place here), starts it again with the same flags, state
    /// and port, and returns once it is ready again.
    pub async fn restart_component_with(
        &self,
        name: &str,
        grace: Duration,
        while_down: impl std::future::Future<Output = ()>,
    ) -> Result<(), ControlPlaneError> {
        let not_running = || ControlPlaneError::Invalid {
            what: "component to restart",
            value: name.to_owned(),
            why: "not a running component of this control plane",
        };
        let (old, program, args, log, probe) = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let r = running.as_ref().ok_or_else(not_running)?;
            let old = r
                .components
                .iter()
                .find(|c| c.name() == name)
                .cloned()
                .ok_or_else(not_running)?;
            let launch = r.launches.get(name).ok_or_else(not_running)?;
            (
                old,
                launch.program.clone(),
                launch.args.clone(),
                launch.log.clone(),
                launch.probe.clone(),
            )
        };
        let stopping = Arc::clone(&old);
        let _ = tokio::task::spawn_blocking(move || stopping.stop(grace)).await;
        while_down.await;
        let new = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let r = running.as_mut().ok_or_else(not_running)?;
            let new = Arc::new(Component::start(
                &self.spawner,
                name,
                &program,
                &args,
                &log,
                &self.state_dir.join("pgids"),
            )?);
            for c in r.components.iter_mut() {
                if Arc::ptr_eq(c, &old) {
                    *c = Arc::clone(&new);
                }
            }
            new
        };
        if let Some((config, path)) = probe {
            probe_ready(&new, config, path).await?;
        }
        new.announce_death();
        Ok(())
    }

    /// Stops every component (scheduler and controller-manager first, etcd last), then removes
    /// the state directory. Idempotent; blocks for up to a few seconds.
    pub fn stop(&self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut r) = running.take() {
            stop_running(&mut r, &self.state_dir, Duration::from_secs(5));
        }
    }
}

pub(super) fn stop_running(running: &mut Running, state_dir: &Path, grace: Duration) {
    for c in running.components.iter().rev() {
        c.stop(grace);
    }
    running.components.clear();
    let _ = std::fs::remove_file(state_dir.join("pgids"));
    let _ = std::fs::remove_dir_all(state_dir);
    running.watchdog.finish();
}
