//! The control endpoint of `ipkeep-e2e fault-proxy`: plain HTTP on loopback, JSON rules.
//!
//! `GET /rules` lists the rules with their hits; `POST /rules` with a [`Rule`] as JSON adds one
//! and answers `{"id": N}`; `DELETE /rules` removes every rule, `DELETE /rules/N` one;
//! `POST /close-watches`, `POST /drop-connections` and `POST /outage?millis=N` do what the
//! [`FaultProxy`] methods of those names do.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::{net::TcpListener, task::JoinHandle};

use super::{FaultProxy, ProxyError, Rule, RuleId};

/// The running control endpoint; dropping it stops it.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Serves the control endpoint of `proxy` on `listen`.
    pub async fn start(
        proxy: Arc<FaultProxy>,
        listen: SocketAddr,
    ) -> Result<AdminServer, ProxyError> {
        let listen_err = |source| ProxyError::Listen {
            addr: listen,
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(listen_err)?;
        let addr = listener.local_addr().map_err(listen_err)?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let proxy = Arc::clone(&proxy);
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let proxy = Arc::clone(&proxy);
                        async move { Ok::<_, Infallible>(answer(&proxy, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Ok(AdminServer { addr, task })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn reply(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

async fn answer(proxy: &FaultProxy, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let ok = || reply(StatusCode::OK, json!({}));
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/rules") => reply(StatusCode::OK, json!(proxy.rules())),
        (Method::POST, "/rules") => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
            };
            match serde_json::from_slice::<Rule>(&body) {
                Ok(rule) => reply(StatusCode::CREATED, json!({"id": proxy.add(rule)})),
                Err(e) => reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": format!("not a rule: {e}")}),
                ),
            }
        }
        (Method::DELETE, "/rules") => {
            proxy.clear();
            ok()
        }
        (Method::DELETE, p) if p.starts_with("/rules/") => {
            match p["/rules/".len()..].parse::<u64>() {
                Ok(id) => {
                    proxy.remove(RuleId(id));
                    ok()
                }
                Err(_) => reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "a rule id is a number"}),
                ),
            }
        }
        (Method::POST, "/close-watches") => {
            proxy.close_watches();
            ok()
        }
        (Method::POST, "/drop-connections") => {
            proxy.drop_connections();
            ok()
        }
        (Method::POST, "/outage") => {
            let millis = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("millis="))
                .and_then(|v| v.parse::<u64>().ok());
            match millis {
                Some(ms) => {
                    proxy.outage(Duration::from_millis(ms)).await;
                    ok()
                }
                None => reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "say how long: /outage?millis=N"}),
                ),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "no such endpoint: GET|POST|DELETE /rules, DELETE /rules/N, POST /close-watches, /drop-connections, /outage?millis=N"}),
        ),
    }
}
