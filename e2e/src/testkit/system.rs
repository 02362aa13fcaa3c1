//! The whole system for the end-to-end scenarios (the testkit's `system`): a cluster with the
//! chart installed — this test binary's own real nodes ([`super::realnode`], which hands them over
//! with [`run_on_chart_cluster`]) or a user's cluster named by `IPKEEP_E2E_KUBECONFIG` — and a
//! [`System`] per test on it: a fresh namespace, the cluster's Ready untainted nodes, and the
//! chart's controller and agents (the test starts none of its own).
//!
//! Each test works in its own namespace, so the tests of one binary may share the nodes. Dropping
//! a [`System`] deletes its namespace (and so its pods and reservations), also when an assertion
//! failed; the nodes and the release stay for the binary's other tests.
//!
//! The steps a scenario shares with the demo ([`crate::scenarios`]) use the `try_` methods,
//! which return a [`ScenarioError`]; the others fail the test that called them.

use crate::testkit::{DEADLINE, KubectlTarget, wait_for};

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use futures::StreamExt;
use ipkeep_operator::api::{IPReservation, Phase};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{Api, Client, ResourceExt, api::ListParams, runtime::watcher};

/// A cluster with the chart installed: its kubeconfig and the kubectl to use.
#[derive(Debug, Clone)]
pub struct ChartCluster {
    /// Its kubeconfig.
    pub kubeconfig: PathBuf,
    /// The kubectl that talks to it.
    pub kubectl: PathBuf,
}

impl KubectlTarget for ChartCluster {
    fn kubectl_command(&self) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }
}

/// The variable that runs the scenarios on a user's cluster: the path of a kubeconfig of a
/// cluster with the chart installed. Deliberately not `KUBECONFIG`, so a developer's everyday
/// kubeconfig never makes `make test` touch their cluster.
pub const REAL_CLUSTER_ENV: &str = "IPKEEP_E2E_KUBECONFIG";

/// This test binary's own cluster with the chart installed (named by [`run_on_chart_cluster`]).
static CHART_CLUSTER: Mutex<Option<ChartCluster>> = Mutex::new(None);

/// From now on, [`System::start`] puts the tests of this binary on `cluster` (the chart
/// installed on this binary's real nodes; the last call wins: one binary runs its clusters one
/// after the other).
pub fn run_on_chart_cluster(cluster: ChartCluster) {
    *CHART_CLUSTER.lock().unwrap_or_else(|p| p.into_inner()) = Some(cluster);
}

/// Whether the scenarios run on a user's cluster named by `IPKEEP_E2E_KUBECONFIG` rather than
/// on this binary's own real nodes.
pub fn on_users_cluster() -> bool {
    std::env::var_os(REAL_CLUSTER_ENV).is_some_and(|v| !v.is_empty())
}

/// For a test that needs this machine's own nodes (their disks, a tiny node, its own control
/// plane): on a user's cluster says loudly that it is skipped and returns true (the test then
/// returns).
pub fn skipped_on_users_cluster(test: &str, needs: &str) -> bool {
    if !on_users_cluster() {
        return false;
    }
    eprintln!(
        "SKIPPED on a user's cluster: {test} needs this machine's own real nodes ({needs}); ran 0 checks (it runs without {REAL_CLUSTER_ENV})"
    );
    true
}

/// The cluster with the chart installed the scenarios run on: a user's cluster named by
/// `IPKEEP_E2E_KUBECONFIG` (with `IPKEEP_E2E_KUBECTL`, else `kubectl`), or this binary's own real
/// nodes once [`run_on_chart_cluster`] has named them; `None` before that.
pub fn scenario_cluster() -> Option<ChartCluster> {
    if let Some(kubeconfig) = std::env::var_os(REAL_CLUSTER_ENV).filter(|v| !v.is_empty()) {
        return Some(ChartCluster {
            kubeconfig: PathBuf::from(kubeconfig),
            kubectl: std::env::var_os("IPKEEP_E2E_KUBECTL")
                .map_or_else(|| PathBuf::from("kubectl"), PathBuf::from),
        });
    }
    CHART_CLUSTER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// One `#[tokio::test]` per scenario `module::name` (an `async fn()`), each run where
/// [`System::start`] puts this binary's tests; with `before;`, that is awaited first (a
/// real-node binary's setup, whose result lives as long as the test).
#[macro_export]
macro_rules! scenario_tests {
    ($module:ident: $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $module::$name().await;
            }
        )+
    };
    ($before:expr; $module:ident: $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let _setup = $before.await;
                $module::$name().await;
            }
        )+
    };
}

pub use crate::scenario_tests;

/// What a test asks of its system.
#[derive(Debug, Clone)]
pub struct Options {
    /// Number of nodes it places pods on.
    pub nodes: usize,
    /// Whether it wants dual-stack nodes (it gets them if the cluster's nodes have two pod CIDRs).
    pub dual_stack: bool,
    /// The namespace's exact name (the demo's `demo`); none: a fresh generated one.
    pub namespace: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            dual_stack: false,
            namespace: None,
        }
    }
}

/// A step of a scenario that failed, or a check of it that did not hold.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A Kubernetes API call failed.
    #[error("failed to {what}")]
    Api {
        /// What was asked.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The cluster's kubeconfig could not be read or used.
    #[error("failed to load the kubeconfig {path}")]
    Kubeconfig {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// kubectl could not be run, or failed.
    #[error(transparent)]
    Command(#[from] crate::command::CommandError),
    /// Something did not come true in time.
    #[error(transparent)]
    Timeout(#[from] crate::wait::TimedOut),
    /// A check did not hold: what was expected, and what was found.
    #[error("{0}")]
    Check(String),
}

/// `Ok` if `holds`, else the check's failure, `said` lazily.
pub fn ensure(holds: bool, said: impl FnOnce() -> String) -> Result<(), ScenarioError> {
    if holds {
        Ok(())
    } else {
        Err(ScenarioError::Check(said()))
    }
}

/// The value, or the test fails with the whole error chain (how tests run the `try_` steps).
pub fn or_fail<T>(result: Result<T, ScenarioError>) -> T {
    result.unwrap_or_else(|e| panic!("{}", crate::error_chain(&e)))
}

/// A [`ScenarioError::Api`] saying what was asked.
fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ScenarioError {
    let what = what.into();
    move |source| ScenarioError::Api { what, source }
}

/// The whole system of one test: a namespace of its own on a cluster with the chart installed.
pub struct System {
    /// The cluster.
    pub target: ChartCluster,
    /// An admin client (on the test's runtime).
    pub client: Client,
    /// The test's namespace.
    pub ns: String,
    /// The names of the cluster's Ready untainted nodes the test uses.
    pub node_names: Vec<String>,
    /// Whether the test's nodes are dual-stack (asked for, and found on the cluster).
    pub dual_stack: bool,
    /// The checks of the test: (what, why it was skipped, if it was).
    checks: Mutex<Vec<(String, Option<String>)>>,
    /// When it started, to print how long the test took.
    started: std::time::Instant,
}

impl System {
    /// A fresh system on the scenarios' cluster ([`scenario_cluster`]); see [`System::on`].
    pub async fn start(prefix: &str, options: Options) -> System {
        let real = scenario_cluster().unwrap_or_else(|| {
            panic!(
                "no cluster with the chart installed: a scenario runs on this binary's real nodes (call testkit::realnode::use_real_nodes first) or on the cluster {REAL_CLUSTER_ENV} names"
            )
        });
        System::on(prefix, options, real).await
    }

    /// A fresh namespace on `real`, a cluster with the chart installed; see [`System::try_on`].
    pub async fn on(prefix: &str, options: Options, real: ChartCluster) -> System {
        or_fail(System::try_on(prefix, options, real).await)
    }

    /// A fresh namespace on `real`, a cluster with the chart installed: a client from its
    /// kubeconfig, the chart's CRD checked (not applied), its first `options.nodes` Ready
    /// untainted nodes. Starts no controller or agent: the chart's run.
    pub async fn try_on(
        prefix: &str,
        options: Options,
        real: ChartCluster,
    ) -> Result<System, ScenarioError> {
        let kubeconfig = real.kubeconfig.clone();
        let bad_kubeconfig =
            |e: Box<dyn std::error::Error + Send + Sync>| ScenarioError::Kubeconfig {
                path: kubeconfig.clone(),
                source: e,
            };
        let config = kube::config::Kubeconfig::read_from(&kubeconfig)
            .map_err(|e| bad_kubeconfig(e.into()))?;
        let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .map_err(|e| bad_kubeconfig(e.into()))?;
        let client = Client::try_from(config).map_err(api("make a client for the cluster"))?;
        let crds: Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = Api::all(client.clone());
        let crd = crds
            .get_opt("ipreservations.ipkeep.dev")
            .await
            .map_err(api("read the IPReservation CRD"))?;
        ensure(crd.is_some(), || {
            format!(
                "the cluster of {} has no CRD ipreservations.ipkeep.dev: install the chart first: helm install ipkeep charts/ipkeep --namespace ipkeep-system --create-namespace",
                kubeconfig.display()
            )
        })?;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let mut usable: Vec<(String, usize)> = nodes
            .list(&ListParams::default())
            .await
            .map_err(api("list the cluster's nodes"))?
            .items
            .into_iter()
            .filter(schedulable)
            .map(|n| {
                let cidrs = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.pod_cidrs.clone())
                    .unwrap_or_default();
                (n.name_any(), cidrs.len())
            })
            .collect();
        usable.sort();
        ensure(usable.len() >= options.nodes, || {
            format!(
                "the cluster has {} Ready untainted nodes, this test needs {}",
                usable.len(),
                options.nodes
            )
        })?;
        usable.truncate(options.nodes);
        let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let mut ns_obj = k8s_openapi::api::core::v1::Namespace::default();
        match options.namespace {
            Some(name) => ns_obj.metadata.name = Some(name),
            None => ns_obj.metadata.generate_name = Some(format!("ipkeep-e2e-{prefix}-")),
        }
        let ns = ns_api
            .create(&Default::default(), &ns_obj)
            .await
            .map_err(api("create the namespace"))?
            .name_any();
        eprintln!(
            "{ns}: on the cluster of {}, nodes {:?}",
            kubeconfig.display(),
            usable.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        Ok(System {
            target: real,
            client,
            ns,
            dual_stack: options.dual_stack && usable.iter().all(|(_, c)| *c >= 2),
            node_names: usable.into_iter().map(|(n, _)| n).collect(),
            checks: Mutex::default(),
            started: std::time::Instant::now(),
        })
    }

    /// The name of the test's `i`-th node.
    pub fn node_name(&self, i: usize) -> &str {
        &self.node_names[i]
    }

    /// The checks so far (a panic elsewhere does not lose them).
    fn checks(&self) -> std::sync::MutexGuard<'_, Vec<(String, Option<String>)>> {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a check the test made.
    pub fn check(&self, what: &str) {
        self.checks().push((what.to_owned(), None));
    }

    /// Records a check this cluster cannot make because it lacks `needs`, and says so loudly
    /// (once per check); the summary lists it as skipped.
    pub fn skip(&self, what: &str, needs: &str) {
        let mut checks = self.checks();
        if !checks.iter().any(|(w, h)| w == what && h.is_some()) {
            eprintln!("{}: skipped: {what} needs {needs}", self.ns);
            checks.push((what.to_owned(), Some(needs.to_owned())));
        }
    }

    /// The summary of the test's checks: "ran N of M checks; skipped: ...".
    pub fn summary(&self) -> String {
        let checks = self.checks();
        let mut seen: Vec<&(String, Option<String>)> = Vec::new();
        for c in checks.iter() {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
        let skipped: Vec<&str> = seen
            .iter()
            .filter(|(_, h)| h.is_some())
            .map(|(w, _)| w.as_str())
            .collect();
        format!(
            "ran {} of {} checks; skipped: {}",
            seen.len() - skipped.len(),
            seen.len(),
            if skipped.is_empty() {
                "none".to_owned()
            } else {
                skipped.join(", ")
            }
        )
    }

    /// kubectl in the test's namespace; its stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        or_fail(self.try_kubectl(args, None))
    }

    /// kubectl in the test's namespace with `args` and `stdin`; its stdout.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, ScenarioError> {
        let mut cmd = self.target.kubectl_command();
        cmd.args(["-n", self.ns.as_str()]).args(args);
        Ok(crate::command::stdout_of(&mut cmd, stdin)?)
    }

    /// `kubectl apply -f -` of `yaml` in the test's namespace.
    pub fn apply(&self, yaml: &str) -> String {
        or_fail(self.try_apply(yaml))
    }

    /// `kubectl apply -f -` of `yaml` in the test's namespace; what kubectl said.
    pub fn try_apply(&self, yaml: &str) -> Result<String, ScenarioError> {
        self.try_kubectl(&["apply", "-f", "-"], Some(yaml))
    }

    /// Pods of the namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Reservations of the namespace.
    pub fn reservations(&self) -> Api<IPReservation> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The running pods with addresses matching `labels`: name → what they are.
    pub async fn running(&self, labels: &str) -> BTreeMap<String, RunningPod> {
        or_fail(self.try_running(labels).await)
    }

    /// The running pods with addresses matching `labels`: name → what they are.
    pub async fn try_running(
        &self,
        labels: &str,
    ) -> Result<BTreeMap<String, RunningPod>, ScenarioError> {
        let list = self
            .pods()
            .list(&ListParams::default().labels(labels))
            .await
            .map_err(api(format!("list the pods {labels}")))?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| RunningPod::of(&p))
            .map(|r| (r.name.clone(), r))
            .collect())
    }

    /// Applies the StatefulSet `name` of `replicas` pods kept for an hour, placed on `node`, and
    /// waits until they run with their reservations Bound.
    pub async fn run_retained(
        &self,
        name: &str,
        replicas: u32,
        node: &str,
    ) -> BTreeMap<String, RunningPod> {
        self.run_annotated(name, replicas, &[node], &[]).await
    }

    /// As [`System::run_retained`], on `nodes` (none: where the scheduler puts them), with the
    /// `extra` annotations beside the retention.
    pub async fn run_annotated(
        &self,
        name: &str,
        replicas: u32,
        nodes: &[&str],
        extra: &[(&str, &str)],
    ) -> BTreeMap<String, RunningPod> {
        let mut annotations = retain(Some("1h"));
        annotations.extend_from_slice(extra);
        self.apply(&statefulset(name, replicas, true, nodes, &annotations));
        let names: Vec<String> = (0..replicas).map(|i| format!("{name}-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let pods = self.wait_running(&format!("app={name}"), &names).await;
        for p in pods.values() {
            self.wait_bound(p).await;
        }
        pods
    }

    /// Waits until exactly `names` run (with addresses) among pods matching `labels`.
    pub async fn wait_running(&self, labels: &str, names: &[&str]) -> BTreeMap<String, RunningPod> {
        or_fail(self.try_wait_running(labels, names).await)
    }

    /// Waits until exactly `names` run (with addresses) among pods matching `labels`.
    pub async fn try_wait_running(
        &self,
        labels: &str,
        names: &[&str],
    ) -> Result<BTreeMap<String, RunningPod>, ScenarioError> {
        let mut want: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        let what = format!("pods {want:?} Running with addresses");
        Ok(crate::wait::wait_for(&what, DEADLINE, || async {
            let running = self.try_running(labels).await.ok()?;
            let got: Vec<String> = running.keys().cloned().collect();
            (got == want).then_some(running)
        })
        .await?)
    }

    /// Waits until `pod` runs with a UID other than `old_uid`, and returns it.
    pub async fn wait_recreated(&self, pod: &str, old_uid: &str) -> RunningPod {
        or_fail(self.try_wait_recreated(pod, old_uid).await)
    }

    /// Waits until `pod` runs with a UID other than `old_uid` (none: any), and returns it.
    pub async fn try_wait_recreated(
        &self,
        pod: &str,
        old_uid: &str,
    ) -> Result<RunningPod, ScenarioError> {
        let what = format!("{pod} re-created and Running");
        Ok(crate::wait::wait_for(&what, DEADLINE, || async {
            let p = self.pods().get_opt(pod).await.ok()??;
            let r = RunningPod::of(&p)?;
            (r.uid != old_uid && p.metadata.deletion_timestamp.is_none()).then_some(r)
        })
        .await?)
    }

    /// Waits until the reservation of `pod` satisfies `check`.
    pub async fn wait_reservation(
        &self,
        pod: &str,
        what: &str,
        check: impl Fn(&IPReservation) -> bool,
    ) -> IPReservation {
        or_fail(self.try_wait_reservation(pod, what, check).await)
    }

    /// Waits until the reservation of `pod` satisfies `check`.
    pub async fn try_wait_reservation(
        &self,
        pod: &str,
        what: &str,
        check: impl Fn(&IPReservation) -> bool,
    ) -> Result<IPReservation, ScenarioError> {
        let what = format!("reservation {}/{pod}: {what}", self.ns);
        Ok(crate::wait::wait_for(&what, DEADLINE, || async {
            let r = self.reservations().get_opt(pod).await.ok()??;
            check(&r).then_some(r)
        })
        .await?)
    }

    /// Waits until the reservation of `pod` is Bound to `uid` with `ips`.
    pub async fn wait_bound(&self, pod: &RunningPod) -> IPReservation {
        or_fail(self.try_wait_bound(pod).await)
    }

    /// Waits until the reservation of `pod` is Bound to its UID with its addresses on its node.
    pub async fn try_wait_bound(&self, pod: &RunningPod) -> Result<IPReservation, ScenarioError> {
        let want: Vec<String> = pod.ips.iter().map(|i| i.to_string()).collect();
        self.try_wait_reservation(
            &pod.name,
            &format!("Bound to {} with {want:?}", pod.uid),
            |r| {
                phase(r) == Some(Phase::Bound)
                    && r.status.as_ref().and_then(|s| s.pod_uid.as_deref())
                        == Some(pod.uid.as_str())
                    && ips(r) == want
                    && r.spec.node_name == pod.node
            },
        )
        .await
    }

    /// Waits until `path` exists (`present`) or is gone.
    pub async fn wait_file(&self, path: &Path, present: bool) {
        wait_for(
            &format!(
                "{} to {}",
                path.display(),
                if present { "exist" } else { "be gone" }
            ),
            || async { (path.exists() == present).then_some(()) },
        )
        .await;
    }

    /// Events of the namespace about `kind`/`name`.
    pub async fn events(&self, kind: &str, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
            })
            .collect()
    }

    /// Records every change of the namespace's reservations from now on, in order.
    pub fn record_reservations(&self) -> History {
        let log: Arc<Mutex<Vec<(SystemTime, Change)>>> = Arc::default();
        let history = log.clone();
        let api = self.reservations();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let at = SystemTime::now();
                let mut log = log.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => {
                        log.push((at, Change::Applied(r)))
                    }
                    Ok(watcher::Event::Delete(r)) => log.push((at, Change::Deleted(r))),
                    Ok(_) => {}
                    Err(e) => log.push((at, Change::Error(e.to_string()))),
                }
            }
        });
        History(history, Some(Arc::new(task)))
    }
}

impl Drop for System {
    fn drop(&mut self) {
        eprintln!(
            "{}: took {:.1}s",
            self.ns,
            self.started.elapsed().as_secs_f64()
        );
        if !self.checks().is_empty() {
            eprintln!("{}: {}", self.ns, self.summary());
        }
        // The namespace and everything in it go; the chart's controller and agents stay.
        let mut delete = self.target.kubectl_command();
        delete.args(["delete", "namespace", &self.ns, "--wait=false"]);
        if let Err(e) = crate::command::checked(&mut delete, None) {
            eprintln!("{}", crate::error_chain(&e));
        }
    }
}

/// A reservation change seen by [`System::record_reservations`].
#[derive(Debug, Clone)]
pub enum Change {
    /// Created or updated.
    Applied(IPReservation),
    /// Deleted.
    Deleted(IPReservation),
    /// The watch failed (it retries).
    Error(String),
}

/// The recorded changes, each with the moment it arrived.
#[derive(Default, Clone)]
pub struct History(
    Arc<Mutex<Vec<(SystemTime, Change)>>>,
    Option<Arc<tokio::task::JoinHandle<()>>>,
);

impl History {
    /// The changes so far.
    pub fn changes(&self) -> Vec<(SystemTime, Change)> {
        self.0.lock().unwrap().clone()
    }

    /// The successive phases of `name` (consecutive repeats folded; `None` for a delete).
    pub fn phases(&self, name: &str) -> Vec<Option<Phase>> {
        let mut out: Vec<Option<Phase>> = Vec::new();
        for (_, c) in self.changes() {
            let p = match &c {
                Change::Applied(r) if r.name_any() == name => phase(r),
                Change::Deleted(r) if r.name_any() == name => None,
                _ => continue,
            };
            if matches!(c, Change::Applied(_)) && p.is_none() {
                continue;
            }
            if out.last() != Some(&p) {
                out.push(p);
            }
        }
        out
    }
}

impl History {
    /// The successive (phase, podUID) of `name` (consecutive repeats folded; a delete is
    /// `(None, None)`).
    pub fn bindings(&self, name: &str) -> Vec<(Option<Phase>, Option<String>)> {
        let mut out: Vec<(Option<Phase>, Option<String>)> = Vec::new();
        for (_, c) in self.changes() {
            let b = match &c {
                Change::Applied(r) if r.name_any() == name => {
                    (phase(r), r.status.as_ref().and_then(|s| s.pod_uid.clone()))
                }
                Change::Deleted(r) if r.name_any() == name => (None, None),
                _ => continue,
            };
            if matches!(c, Change::Applied(_)) && b.0.is_none() {
                continue;
            }
            if out.last() != Some(&b) {
                out.push(b);
            }
        }
        out
    }

    /// Whether any reservation was deleted.
    pub fn any_deleted(&self) -> bool {
        self.changes()
            .iter()
            .any(|(_, c)| matches!(c, Change::Deleted(_)))
    }
}

impl Drop for History {
    fn drop(&mut self) {
        if let Some(task) = &self.1
            && Arc::strong_count(task) == 1
        {
            task.abort();
        }
    }
}

/// A running pod's identity and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningPod {
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its node.
    pub node: String,
    /// `status.podIPs`, in order.
    pub ips: Vec<IpAddr>,
}

impl RunningPod {
    /// The pod if it is Running with addresses.
    pub fn of(p: &Pod) -> Option<RunningPod> {
        let status = p.status.as_ref()?;
        if status.phase.as_deref() != Some("Running") {
            return None;
        }
        let ips: Vec<IpAddr> = status
            .pod_ips
            .as_ref()?
            .iter()
            .filter_map(|i| i.ip.parse().ok())
            .collect();
        if ips.is_empty() {
            return None;
        }
        Some(RunningPod {
            name: p.name_any(),
            uid: p.metadata.uid.clone()?,
            node: p.spec.as_ref()?.node_name.clone()?,
            ips,
        })
    }
}

/// Whether a node is Ready without taints.
pub fn schedulable(node: &k8s_openapi::api::core::v1::Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| !t.is_empty());
    ready && !tainted
}

/// A reservation's phase.
pub fn phase(r: &IPReservation) -> Option<Phase> {
    r.status.as_ref().and_then(|s| s.phase)
}

/// A reservation's addresses as text.
pub fn ips(r: &IPReservation) -> Vec<String> {
    r.spec.ips.iter().map(|i| i.0.clone()).collect()
}

/// The annotations of a pod whose addresses are kept: `ipkeep.dev/retain: "true"` and, when
/// given, `ipkeep.dev/retain-for`.
pub fn retain(retain_for: Option<&'static str>) -> Vec<(&'static str, &'static str)> {
    let mut a = vec![("ipkeep.dev/retain", "true")];
    a.extend(retain_for.map(|r| ("ipkeep.dev/retain-for", r)));
    a
}

/// The workload image every real node has (`cluster up` imports it): busybox with `sh`, `ip`,
/// `httpd`, `wget` and `sleep`.
pub const WORKLOAD_IMAGE: &str = "localhost/ipkeep-e2e/workload:1";

/// A StatefulSet `name` (label `app=<name>`), its template annotated with `annotations`, its pods
/// placed on `nodes` only (none: wherever the scheduler puts them); each pod serves the workload's
/// page with busybox `httpd` on port 8080.
pub fn statefulset(
    name: &str,
    replicas: u32,
    parallel: bool,
    nodes: &[&str],
    annotations: &[(&str, &str)],
) -> String {
    let policy = if parallel { "Parallel" } else { "OrderedReady" };
    let nodes = nodes
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let annotations = annotations
        .iter()
        .map(|(k, v)| format!("\"{k}\": \"{v}\""))
        .collect::<Vec<_>>()
        .join(", ");
    // No nodes: the scheduler chooses (and the placement webhook brings a returning pod back).
    let affinity = if nodes.is_empty() {
        String::new()
    } else {
        format!(
            "      affinity:\n        nodeAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            nodeSelectorTerms:\n            - matchExpressions:\n              - {{key: kubernetes.io/hostname, operator: In, values: [{nodes}]}}\n"
        )
    };
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: {policy}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{{annotations}}}
    spec:
      terminationGracePeriodSeconds: 1
{affinity}      containers:
      - name: app
        image: {WORKLOAD_IMAGE}
        imagePullPolicy: Never
        command: [httpd, -f, -p, "8080", -h, /www]
"#
    )
}
