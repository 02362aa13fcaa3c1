//! `ipkeep-e2e demo`: the whole system on this machine, and the story told in plain output.
//!
//! On real nodes ([`story`]): the control plane and two nodes running kubelet,
//! containerd, runc and kube-proxy, ipkeep installed with `helm install` from the chart and
//! `make image`'s archive, then the scenarios' own steps told as they happen
//! ([`crate::scenarios`]): a busybox StatefulSet, its pods and addresses, `web-1` deleted and
//! back with the same address (on `eth0` inside the pod, answering a client pod),
//! `kubectl get ipr`, and one reservation expiring. With `--keep` it then waits for Ctrl-C,
//! printing the `KUBECONFIG` to explore with. Whatever happens (an error, Ctrl-C, SIGTERM)
//! everything it started is stopped and removed.

use std::time::Instant;

use crate::cluster::realnode::Cluster;

mod error;
mod narrate;
mod story;

pub use error::DemoError;
pub use story::DemoOptions;

/// Runs the demo; everything it started is gone when it returns, whatever it returns.
pub async fn run(options: DemoOptions) -> Result<(), DemoError> {
    preflight(&options)?;
    let t0 = Instant::now();
    let mut real: Option<Cluster> = None;
    let mut told = false;
    let result = {
        let story = story::story(&options, &mut real, &mut told, t0);
        tokio::pin!(story);
        tokio::select! {
            r = &mut story => r,
            () = interrupted() => Err(DemoError::Interrupted),
        }
    };
    // With --keep, Ctrl-C after the story is the normal end.
    let result = match result {
        Err(DemoError::Interrupted) if told && options.keep => Ok(()),
        other => other,
    };
    narrate::say(
        "Cleaning up: pods, containers, node daemons, their namespaces, mounts, cgroups and firewall rules, the control plane",
    );
    if let Some(cluster) = real.take()
        && let Err(e) = cluster.stop()
    {
        eprintln!("demo: cleanup incomplete: {}", crate::error_chain(&e));
    }
    if result.is_ok() {
        narrate::say(&format!(
            "Done in {:.0} s; nothing is left running.",
            t0.elapsed().as_secs_f64()
        ));
    }
    result
}

fn preflight(options: &DemoOptions) -> Result<(), DemoError> {
    if !rustix::process::geteuid().is_root() {
        return Err(DemoError::NotRoot);
    }
    if !options.image_archive.is_file() {
        return Err(DemoError::Missing {
            what: "the ipkeep image archive",
            path: options.image_archive.clone(),
            hint: "run: make image",
        });
    }
    if !options.chart.join("Chart.yaml").is_file() {
        return Err(DemoError::Missing {
            what: "the Helm chart",
            path: options.chart.clone(),
            hint: "run from the repository root",
        });
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
