//! `make bench-api-cost`: what one pod's lifecycle costs the real kube-apiserver, read back from
//! its audit log, for the controller and the agent separately (each runs as its own chart
//! ServiceAccount, so the audit log's `user.username` tells them apart).
//!
//! The story, for `--pods` annotated pods at once (`ipkeep.dev/retain-for` short, so it ends
//! within a minute): created and running → Bound; deleted → Released; re-created under the same
//! names → Bound again; deleted → Released; the retention passes → the reservation expires. The
//! controller and one agent (for the pods' node) start before it and are ready (their caches
//! filled, their start-up LISTs done) before the audit log is marked.
//!
//! A pod lifecycle is one pod, from its creation until its name's reservation expires or until a
//! pod of the same name takes the reservation over: a re-create starts a new lifecycle. The story
//! holds two, "created → deleted" (ended by the re-create) and "re-created → deleted → expired",
//! and the bench also prints the lifecycle of a pod never re-created, "created → deleted →
//! expired" (its steps 1, 2 and 5).
//!
//! Goals, each printed with whether it holds: at most 4 writes per pod lifecycle, and no LIST after
//! start-up (a LIST then would be a relist). Not a test: it prints figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ipkeep_e2e::testkit::plane::{AGENT_ACCOUNT, CONTROLLER_ACCOUNT};

use ipkeep_e2e::testkit::bench;

use std::{collections::BTreeMap, time::Duration};

use bench::{Audited, PhaseWatch, Plane, is_write};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// The most writes one pod's lifecycle may cost (issue 17).
const WRITE_GOAL: f64 = 4.0;
/// The node the story's pods run on.
const NODE: &str = "cost-node";
const PATIENCE: Duration = Duration::from_secs(600);

#[derive(Debug, Parser)]
#[command(about = "what one pod's lifecycle costs the real kube-apiserver, from its audit log")]
struct Args {
    /// Pods going through the story at once (the figures are per pod).
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Their retention after they are gone (`ipkeep.dev/retain-for`).
    #[arg(long, default_value = "20s")]
    retain_for: String,
    /// Run the controller with `--normal-events=true`.
    #[arg(long)]
    normal_events: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let plane = Plane::start().await;
    let log = plane.audit_log();
    plane.add_nodes(&[NODE.to_owned()]).await;
    let admin = plane.admin();
    let ns = plane.namespace("bench-cost").await;

    let before_start = bench::audit_mark(&log);
    let controller_probe = bench::free_addr();
    let controller = plane
        .operator(
            "controller-cost",
            CONTROLLER_ACCOUNT,
            &[
                "controller".into(),
                "--namespace".into(),
                ns.clone(),
                "--metrics-addr".into(),
                controller_probe.to_string(),
                "--leader-elect=false".into(),
                format!("--normal-events={}", args.normal_events),
                "--log-level".into(),
                "warn".into(),
            ],
        )
        .await;
    let agent_probe = bench::free_addr();
    let data_dir = plane.scratch("agent-cost");
    let agent = plane
        .operator(
            "agent-cost",
            AGENT_ACCOUNT,
            &[
                "agent".into(),
                "--node-name".into(),
                NODE.into(),
                "--network".into(),
                "cbr0".into(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--metrics-addr".into(),
                agent_probe.to_string(),
                "--log-level".into(),
                "warn".into(),
            ],
        )
        .await;
    controller.ready(controller_probe).await;
    agent.ready(agent_probe).await;
    let controller_user = plane.account_user(CONTROLLER_ACCOUNT).await;
    let agent_user = plane.account_user(AGENT_ACCOUNT).await;
    let start = bench::audit_settled(&log, before_start, &controller_user).await;

    let n = args.pods;
    let mut phases = PhaseWatch::start(admin.clone(), &ns, None);
    let mut marks = vec![start];
    for step in STEPS {
        match step {
            Step::Create | Step::Recreate => create_pods(&admin, &ns, n, &args.retain_for).await,
            Step::Delete | Step::DeleteAgain => delete_pods(&admin, &ns, n).await,
            Step::Expire => {}
        }
        phases
            .until(step.awaits(), PATIENCE, |c| step.done(c, n))
            .await;
        let from = *marks.last().unwrap();
        marks.push(bench::audit_settled(&log, from, &controller_user).await);
    }
    controller.check();
    agent.check();
    controller.stop();
    agent.stop();

    println!(
        "api cost bench on {}: {n} pods, each created → deleted → re-created → deleted → expired (retain-for {}); controller Normal Events {}",
        plane.describe(),
        args.retain_for,
        if args.normal_events {
            "on"
        } else {
            "off (the default)"
        }
    );
    let steps: Vec<BTreeMap<Audited, usize>> = marks
        .windows(2)
        .map(|w| bench::audited_between(&log, w[0], Some(w[1])))
        .collect();
    println!("  controller ({controller_user}), per pod:");
    println!(
        "    {:<34} {:>14} {:>7} {:>7} {:>7}",
        "step", "reservations", "Events", "reads", "LISTs"
    );
    let mut lifecycle = Vec::new();
    for (step, counts) in STEPS.iter().zip(&steps) {
        let c = Cost::of(counts, &controller_user, n);
        println!(
            "    {:<34} {:>14.2} {:>7.2} {:>7.2} {:>7.2}",
            step.awaits(),
            c.reservation_writes,
            c.event_writes,
            c.reads,
            c.lists
        );
        lifecycle.push((*step, c));
    }
    let total = |steps: &[Step]| -> (f64, f64) {
        lifecycle
            .iter()
            .filter(|(s, _)| steps.contains(s))
            .fold((0.0, 0.0), |(r, e), (_, c)| {
                (r + c.reservation_writes, e + c.event_writes)
            })
    };
    let verdict = |ok: bool| if ok { "holds" } else { "does NOT hold" };
    println!(
        "    writes per pod lifecycle (a pod from its creation until its reservation expires or a pod of the same name takes it over; a re-create starts a new lifecycle), goal ≤ {WRITE_GOAL}:"
    );
    for (name, steps) in LIFECYCLES {
        let (r, e) = total(steps);
        println!(
            "      {name:<50} {:>5.2} ({r:.2} to reservations, {e:.2} Events): {}",
            r + e,
            verdict(r + e <= WRITE_GOAL)
        );
    }
    let (r, e) = total(&STEPS);
    println!(
        "      {:<50} {:>5.2} ({r:.2} to reservations, {e:.2} Events) for {} lifecycles: {:.2} per lifecycle",
        "the whole story",
        r + e,
        STORY_LIFECYCLES,
        (r + e) / STORY_LIFECYCLES as f64
    );
    let start_up = bench::audited_between(&log, before_start, Some(start));
    for (who, user) in [("controller", &controller_user), ("agent", &agent_user)] {
        let requests: Vec<String> = start_up
            .iter()
            .filter(|(k, _)| &k.user == user)
            .map(|(k, v)| format!("{v} {} {}", k.verb, k.resource))
            .collect();
        println!("  {who} start-up: {}", requests.join(", "));
    }
    let everything = bench::audited_between(&log, start, marks.last().copied());
    for (who, user) in [("controller", &controller_user), ("agent", &agent_user)] {
        report(who, user, &everything, n * STORY_LIFECYCLES);
    }
    plane.finish();
}

/// The story's steps, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    Delete,
    Recreate,
    DeleteAgain,
    Expire,
}

const STEPS: [Step; 5] = [
    Step::Create,
    Step::Delete,
    Step::Recreate,
    Step::DeleteAgain,
    Step::Expire,
];

/// The pod lifecycles the story's steps make up (see the module's note).
const LIFECYCLES: [(&str, &[Step]); 3] = [
    (
        "created → deleted → expired (never re-created)",
        &[Step::Create, Step::Delete, Step::Expire],
    ),
    (
        "created → deleted (then re-created)",
        &[Step::Create, Step::Delete],
    ),
    (
        "re-created → deleted → expired",
        &[Step::Recreate, Step::DeleteAgain, Step::Expire],
    ),
];

/// Pods the story's whole run holds per name: the first and the re-created one.
const STORY_LIFECYCLES: usize = 2;

impl Step {
    /// What the step waits for.
    fn awaits(self) -> &'static str {
        match self {
            Step::Create => "created → Bound",
            Step::Delete => "deleted → Released",
            Step::Recreate => "re-created → Bound again",
            Step::DeleteAgain => "deleted again → Released",
            Step::Expire => "retention over → expired (deleted)",
        }
    }

    fn done(self, c: &bench::PhaseCount, n: usize) -> bool {
        match self {
            Step::Create | Step::Recreate => c.bound >= n,
            Step::Delete | Step::DeleteAgain => c.released >= n,
            Step::Expire => c.deleted >= n,
        }
    }
}

/// One user's requests in one step, per pod.
struct Cost {
    reservation_writes: f64,
    event_writes: f64,
    reads: f64,
    lists: f64,
}

impl Cost {
    fn of(counts: &BTreeMap<Audited, usize>, user: &str, pods: usize) -> Cost {
        let sum = |keep: &dyn Fn(&Audited) -> bool| -> f64 {
            counts
                .iter()
                .filter(|(k, _)| k.user == user && keep(k))
                .map(|(_, v)| *v)
                .sum::<usize>() as f64
                / pods as f64
        };
        Cost {
            reservation_writes: sum(&|k| {
                is_write(&k.verb) && k.resource.starts_with("ipreservations")
            }),
            event_writes: sum(&|k| is_write(&k.verb) && k.resource == "events"),
            reads: sum(&|k| k.verb == "get"),
            lists: sum(&|k| k.verb == "list"),
        }
    }
}

async fn create_pods(admin: &Client, ns: &str, n: usize, retain_for: &str) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    bench::run_all(0..n, 16, |i| {
        let pods = pods.clone();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{i}"), "annotations": {
                "ipkeep.dev/retain": "true", "ipkeep.dev/retain-for": retain_for,
            }},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "app"}]},
        }))
        .unwrap();
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("pod create");
            let ip = bench::test_ip(i);
            let status =
                json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
            pods.patch_status(
                &format!("pod-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .expect("pod status");
        }
    })
    .await;
}

async fn delete_pods(admin: &Client, ns: &str, n: usize) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    bench::run_all(0..n, 16, |i| {
        let pods = pods.clone();
        async move {
            pods.delete(
                &format!("pod-{i}"),
                &DeleteParams::default().grace_period(0),
            )
            .await
            .expect("pod delete");
        }
    })
    .await;
}

/// Prints `user`'s requests per pod lifecycle by verb and resource, and whether the goals hold.
fn report(who: &str, user: &str, counts: &BTreeMap<Audited, usize>, lifecycles: usize) {
    let mine: Vec<(&Audited, usize)> = counts
        .iter()
        .filter(|(k, _)| k.user == user)
        .map(|(k, v)| (k, *v))
        .collect();
    let per_pod = |v: usize| v as f64 / lifecycles as f64;
    println!(
        "  {who}, every request of the whole story per pod lifecycle ({STORY_LIFECYCLES} per name; verb, resource):"
    );
    if mine.is_empty() {
        println!("    none");
    }
    for (k, v) in &mine {
        println!(
            "    {:<7} {:<28} {:>6.2}  ({v} in all)",
            k.verb,
            k.resource,
            per_pod(*v)
        );
    }
    let writes: usize = mine
        .iter()
        .filter(|(k, _)| is_write(&k.verb))
        .map(|(_, v)| v)
        .sum();
    let lists: usize = mine
        .iter()
        .filter(|(k, _)| k.verb == "list")
        .map(|(_, v)| v)
        .sum();
    let verdict = |ok: bool| if ok { "holds" } else { "does NOT hold" };
    println!(
        "    writes per pod lifecycle, the whole story: {:.2} (goal ≤ {WRITE_GOAL}: {})",
        per_pod(writes),
        verdict(per_pod(writes) <= WRITE_GOAL)
    );
    println!(
        "    LISTs after start-up: {lists} (goal 0 except on relist: {})",
        verdict(lists == 0)
    );
}
