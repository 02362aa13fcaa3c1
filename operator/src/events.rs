//! Kubernetes Events (`events.k8s.io/v1`), published the same way by the controller and the
//! agent.
//!
//! Posted directly rather than through kube's `Recorder`: the Recorder keeps every Event it sent
//! for six minutes (to turn repeats into a series) and scans that whole cache on every publish,
//! so 10 000 newly reserved pods cost tens of MiB and quadratic time. Neither component repeats
//! itself: the controller publishes on transitions only, the agent once per refused object
//! version, so a series would never form anyway.

use jiff::Timestamp;
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, Client, api::PostParams};

/// The API server's limit on an Event's `note`.
const NOTE_MAX: usize = 1024;
/// The API server's limit on `reportingInstance`.
const INSTANCE_MAX: usize = 128;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something went as it should.
    Normal,
    /// Something a person should look at.
    Warning,
}

impl EventType {
    /// The API's spelling (`Normal`, `Warning`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event to publish.
#[derive(Debug, Clone)]
pub struct Notice<'a> {
    /// The object it is about.
    pub regarding: ObjectReference,
    /// Normal or Warning.
    pub type_: EventType,
    /// The machine-readable reason (`Reserved`, `InvalidReservation`, …).
    pub reason: &'a str,
    /// What the component was doing (`Reconcile`, `WriteReservationFile`).
    pub action: &'a str,
    /// What happened, for people (cut to the API's 1 KiB).
    pub note: &'a str,
}

/// Publishes Events as one component (`reportingController`) and replica or node
/// (`reportingInstance`).
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    controller: &'static str,
    instance: String,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher reporting as `controller` (e.g. `ipkeep-agent`) from `instance`.
    pub fn new(client: Client, controller: &'static str, instance: &str) -> Publisher {
        Publisher {
            client,
            controller,
            instance: instance.chars().take(INSTANCE_MAX).collect(),
        }
    }

    /// Creates the Event in the namespace of the object it is about; a failure is logged, never
    /// returned: an Event is worth a try, not a retry.
    pub async fn publish(&self, notice: Notice<'_>) {
        let namespace = notice
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = notice.regarding.name.clone().unwrap_or_default();
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(notice.action.into()),
            reason: Some(notice.reason.into()),
            note: Some(notice.note.chars().take(NOTE_MAX).collect()),
            type_: Some(notice.type_.as_str().into()),
            regarding: Some(notice.regarding),
            reporting_controller: Some(self.controller.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(error = %e, reason = notice.reason, object = %name, "failed to publish an Event");
        }
    }
}
