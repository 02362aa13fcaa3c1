//! What the fault proxy does wrong, and to which requests: plain data matched against each
//! request's verb, resource, namespace and name, the way kube-apiserver classifies a request.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A request verb, as kube-apiserver's authorizer names it (`deletecollection` is `delete`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true` (or under the legacy `/watch/` prefix).
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object or a collection.
    Delete,
}

/// What a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// Its verb.
    pub verb: Verb,
    /// The resource's plural name (`pods`); `None` for a path that names none (`/version`).
    pub resource: Option<String>,
    /// The subresource (`status`), if any.
    pub subresource: Option<String>,
    /// The namespace, for a namespaced request.
    pub namespace: Option<String>,
    /// The object's name, for a request about one object.
    pub name: Option<String>,
    /// The address the request came from (set by the proxy; `None` from [`RequestInfo::parse`]).
    pub client: Option<std::net::IpAddr>,
}

impl RequestInfo {
    /// Classifies a request by its method, path and query, as kube-apiserver does:
    /// `/api/v1/namespaces/{ns}/pods/{name}/status`, `/apis/{group}/{version}/...`.
    pub fn parse(method: &http::Method, path: &str, query: Option<&str>) -> RequestInfo {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut rest: &[&str] = match segments.first() {
            Some(&"api") if segments.len() >= 2 => &segments[2..],
            Some(&"apis") if segments.len() >= 3 => &segments[3..],
            _ => &[],
        };
        let mut watch = query
            .unwrap_or_default()
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        if rest.first() == Some(&"watch") {
            watch = true;
            rest = &rest[1..];
        }
        let mut namespace = None;
        // `namespaces/{ns}/{resource}...`, but `namespaces/{name}` and its `status` and
        // `finalize` subresources are about the namespace itself.
        if rest.first() == Some(&"namespaces")
            && rest.len() >= 3
            && !matches!(rest[2], "status" | "finalize")
        {
            namespace = Some(rest[1].to_owned());
            rest = &rest[2..];
        }
        let part = |i: usize| rest.get(i).map(|s| (*s).to_owned());
        let (resource, name, subresource) = (part(0), part(1), part(2));
        let verb = match *method {
            http::Method::POST => Verb::Create,
            http::Method::PUT => Verb::Update,
            http::Method::PATCH => Verb::Patch,
            http::Method::DELETE => Verb::Delete,
            _ if name.is_some() => Verb::Get,
            _ if watch => Verb::Watch,
            _ if resource.is_some() => Verb::List,
            _ => Verb::Get,
        };
        RequestInfo {
            verb,
            resource,
            subresource,
            namespace,
            name,
            client: None,
        }
    }
}

/// Which requests a rule applies to; a field left `None` matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// Only this verb.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<Verb>,
    /// Only this resource (`ipreservations`, any subresource) or exactly this subresource
    /// (`ipreservations/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Only requests in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Only requests about the object of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only requests from this address (a host-network pod's: its node's), as a partition of
    /// one client from the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<std::net::IpAddr>,
}

impl Match {
    /// Whether `request` is one of these.
    pub fn matches(&self, request: &RequestInfo) -> bool {
        let resource_ok = match self.resource.as_deref() {
            None => true,
            Some(want) => match want.split_once('/') {
                Some((resource, sub)) => {
                    request.resource.as_deref() == Some(resource)
                        && request.subresource.as_deref() == Some(sub)
                }
                None => request.resource.as_deref() == Some(want),
            },
        };
        resource_ok
            && self.verb.is_none_or(|v| v == request.verb)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| request.namespace.as_ref() == Some(ns))
            && self
                .name
                .as_ref()
                .is_none_or(|n| request.name.as_ref() == Some(n))
            && self
                .client
                .is_none_or(|c| request.client.map(|r| r.to_canonical()) == Some(c.to_canonical()))
    }
}

/// What the proxy does to a matching request instead of forwarding it unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum Fault {
    /// Answer with this HTTP status and a `Status` body, without forwarding; with
    /// `retryAfterSeconds`, a `Retry-After` header too (as kube-apiserver sends with 429).
    #[serde(rename_all = "camelCase")]
    Status {
        /// The HTTP status (500, 409, 429, 503, ...).
        code: u16,
        /// The `Retry-After` header's seconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_seconds: Option<u32>,
    },
    /// A watch answered the way kube-apiserver answers one from a compacted resourceVersion:
    /// 200 and a single `ERROR` event whose Status is `410 Expired`; any other request gets an
    /// HTTP 410 with that Status.
    Expired,
    /// Forward, and end a watch's response cleanly after this many events (the client sees the
    /// stream end and watches again).
    CutWatch {
        /// Events passed through before the end.
        events: usize,
    },
    /// Forward after this delay.
    #[serde(rename_all = "camelCase")]
    Delay {
        /// The delay in milliseconds.
        millis: u64,
    },
    /// Never answer: the request hangs until the rule is removed (then its connection is
    /// dropped) or the client gives up.
    Hang,
}

impl Fault {
    /// An HTTP error with a `Status` body (`Retry-After: 1` for 429 and 503).
    pub fn status(code: u16) -> Fault {
        Fault::Status {
            code,
            retry_after_seconds: matches!(code, 429 | 503).then_some(1),
        }
    }

    /// A delay before forwarding.
    pub fn delay(d: Duration) -> Fault {
        Fault::Delay {
            millis: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// One rule: a fault for the requests it matches, for the first `times` of them (or every one
/// while the rule is in place).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Which requests.
    #[serde(default, rename = "match")]
    pub when: Match,
    /// What happens to them.
    pub fault: Fault,
    /// How many matching requests it applies to; `None`: all of them until it is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<usize>,
}

impl Rule {
    /// `fault` for every request, until narrowed with the other methods.
    pub fn new(fault: Fault) -> Rule {
        Rule {
            when: Match::default(),
            fault,
            times: None,
        }
    }

    /// Only requests with this verb.
    pub fn verb(mut self, verb: Verb) -> Rule {
        self.when.verb = Some(verb);
        self
    }

    /// Only requests for this resource (see [`Match::resource`]).
    pub fn resource(mut self, resource: &str) -> Rule {
        self.when.resource = Some(resource.to_owned());
        self
    }

    /// Only requests in this namespace.
    pub fn namespace(mut self, namespace: &str) -> Rule {
        self.when.namespace = Some(namespace.to_owned());
        self
    }

    /// Only requests about the object of this name.
    pub fn name(mut self, name: &str) -> Rule {
        self.when.name = Some(name.to_owned());
        self
    }

    /// Only requests from `client` (see [`Match::client`]).
    pub fn client(mut self, client: std::net::IpAddr) -> Rule {
        self.when.client = Some(client);
        self
    }

    /// Only the first `n` matching requests.
    pub fn times(mut self, n: usize) -> Rule {
        self.times = Some(n);
        self
    }
}

/// A rule's identity in a [`RuleSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RuleId(pub u64);

/// A rule in place and how many requests it has hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleEntry {
    /// Its identity.
    pub id: RuleId,
    /// The rule.
    pub rule: Rule,
    /// The requests it applied to so far.
    pub hits: usize,
}

impl RuleEntry {
    fn active(&self) -> bool {
        self.rule.times.is_none_or(|t| self.hits < t)
    }
}

/// The rules in place, in the order they were added: the first active rule that matches a
/// request applies to it. A rule whose `times` are used up stays (its hits readable) until
/// removed, but applies to nothing more.
#[derive(Debug, Default)]
pub struct RuleSet {
    next: u64,
    entries: Vec<RuleEntry>,
}

impl RuleSet {
    /// Puts `rule` in place after the others.
    pub fn add(&mut self, rule: Rule) -> RuleId {
        self.next += 1;
        let id = RuleId(self.next);
        self.entries.push(RuleEntry { id, rule, hits: 0 });
        id
    }

    /// Removes one rule; false if it was not there.
    pub fn remove(&mut self, id: RuleId) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.id != id);
        self.entries.len() != before
    }

    /// Removes every rule.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Whether rule `id` is still in place.
    pub fn contains(&self, id: RuleId) -> bool {
        self.entries.iter().any(|e| e.id == id)
    }

    /// How many requests rule `id` applied to (0 once removed).
    pub fn hits(&self, id: RuleId) -> usize {
        self.entries
            .iter()
            .find(|e| e.id == id)
            .map_or(0, |e| e.hits)
    }

    /// The rules in place.
    pub fn entries(&self) -> &[RuleEntry] {
        &self.entries
    }

    /// The fault for `request`, counting it as a hit of the rule that gives it.
    pub fn take(&mut self, request: &RequestInfo) -> Option<(RuleId, Fault)> {
        let entry = self
            .entries
            .iter_mut()
            .find(|e| e.active() && e.rule.when.matches(request))?;
        entry.hits += 1;
        Some((entry.id, entry.rule.fault.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info(
        verb: Verb,
        resource: Option<&str>,
        sub: Option<&str>,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> RequestInfo {
        let s = |v: Option<&str>| v.map(str::to_owned);
        RequestInfo {
            verb,
            resource: s(resource),
            subresource: s(sub),
            namespace: s(ns),
            name: s(name),
            client: None,
        }
    }

    #[test]
    fn requests_are_classified_as_kube_apiserver_does() {
        let cases = [
            (
                Method::GET,
                "/api/v1/pods",
                None,
                info(Verb::List, Some("pods"), None, None, None),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("watch=true&resourceVersion=5"),
                info(Verb::Watch, Some("pods"), None, Some("a"), None),
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/a/pods",
                None,
                info(Verb::Watch, Some("pods"), None, Some("a"), None),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p",
                None,
                info(Verb::Get, Some("pods"), None, Some("a"), Some("p")),
            ),
            (
                Method::PATCH,
                "/apis/ipkeep.dev/v1alpha1/namespaces/a/ipreservations/r/status",
                Some("fieldManager=x"),
                info(
                    Verb::Patch,
                    Some("ipreservations"),
                    Some("status"),
                    Some("a"),
                    Some("r"),
                ),
            ),
            (
                Method::DELETE,
                "/apis/ipkeep.dev/v1alpha1/namespaces/a/ipreservations",
                None,
                info(Verb::Delete, Some("ipreservations"), None, Some("a"), None),
            ),
            (
                Method::POST,
                "/api/v1/namespaces",
                None,
                info(Verb::Create, Some("namespaces"), None, None, None),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a",
                None,
                info(Verb::Get, Some("namespaces"), None, None, Some("a")),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/finalize",
                None,
                info(
                    Verb::Update,
                    Some("namespaces"),
                    Some("finalize"),
                    None,
                    Some("a"),
                ),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                None,
                info(Verb::Update, Some("leases"), None, Some("a"), Some("l")),
            ),
            (
                Method::GET,
                "/version",
                None,
                info(Verb::Get, None, None, None, None),
            ),
            (
                Method::GET,
                "/apis/ipkeep.dev/v1alpha1",
                None,
                info(Verb::Get, None, None, None, None),
            ),
        ];
        for (method, path, query, want) in cases {
            assert_eq!(
                RequestInfo::parse(&method, path, query),
                want,
                "{method} {path}?{query:?}"
            );
        }
    }

    #[test]
    fn a_resource_matches_its_subresources_unless_one_is_named() {
        let status = info(
            Verb::Patch,
            Some("ipreservations"),
            Some("status"),
            Some("a"),
            Some("r"),
        );
        let main = info(
            Verb::Patch,
            Some("ipreservations"),
            None,
            Some("a"),
            Some("r"),
        );
        let any = Rule::new(Fault::Hang).resource("ipreservations");
        let sub = Rule::new(Fault::Hang).resource("ipreservations/status");
        assert!(any.when.matches(&status) && any.when.matches(&main));
        assert!(sub.when.matches(&status) && !sub.when.matches(&main));
        let named = Rule::new(Fault::Hang).namespace("a").name("r");
        assert!(named.when.matches(&main));
        assert!(!named.namespace("b").when.matches(&main));
        assert!(!Rule::new(Fault::Hang).verb(Verb::Get).when.matches(&main));
        let node: std::net::IpAddr = "10.1.0.2".parse().unwrap();
        let from_node = RequestInfo {
            client: Some("::ffff:10.1.0.2".parse().unwrap()),
            ..main.clone()
        };
        let partition = Rule::new(Fault::Hang).client(node);
        assert!(
            partition.when.matches(&from_node),
            "an IPv4-mapped peer is its IPv4 address"
        );
        assert!(
            !partition.when.matches(&main),
            "an unknown peer is no one's"
        );
    }

    #[test]
    fn rules_apply_in_order_for_their_count_and_keep_their_hits() {
        let mut set = RuleSet::default();
        let list = info(Verb::List, Some("pods"), None, None, None);
        let get = info(Verb::Get, Some("pods"), None, Some("a"), Some("p"));
        let lists = set.add(
            Rule::new(Fault::status(500))
                .verb(Verb::List)
                .resource("pods")
                .times(2),
        );
        let all = set.add(Rule::new(Fault::status(429)).times(1));
        assert_eq!(set.take(&list), Some((lists, Fault::status(500))));
        assert_eq!(set.take(&get), Some((all, Fault::status(429))));
        assert_eq!(set.take(&get), None);
        assert_eq!(set.take(&list), Some((lists, Fault::status(500))));
        assert_eq!(set.take(&list), None);
        assert_eq!((set.hits(lists), set.hits(all)), (2, 1));
        assert!(set.remove(lists));
        assert!(!set.contains(lists) && set.contains(all));
        assert_eq!(set.hits(lists), 0);
        let forever = set.add(Rule::new(Fault::Expired).verb(Verb::Watch));
        let watch = info(Verb::Watch, Some("pods"), None, None, None);
        for _ in 0..3 {
            assert_eq!(set.take(&watch), Some((forever, Fault::Expired)));
        }
        set.clear();
        assert_eq!(set.take(&watch), None);
    }

    #[test]
    fn rules_read_from_json() {
        let rule: Rule = serde_json::from_str(
            r#"{"match": {"verb": "patch", "resource": "ipreservations"},
                "fault": {"kind": "status", "code": 429, "retryAfterSeconds": 2}, "times": 4}"#,
        )
        .unwrap();
        assert_eq!(
            rule,
            Rule::new(Fault::Status {
                code: 429,
                retry_after_seconds: Some(2)
            })
            .verb(Verb::Patch)
            .resource("ipreservations")
            .times(4)
        );
        for (text, fault) in [
            (r#"{"kind": "expired"}"#, Fault::Expired),
            (
                r#"{"kind": "cutWatch", "events": 3}"#,
                Fault::CutWatch { events: 3 },
            ),
            (
                r#"{"kind": "delay", "millis": 250}"#,
                Fault::delay(Duration::from_millis(250)),
            ),
            (r#"{"kind": "hang"}"#, Fault::Hang),
        ] {
            assert_eq!(
                serde_json::from_str::<Fault>(text).unwrap(),
                fault,
                "{text}"
            );
        }
        assert!(serde_json::from_str::<Rule>(r#"{"fault": {"kind": "nap"}}"#).is_err());
    }
}
