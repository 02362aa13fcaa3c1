//! The agents' fan-out of `make bench-scale` (`bench_agent --fan-out N`): many node agents in
//! this process, each the agent's own code ([`ipkeep_operator::agent::run`] with `watch_data_dir: false`:
//! its reflector, its write loop, its files) with its own client (its own ServiceAccount token and
//! connection) and so its own watch of its node's reservations on the API server. One process
//! rather than a thousand: the machine is shared, and a thousand runtimes would measure this
//! machine's scheduler rather than the API server.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use ipkeep_operator::{
    agent::{AgentConfig, AgentError, AgentMetrics, run},
    runtime::probes::Readiness,
};
use kube::Client;
use tokio::{sync::oneshot, task::JoinHandle};

/// One agent running in this process.
struct InProcess {
    /// Its node.
    node: String,
    /// Set by the agent after its first full sync.
    ready: Arc<Readiness>,
    /// Dropped or sent: the agent stops.
    stop: oneshot::Sender<()>,
    /// The agent itself.
    task: JoinHandle<Result<(), AgentError>>,
}

/// Agents of many nodes, all in this process.
#[derive(Default)]
pub struct Fleet {
    agents: Vec<InProcess>,
}

impl Fleet {
    /// How many agents run.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Starts one agent per node (`client_for` gives each its own client), each keeping
    /// `network` under its own directory in `data_root`; returns once every agent has made its
    /// first full sync, or panics naming the nodes that did not within `deadline`.
    pub async fn grow<F, Fut>(
        &mut self,
        nodes: &[String],
        network: &str,
        data_root: &Path,
        mut client_for: F,
        deadline: Duration,
    ) where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Client>,
    {
        let first = self.agents.len();
        for node in nodes {
            let client = client_for().await;
            let ready = Arc::new(Readiness::default());
            let (stop, stopped) = oneshot::channel::<()>();
            let data_dir = data_root.join(node);
            std::fs::create_dir_all(&data_dir)
                .unwrap_or_else(|e| panic!("failed to create {}: {e}", data_dir.display()));
            let config = AgentConfig {
                node_name: node.clone(),
                data_dir,
                networks: vec![network.to_owned()],
                default_retain_for: Duration::from_secs(86_400),
                resync_interval: Duration::from_secs(600),
                in_charge: None,
                watch_data_dir: false,
                report_capacity: false,
            };
            let metrics = AgentMetrics::register(&prometheus::Registry::new())
                .expect("the agent's metrics register in a new registry");
            let task = tokio::spawn(run(client, config, metrics, ready.clone(), async move {
                let _ = stopped.await;
            }));
            self.agents.push(InProcess {
                node: node.clone(),
                ready,
                stop,
                task,
            });
        }
        let started = Instant::now();
        loop {
            self.check();
            let waiting: Vec<&str> = self.agents[first..]
                .iter()
                .filter(|a| !a.ready.is_ready())
                .map(|a| a.node.as_str())
                .collect();
            if waiting.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "{} agents never made their first full sync within {deadline:?} (e.g. {:?})",
                waiting.len(),
                &waiting[..waiting.len().min(5)]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Panics if an agent has stopped (with its error).
    pub fn check(&self) {
        for agent in &self.agents {
            assert!(
                !agent.task.is_finished(),
                "the agent of {} stopped on its own",
                agent.node
            );
        }
    }

    /// Stops every agent and waits for each; panics if one ended with an error.
    pub async fn stop(self) {
        for agent in self.agents {
            let _ = agent.stop.send(());
            match agent.task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("the agent of {} failed: {e}", agent.node),
                Err(e) => panic!("the agent of {} panicked: {e}", agent.node),
            }
        }
    }
}

/// The slope and intercept of the least-squares line through `points` (x, y); `None` with fewer
/// than two distinct x.
pub fn line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| {
        let slope = sxy / sxx;
        (slope, my - slope * mx)
    })
}

#[cfg(test)]
mod tests {
    use super::line;

    /// Points, and the (slope, intercept) wanted through them.
    type Case = (&'static [(f64, f64)], Option<(f64, f64)>);

    #[test]
    fn line_through_points() {
        let cases: [Case; 3] = [
            (&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)], Some((2.0, 1.0))),
            (
                &[(0.0, 0.0), (2.0, 2.0), (4.0, 0.0), (6.0, 2.0)],
                Some((0.2, 0.4)),
            ),
            (&[(3.0, 1.0), (3.0, 2.0)], None),
        ];
        for (points, want) in cases {
            let got = line(points);
            match (got, want) {
                (Some((s, i)), Some((ws, wi))) => {
                    assert!(
                        (s - ws).abs() < 1e-9 && (i - wi).abs() < 1e-9,
                        "{points:?}: {got:?}"
                    );
                }
                (None, None) => {}
                _ => panic!("{points:?}: {got:?}, want {want:?}"),
            }
        }
    }
}
