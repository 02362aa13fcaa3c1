//! Watch streams: newline-delimited JSON events, bookmarks, timeouts, resume from a resourceVersion
//! (410 Gone in-stream when it is too old) and streaming lists (`sendInitialEvents`).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{
    api::{Ctx, Reply, Request, Selection, Target, render},
    format::{self, Representation},
    status::ApiError,
    store::{Change, ChangeKind, WatchStart},
};

/// Watch timeout when the client sends none (kube-apiserver picks 30–60 minutes).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// One event to send.
#[derive(Debug)]
struct Event {
    kind: &'static str,
    object: Value,
}

/// Everything the streaming task needs to turn changes into events for one client.
#[derive(Debug)]
struct Stream {
    target: Target,
    selection: Selection,
    rep: Representation,
    bookmarks: bool,
}

impl Stream {
    fn render(&self, obj: &Value) -> Value {
        render(&self.target, self.rep, &[self.target.present(obj)], None)
    }

    /// The event a change becomes for this watcher (None if it does not concern it). Objects that
    /// enter or leave the selection become ADDED / DELETED, as in kube-apiserver.
    fn event(&self, change: &Change) -> Option<Event> {
        let now = self.selection.matches(&change.object);
        let before = change
            .old
            .as_ref()
            .is_some_and(|o| self.selection.matches(o));
        let kind = match change.kind {
            ChangeKind::Added if now => "ADDED",
            ChangeKind::Modified if now && before => "MODIFIED",
            ChangeKind::Modified if now => "ADDED",
            ChangeKind::Modified if before => "DELETED",
            ChangeKind::Deleted if before || now => "DELETED",
            _ => return None,
        };
        Some(Event {
            kind,
            object: self.render(&change.object),
        })
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Event {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end && let Some(m) = meta.as_object_mut() {
            m.insert(
                "annotations".into(),
                json!({"k8s.io/initial-events-end": "true"}),
            );
        }
        let (api_version, kind) = match self.rep {
            Representation::Object => (
                self.target.rt.api_version(&self.target.version),
                self.target.rt.kind.clone(),
            ),
            Representation::PartialMetadata => (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadata".to_string(),
            ),
            Representation::Table(_) => ("meta.k8s.io/v1".to_string(), "Table".to_string()),
        };
        Event {
            kind: "BOOKMARK",
            object: json!({"apiVersion": api_version, "kind": kind, "metadata": meta}),
        }
    }
}

/// Sleep until `deadline`, or forever when there is none.
async fn sleep_until_deadline(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn line(event: &Event) -> Bytes {
    let mut text = json!({"type": event.kind, "object": event.object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

fn error_line(err: &ApiError) -> Bytes {
    line(&Event {
        kind: "ERROR",
        object: err.to_status(),
    })
}

/// Start a watch (a collection watch, or a single object when the URL names one).
pub fn watch(ctx: &Ctx, req: &Request, target: &Target) -> Result<Reply, ApiError> {
    super::api::check_list_options(req, true)?;
    let mut selection = Selection::from_request(req, target)?;
    if let Some(name) = &target.name {
        selection = selection.with_name(name)?;
    }
    let rep = format::negotiate(&req.accept, req.param("includeObject"));
    let bookmarks = req.flag("allowWatchBookmarks");
    let send_initial = req.flag("sendInitialEvents");
    // kube-apiserver accepts sendInitialEvents without allowWatchBookmarks (the initial events
    // then end without the bookmark that says so).
    let rv = match req.param("resourceVersion").filter(|v| !v.is_empty()) {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v}")))?,
        ),
        None => None,
    };
    // As in kube-apiserver, 0 (or no value) means the server's default and a negative value
    // ends the watch at once.
    let timeout = match req.param("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => match t
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?
        {
            0 => DEFAULT_TIMEOUT,
            secs => Duration::from_secs(u64::try_from(secs).unwrap_or(0)),
        },
        None => DEFAULT_TIMEOUT,
    };
    let stream = Stream {
        target: target.clone(),
        selection,
        rep,
        bookmarks,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let mut initial: Vec<Bytes> = Vec::new();
    let live = {
        let mut store = ctx.store();
        // No version, "0", or a streaming list: start with the current state as ADDED events.
        let synthetic = send_initial || matches!(rv, None | Some(0));
        let start = if synthetic { None } else { rv };
        match store.watch(&target.rt.key(), start) {
            WatchStart::Expired { requested, oldest } => {
                let err =
                    ApiError::gone(format!("too old resource version: {requested} ({oldest})"));
                initial.push(error_line(&err));
                None
            }
            WatchStart::Resumed(replay, live) => {
                if synthetic {
                    for obj in store.list(&target.rt.key(), target.namespace.as_deref()) {
                        if stream.selection.matches(obj) {
                            initial.push(line(&Event {
                                kind: "ADDED",
                                object: stream.render(obj),
                            }));
                        }
                    }
                    if send_initial && bookmarks {
                        initial.push(line(&stream.bookmark(store.rv(), true)));
                    }
                }
                initial.extend(
                    replay
                        .iter()
                        .filter_map(|c| stream.event(c))
                        .map(|e| line(&e)),
                );
                Some(live)
            }
        }
    };
    let store = ctx.store.clone();
    let interval = ctx.bookmark_interval;
    // A zero interval turns periodic bookmarks off (tokio's interval refuses a zero period).
    let periodic = stream.bookmarks && !interval.is_zero();
    let period = interval.max(Duration::from_millis(1));
    tokio::spawn(async move {
        for chunk in initial {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        let Some(mut live) = live else { return };
        // A timeout too large to add to the clock never ends the watch (no overflow panic).
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = live.recv() => {
                    let Some(change) = change else { return };
                    if let Some(event) = stream.event(&change)
                        && tx.send(line(&event)).await.is_err()
                    {
                        return;
                    }
                }
                _ = ticker.tick(), if periodic => {
                    // Drain under the lock so the bookmark's version covers every change sent before it.
                    let (pending, rv) = {
                        let s = store.lock().unwrap_or_else(|e| e.into_inner());
                        let mut pending: Vec<Arc<Change>> = Vec::new();
                        while let Ok(c) = live.try_recv() {
                            pending.push(c);
                        }
                        (pending, s.rv())
                    };
                    for change in pending {
                        if let Some(event) = stream.event(&change)
                            && tx.send(line(&event)).await.is_err()
                        {
                            return;
                        }
                    }
                    if tx.send(line(&stream.bookmark(rv, false))).await.is_err() {
                        return;
                    }
                }
                _ = sleep_until_deadline(deadline) => return,
                _ = tx.closed() => return,
            }
        }
    });
    Ok(Reply::Stream(rx))
}
