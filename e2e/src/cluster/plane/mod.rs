//! The control plane itself: etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
//! 127.0.0.1 with fresh state in a private directory, started in order and awaited on `/readyz`.
//!
//! Each job in its own file: what it is started with ([`options`]), its ports ([`ports`]) and
//! state directory ([`state_dir`]), its certificates and kubeconfigs (`credentials.rs`), the
//! components started in order (`boot.rs`) and awaited (`readiness.rs`), the audit log
//! (`audit.rs`), its processes once running (`processes.rs`), reaching it (`access.rs`), etcd
//! backed up and restored ([`backup`]), and what goes wrong ([`error`]).

mod access;
mod audit;
pub mod backup;
mod boot;
mod credentials;
pub mod error;
pub mod options;
pub mod ports;
mod processes;
mod readiness;
pub mod state_dir;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

pub use error::{ComponentReport, ControlPlaneError};
pub use options::{COMPONENT_BINARIES, ControlPlaneOptions, NodeAccess, SERVICE_CIDR, bin_dir};
pub use ports::Ports;
pub use state_dir::{STATE_DIR_PREFIX, kill_recorded_groups, process_alive, reap_stale};

use super::{
    pki::Pki,
    process::{Spawner, Watchdog},
};
use boot::Boot;
use options::check_bin_dir;
use ports::{api_url, check_port_free, free_port};
use processes::{Running, stop_running};
use state_dir::{new_state_dir, state_err};

/// A running control plane. Dropping it stops everything and removes its state directory;
/// so does the death of the process that owns it (see [`super::process`]).
pub struct ControlPlane {
    state_dir: PathBuf,
    bin_dir: PathBuf,
    ports: Ports,
    server: String,
    kubeconfig: PathBuf,
    ca: PathBuf,
    pki: Pki,
    audit_log: Option<PathBuf>,
    config: kube::Config,
    running: Mutex<Option<Running>>,
    // Dropped last: the parent-death signal of every component is tied to this thread.
    spawner: Spawner,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("state_dir", &self.state_dir)
            .field("server", &self.server)
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts a control plane and returns once every component answers its readiness probe
    /// (`/readyz`; the controller-manager only has `/healthz`).
    ///
    /// Free ports are found by binding port 0 and letting go, so another process can take one
    /// before the component binds it: a component that then fails with "address already in use"
    /// on a port the harness picked is retried (twice) on new ports, and says so.
    pub async fn start(options: ControlPlaneOptions) -> Result<ControlPlane, ControlPlaneError> {
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                Err(ControlPlaneError::Exited { report, .. })
                    if attempt < 3
                        && report.tail.contains("address already in use")
                        && !(report.name == "kube-apiserver"
                            && options.apiserver_port.is_some()) =>
                {
                    eprintln!(
                        "ipkeep-e2e cluster: {} lost a port the harness picked to another process (attempt {attempt}); retrying on new ports",
                        report.name
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(options: &ControlPlaneOptions) -> Result<ControlPlane, ControlPlaneError> {
        let started = Instant::now();
        let bin_dir = match &options.bin_dir {
            Some(d) => {
                check_bin_dir(d)?;
                d.clone()
            }
            None => bin_dir()?,
        };
        let parent = options
            .state_parent
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        for line in reap_stale(&parent) {
            eprintln!("ipkeep-e2e cluster: {line}");
        }
        let state_dir = match &options.state_dir {
            Some(d) => d.clone(),
            None => new_state_dir(&parent),
        };
        let apiserver_port = match options.apiserver_port {
            Some(p) => check_port_free(p, "kube-apiserver")?,
            None => free_port()?,
        };
        let ports = Ports {
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            apiserver: apiserver_port,
            controller_manager: free_port()?,
            scheduler: free_port()?,
        };

        // create_dir (not _all) on the leaf: an existing directory, or a symlink planted in its
        // place, is refused rather than reused.
        std::fs::create_dir_all(&parent).map_err(state_err("create the parent of", &parent))?;
        // Private: it holds keys and, later, token kubeconfigs.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&state_dir)
            .map_err(state_err("create", &state_dir))?;
        std::fs::write(state_dir.join("owner"), format!("{}\n", std::process::id()))
            .map_err(state_err("write the owner file of", &state_dir))?;
        let spawner =
            Spawner::new().map_err(state_err("start the spawner thread for", &state_dir))?;
        let watchdog = Watchdog::start(&spawner, &state_dir, &options.cleanup_command)?;
        let mut running = Running {
            components: Vec::new(),
            launches: BTreeMap::new(),
            ready_after: Vec::new(),
            watchdog,
        };
        match Self::boot(options, &bin_dir, &state_dir, ports, &spawner, &mut running).await {
            Ok((pki, kubeconfig, config, audit_log)) => {
                for c in &running.components {
                    c.announce_death();
                }
                let plane = ControlPlane {
                    server: api_url(options, ports),
                    ca: pki.ca_cert.clone(),
                    pki,
                    state_dir,
                    bin_dir,
                    ports,
                    kubeconfig,
                    audit_log,
                    config,
                    running: Mutex::new(Some(running)),
                    spawner,
                };
                let ready = serde_json::json!({
                    "server": plane.server,
                    "kubeconfig": plane.kubeconfig,
                    "binDir": plane.bin_dir,
                    "ports": ports,
                    "pids": plane.pids(),
                    "startSeconds": started.elapsed().as_secs_f64(),
                    "readyAfterSeconds": plane.ready_after(),
                });
                // Renamed into place: `cluster up` takes its existence as the signal to read it.
                let tmp = plane.state_dir.join("ready.tmp");
                std::fs::write(&tmp, ready.to_string())
                    .and_then(|()| std::fs::rename(&tmp, plane.state_dir.join("ready")))
                    .map_err(state_err("write the ready file of", &plane.state_dir))?;
                Ok(plane)
            }
            Err(e) => {
                stop_running(&mut running, &state_dir, Duration::from_secs(2));
                Err(e)
            }
        }
    }

    /// Starts the components in order, each once the one it needs is ready: the certificates
    /// and kubeconfigs, etcd, kube-apiserver, then kube-controller-manager and kube-scheduler.
    async fn boot(
        options: &ControlPlaneOptions,
        bin_dir: &Path,
        dir: &Path,
        ports: Ports,
        spawner: &Spawner,
        running: &mut Running,
    ) -> Result<(Pki, PathBuf, kube::Config, Option<PathBuf>), ControlPlaneError> {
        let boot = Boot {
            options,
            bin_dir,
            dir,
            ports,
            spawner,
            logs: dir.join("logs"),
            pgids: dir.join("pgids"),
            started: Instant::now(),
        };
        let credentials = boot.write_credentials()?;
        let etcd = boot.start_etcd(running).await?;
        let (config, audit_log) = boot.start_apiserver(running, &credentials, &etcd).await?;
        boot.start_controller_manager_and_scheduler(running, &credentials, &config)
            .await?;
        Ok((credentials.pki, credentials.admin, config, audit_log))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
