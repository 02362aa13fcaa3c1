//! How the demo tells its story: headings and notes, the commands it runs printed with their
//! output as a user would type them, and the manifests it applies.

use std::{path::PathBuf, process::Command};

use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};

use super::error::DemoError;

pub(super) fn say(text: &str) {
    println!("\n==> {text}");
}

pub(super) fn note(text: &str) {
    println!("    {text}");
}

/// The control plane's kubectl as admin.
pub(super) struct Kubectl {
    /// The built kubectl.
    pub(super) bin: PathBuf,
    /// The admin kubeconfig.
    pub(super) kubeconfig: PathBuf,
}

/// Runs the built kubectl, printing the command line and its output.
pub(super) fn show(k: &Kubectl, args: &[&str]) -> Result<String, DemoError> {
    println!("\n$ kubectl {}", args.join(" "));
    let out = kubectl(k, args)?;
    print!("{out}");
    Ok(out)
}

pub(super) fn kubectl(k: &Kubectl, args: &[&str]) -> Result<String, DemoError> {
    let mut cmd = Command::new(&k.bin);
    cmd.env("KUBECONFIG", &k.kubeconfig).args(args);
    run_command(&mut cmd)
}

/// Runs `cmd` without input and returns its stdout; a failure to start or a non-zero exit is a
/// [`DemoError::Command`] with what it printed.
pub(super) fn run_command(cmd: &mut Command) -> Result<String, DemoError> {
    Ok(crate::command::stdout_of(
        cmd,
        crate::command::Stdin::Empty,
    )?)
}

pub(super) fn io_error(what: String) -> impl FnOnce(std::io::Error) -> DemoError {
    move |source| DemoError::Io { what, source }
}

pub(super) fn ipr_resource() -> ApiResource {
    ApiResource {
        group: "ipkeep.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ipkeep.dev/v1alpha1".into(),
        kind: "IPReservation".into(),
        plural: "ipreservations".into(),
    }
}

pub(super) async fn reservation_phase(api: &Api<DynamicObject>, name: &str) -> Option<String> {
    let r = api.get_opt(name).await.ok()??;
    r.data["status"]["phase"].as_str().map(str::to_owned)
}

/// The story's StatefulSet: `replicas` pods wherever the scheduler puts them, annotated to keep
/// their addresses for `retain_for`, with the container list items `container` (YAML at six
/// spaces).
pub(super) fn statefulset(name: &str, replicas: u32, retain_for: &str, container: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations:
        ipkeep.dev/retain: "true"        # keep this pod's IP when it is deleted
        ipkeep.dev/retain-for: "{retain_for}"      # ... for this long after it is gone
    spec:
      # No node named: addresses are node-local, and ipkeep's placement webhook brings a
      # returning pod back to the node that holds its address.
      terminationGracePeriodSeconds: 1
      containers:
{container}"#
    )
}
