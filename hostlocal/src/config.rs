//! The network configuration, read exactly as host-local's `allocator.LoadIPAMConfig` reads it:
//! the same Go decoding rules, the same validation order, the same messages.

use std::net::IpAddr;

use crate::addr::Cidr;
use crate::cni_args::{self, CniArgs};
use crate::gojson::{DecodeError, Decoder, Value};
use crate::range::{self, RangeSet, RangeSpec};

/// Where host-local keeps its state when `dataDir` is not set.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// A configured route, echoed into the result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// `dst` as written (`None`: missing, printed as Go prints a nil network, `<nil>`).
    pub dst: Option<Cidr>,
    /// `gw`, if set.
    pub gw: Option<IpAddr>,
}

/// One `cni.dev/valid-attachments` entry of a GC request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attachment {
    /// The container ID.
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
}

/// The IPAM configuration after host-local's validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpamConfig {
    /// The network name (the top-level `name`): the state sub-directory.
    pub name: String,
    /// The `cniVersion` as written.
    pub cni_version: String,
    /// The range sets in host-local's order (`runtimeConfig.ipRanges`, legacy range, `ranges`).
    pub range_sets: Vec<RangeSet>,
    /// Routes to echo.
    pub routes: Vec<Option<Route>>,
    /// The data directory (`dataDir`, or the default).
    pub data_dir: String,
    /// `resolvConf`, empty if unset.
    pub resolv_conf: String,
    /// Requested addresses (CNI_ARGS `IP`, `args.cni.ips`, `runtimeConfig.ips`), in that order.
    pub requested: Vec<IpAddr>,
    /// What `CNI_ARGS` said.
    pub args: CniArgs,
}

#[derive(Clone, Debug, Default)]
struct RangeDoc {
    range_start: Option<IpAddr>,
    range_end: Option<IpAddr>,
    subnet: Option<Cidr>,
    gateway: Option<IpAddr>,
}

#[derive(Debug, Default)]
struct IpamDoc {
    range: RangeDoc,
    routes: Vec<Option<Route>>,
    data_dir: String,
    resolv_conf: String,
    ranges: Vec<Vec<RangeDoc>>,
    ignored: String,
}

#[derive(Debug, Default)]
struct NetDoc {
    name: String,
    cni_version: String,
    ipam: Option<IpamDoc>,
    ip_ranges: Vec<Vec<RangeDoc>>,
    runtime_ips: Vec<Option<IpAddr>>,
    args_present: bool,
    cni_args: Option<Vec<Option<IpAddr>>>,
}

const RUNTIME_CONFIG_TYPE: &str = r#"struct { IPRanges []allocator.RangeSet "json:\"ipRanges,omitempty\""; IPs []*ip.IP "json:\"ips,omitempty\"" }"#;
const ARGS_TYPE: &str = r#"struct { A *allocator.IPAMArgs "json:\"cni\"" }"#;

/// Go's `net.IP` text field: `""` and `null` unset it, bad text stops decoding.
fn decode_net_ip(d: &mut Decoder, v: &Value, out: &mut Option<IpAddr>) -> Result<(), DecodeError> {
    match v {
        Value::Null => *out = None,
        Value::String(s) if s.is_empty() => *out = None,
        Value::String(s) => {
            *out = Some(
                crate::addr::parse_ip(s)
                    .ok_or_else(|| DecodeError::Custom(format!("invalid IP address: {s}")))?,
            );
        }
        other => {
            let e = d.type_error(other, "net.IP");
            d.save(e);
        }
    }
    Ok(())
}

/// The CNI library's `types.IPNet` (its own `UnmarshalJSON`: a string, then `ParseCIDR`).
fn decode_ipnet(d: &mut Decoder, v: &Value) -> Result<Cidr, DecodeError> {
    let text = match v {
        Value::Null => "",
        Value::String(s) => s.as_str(),
        other => return Err(d.type_error(other, "string")),
    };
    Cidr::parse(text).ok_or_else(|| DecodeError::Custom(format!("invalid CIDR address: {text}")))
}

/// The plugins' `*ip.IP` list element (`ip` or `ip/prefix`; `""`/`null` is a nil address).
fn decode_req_ip(d: &mut Decoder, v: &Value, out: &mut Option<IpAddr>) -> Result<(), DecodeError> {
    match v {
        Value::Null => *out = None,
        Value::String(s) => *out = cni_args::parse_requested_ip(s).map_err(DecodeError::Custom)?,
        other => {
            let e = d.type_error(other, "*ip.IP");
            d.save(e);
        }
    }
    Ok(())
}

fn decode_range(d: &mut Decoder, v: &Value, out: &mut RangeDoc) -> Result<(), DecodeError> {
    d.object(
        v,
        "allocator.Range",
        "Range",
        &["rangeStart", "rangeEnd", "subnet", "gateway"],
        |d, f, v| range_field(d, f, v, out),
    )
}

fn range_field(
    d: &mut Decoder,
    field: &str,
    v: &Value,
    out: &mut RangeDoc,
) -> Result<(), DecodeError> {
    match field {
        "rangeStart" => decode_net_ip(d, v, &mut out.range_start),
        "rangeEnd" => decode_net_ip(d, v, &mut out.range_end),
        "gateway" => decode_net_ip(d, v, &mut out.gateway),
        _ => {
            out.subnet = Some(decode_ipnet(d, v).map_err(|e| d.with_context(e))?);
            Ok(())
        }
    }
}

fn decode_range_sets(
    d: &mut Decoder,
    v: &Value,
    out: &mut Vec<Vec<RangeDoc>>,
) -> Result<(), DecodeError> {
    d.slice(v, "[]allocator.RangeSet", out, |d, v, set| {
        d.slice(v, "allocator.RangeSet", set, decode_range)
    })
}

/// The CNI library's `types.Route.UnmarshalJSON`: a fresh decode of `{dst, gw}` whose errors
/// surface with the outer field's context.
fn decode_route(d: &mut Decoder, v: &Value, out: &mut Option<Route>) -> Result<(), DecodeError> {
    if matches!(v, Value::Null) {
        *out = None;
        return Ok(());
    }
    let mut inner = Decoder::new();
    let mut route = Route::default();
    let result = inner
        .object(
            v,
            "types.route",
            "route",
            &["dst", "gw"],
            |d, f, v| match f {
                "dst" => {
                    route.dst = Some(decode_ipnet(d, v).map_err(|e| d.with_context(e))?);
                    Ok(())
                }
                _ => decode_net_ip(d, v, &mut route.gw),
            },
        )
        .and_then(|()| inner.finish());
    match result {
        Ok(()) => {
            *out = Some(route);
            Ok(())
        }
        Err(e) => Err(d.with_context(e)),
    }
}

fn decode_ipam(d: &mut Decoder, v: &Value, out: &mut IpamDoc) -> Result<(), DecodeError> {
    let fields = [
        "Name",
        "type",
        "routes",
        "dataDir",
        "resolvConf",
        "ranges",
        "rangeStart",
        "rangeEnd",
        "subnet",
        "gateway",
    ];
    d.object(
        v,
        "allocator.IPAMConfig",
        "IPAMConfig",
        &fields,
        |d, f, v| match f {
            // `ipam.name` and `ipam.type` are decoded (so their type errors show) but not used.
            "Name" | "type" => {
                d.string(v, &mut out.ignored);
                Ok(())
            }
            "routes" => d.slice(v, "[]*types.Route", &mut out.routes, decode_route),
            "dataDir" => {
                d.string(v, &mut out.data_dir);
                Ok(())
            }
            "resolvConf" => {
                d.string(v, &mut out.resolv_conf);
                Ok(())
            }
            "ranges" => decode_range_sets(d, v, &mut out.ranges),
            other => range_field(d, other, v, &mut out.range),
        },
    )
}

fn decode_net(v: &Value) -> Result<NetDoc, DecodeError> {
    let mut d = Decoder::new();
    let mut net = NetDoc::default();
    d.object(
        v,
        "allocator.Net",
        "Net",
        &["name", "cniVersion", "ipam", "runtimeConfig", "args"],
        |d, f, v| match f {
            "name" => {
                d.string(v, &mut net.name);
                Ok(())
            }
            "cniVersion" => {
                d.string(v, &mut net.cni_version);
                Ok(())
            }
            "ipam" => {
                if matches!(v, Value::Null) {
                    net.ipam = None;
                    return Ok(());
                }
                decode_ipam(d, v, net.ipam.get_or_insert_with(IpamDoc::default))
            }
            "runtimeConfig" => d.object(
                v,
                RUNTIME_CONFIG_TYPE,
                "",
                &["ipRanges", "ips"],
                |d, f, v| match f {
                    "ipRanges" => decode_range_sets(d, v, &mut net.ip_ranges),
                    _ => d.slice(v, "[]*ip.IP", &mut net.runtime_ips, decode_req_ip),
                },
            ),
            _ => {
                if matches!(v, Value::Null) {
                    net.args_present = false;
                    net.cni_args = None;
                    return Ok(());
                }
                net.args_present = true;
                d.object(v, ARGS_TYPE, "", &["cni"], |d, _, v| {
                    if matches!(v, Value::Null) {
                        net.cni_args = None;
                        return Ok(());
                    }
                    let ips = net.cni_args.get_or_insert_with(Vec::new);
                    d.object(v, "allocator.IPAMArgs", "IPAMArgs", &["ips"], |d, _, v| {
                        d.slice(v, "[]*ip.IP", ips, decode_req_ip)
                    })
                })
            }
        },
    )?;
    d.finish()?;
    Ok(net)
}

/// Why a configuration is rejected; every message is host-local's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A JSON decoding error (Go's text).
    #[error("{0}")]
    Decode(#[from] DecodeError),
    /// Any of host-local's own validation messages.
    #[error("{0}")]
    Invalid(String),
}

fn to_specs(docs: &[RangeDoc]) -> Vec<RangeSpec> {
    docs.iter()
        .map(|r| RangeSpec {
            subnet: r.subnet,
            range_start: r.range_start,
            range_end: r.range_end,
            gateway: r.gateway,
        })
        .collect()
}

/// host-local's `LoadIPAMConfig(stdin, CNI_ARGS)`.
pub fn load(doc: &Value, cni_args_env: &str) -> Result<IpamConfig, ConfigError> {
    let net = decode_net(doc)?;
    let Some(ipam) = net.ipam else {
        return Err(ConfigError::Invalid(
            "IPAM config missing 'ipam' key".to_owned(),
        ));
    };
    let args = cni_args::parse(cni_args_env).map_err(ConfigError::Invalid)?;
    let mut requested: Vec<Option<IpAddr>> = args.ip.map(Some).into_iter().collect();
    if let Some(ips) = &net.cni_args {
        requested.extend(ips.iter().copied());
    }
    requested.extend(net.runtime_ips.iter().copied());
    let requested: Vec<IpAddr> = requested
        .into_iter()
        .map(|ip| {
            ip.ok_or_else(|| {
                ConfigError::Invalid("cannot understand ip: IP <nil> not v4 nor v6".to_owned())
            })
        })
        .collect::<Result<_, _>>()?;

    let mut set_docs: Vec<Vec<RangeDoc>> = net.ip_ranges.clone();
    if ipam.range.subnet.is_some() {
        set_docs.push(vec![ipam.range.clone()]);
    }
    set_docs.extend(ipam.ranges.iter().cloned());
    if set_docs.is_empty() {
        return Err(ConfigError::Invalid("no IP ranges specified".to_owned()));
    }
    let mut range_sets = Vec::with_capacity(set_docs.len());
    for (i, docs) in set_docs.iter().enumerate() {
        let set = range::canonicalize_set(&to_specs(docs))
            .map_err(|e| ConfigError::Invalid(format!("invalid range set {i}: {e}")))?;
        range_sets.push(set);
    }
    let v4 = range_sets.iter().filter(|s| s.is_ipv4()).count();
    let v6 = range_sets.len() - v4;
    if (v4 > 1 || v6 > 1) && !crate::version::at_least(&net.cni_version, "0.3.0").unwrap_or(false) {
        return Err(ConfigError::Invalid(format!(
            "CNI version {} does not support more than 1 address per family",
            net.cni_version
        )));
    }
    for (i, a) in range_sets.iter().enumerate() {
        for (j, b) in range_sets.iter().enumerate().skip(i + 1) {
            if a.overlaps(b) {
                return Err(ConfigError::Invalid(format!(
                    "range set {i} overlaps with {j}"
                )));
            }
        }
    }
    Ok(IpamConfig {
        name: net.name,
        cni_version: net.cni_version,
        range_sets,
        routes: ipam.routes,
        data_dir: if ipam.data_dir.is_empty() {
            DEFAULT_DATA_DIR.to_owned()
        } else {
            ipam.data_dir
        },
        resolv_conf: ipam.resolv_conf,
        requested,
        args,
    })
}

/// The key of a GC request's list of attachments still in use.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";

/// The `cni.dev/valid-attachments` list of a GC request (the CNI library's `types.NetConf`):
/// `None` when the key is absent or `null` (the runtime said nothing about what is in use, which
/// is not the same as an empty list, "nothing is in use").
pub fn valid_attachments(doc: &Value) -> Result<Option<Vec<Attachment>>, ConfigError> {
    if member(doc, VALID_ATTACHMENTS_KEY).is_none_or(|v| matches!(v, Value::Null)) {
        return Ok(None);
    }
    let mut d = Decoder::new();
    let mut out: Vec<Attachment> = Vec::new();
    d.object(
        doc,
        "types.NetConf",
        "NetConf",
        &["cni.dev/valid-attachments"],
        |d, _, v| {
            d.slice(v, "[]types.GCAttachment", &mut out, |d, v, a| {
                d.object(
                    v,
                    "types.GCAttachment",
                    "GCAttachment",
                    &["containerID", "ifname"],
                    |d, f, v| {
                        match f {
                            "containerID" => d.string(v, &mut a.container_id),
                            _ => d.string(v, &mut a.ifname),
                        }
                        Ok(())
                    },
                )
            })
        },
    )?;
    d.finish()?;
    Ok(Some(out))
}

/// The ipkeep-only key of the `ipam` section that sets how long a returning pod waits for its
/// previous container to let go of its reserved address (host-local ignores it).
pub const GRACE_KEY: &str = "reservationGraceSeconds";
/// The largest grace accepted: a day (a longer wait only keeps a pod from starting).
pub const MAX_GRACE_SECS: u64 = 86_400;

/// The last member of `object` whose key Go would match to `field`.
fn member<'a>(object: &'a Value, field: &str) -> Option<&'a Value> {
    let Value::Object(members) = object else {
        return None;
    };
    members
        .iter()
        .rev()
        .find(|(k, _)| crate::gojson::key_matches(k, field))
        .map(|(_, v)| v)
}

/// `ipam.reservationGraceSeconds`: `None` when absent or `null`, else a whole number of seconds
/// from 0 to [`MAX_GRACE_SECS`]. Read apart from [`load`] so host-local's decoding stays exact.
pub fn reservation_grace(doc: &Value) -> Result<Option<std::time::Duration>, ConfigError> {
    let Some(value) = member(doc, "ipam").and_then(|ipam| member(ipam, GRACE_KEY)) else {
        return Ok(None);
    };
    let secs = match value {
        Value::Null => return Ok(None),
        Value::Number(text) => text.parse::<u64>().ok(),
        _ => None,
    };
    match secs {
        Some(secs) if secs <= MAX_GRACE_SECS => Ok(Some(std::time::Duration::from_secs(secs))),
        _ => Err(ConfigError::Invalid(format!(
            "failed to read ipam.{GRACE_KEY}: expected a whole number of seconds from 0 to {MAX_GRACE_SECS}, got {}",
            describe(value)
        ))),
    }
}

/// The ipkeep-only key of the `ipam` section naming the container runtime's CNI cache directory
/// ([`crate::result_cache`]; host-local ignores it).
pub const CACHE_DIR_KEY: &str = "cniCacheDir";

/// `ipam.cniCacheDir`: libcni's default ([`crate::result_cache::DEFAULT_CACHE_DIR`]) when
/// absent or `null`, else an absolute path. Read apart from [`load`] so host-local's decoding
/// stays exact.
pub fn cni_cache_dir(doc: &Value) -> Result<std::path::PathBuf, ConfigError> {
    let value = member(doc, "ipam").and_then(|ipam| member(ipam, CACHE_DIR_KEY));
    match value {
        None | Some(Value::Null) => Ok(crate::result_cache::DEFAULT_CACHE_DIR.into()),
        Some(Value::String(path)) if path.starts_with('/') && !path.contains('\0') => {
            Ok(path.into())
        }
        Some(other) => Err(ConfigError::Invalid(format!(
            "failed to read ipam.{CACHE_DIR_KEY}: expected an absolute path, got {}",
            describe(other)
        ))),
    }
}

/// A short rendering of a JSON value for messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Number(text) => text.clone(),
        Value::String(text) => crate::gojson::go_quote(text),
        other => other.kind().to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn cni_cache_dir_table() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (r#"{"ipam":{}}"#, Ok("/var/lib/cni")),
            (r#"{"ipam":{"cniCacheDir":null}}"#, Ok("/var/lib/cni")),
            (r#"{"ipam":{"cniCacheDir":"/run/cni"}}"#, Ok("/run/cni")),
            (r#"{"IPAM":{"CNICacheDir":"/x"}}"#, Ok("/x")),
            (r#"{"ipam":{"cniCacheDir":"cache"}}"#, Err("got \"cache\"")),
            (r#"{"ipam":{"cniCacheDir":""}}"#, Err("got \"\"")),
            (r#"{"ipam":{"cniCacheDir":7}}"#, Err("got 7")),
        ];
        for (json, want) in cases {
            let doc = crate::gojson::parse(json.as_bytes()).unwrap();
            match (cni_cache_dir(&doc), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, std::path::Path::new(want), "{json}"),
                (Err(e), Err(part)) => {
                    let text = e.to_string();
                    assert!(
                        text.starts_with(
                            "failed to read ipam.cniCacheDir: expected an absolute path"
                        ) && text.ends_with(part),
                        "{json}: {text}"
                    );
                }
                (got, _) => panic!("{json}: unexpected {got:?}"),
            }
        }
    }

    #[test]
    fn reservation_grace_table() {
        let cases: &[(&str, Result<Option<u64>, &str>)] = &[
            (r#"{"ipam":{}}"#, Ok(None)),
            (r#"{}"#, Ok(None)),
            (r#"{"ipam":null}"#, Ok(None)),
            (r#"{"ipam":{"reservationGraceSeconds":null}}"#, Ok(None)),
            (r#"{"ipam":{"reservationGraceSeconds":0}}"#, Ok(Some(0))),
            (r#"{"ipam":{"reservationGraceSeconds":30}}"#, Ok(Some(30))),
            (r#"{"IPAM":{"ReservationGraceSeconds":7}}"#, Ok(Some(7))),
            (
                r#"{"ipam":{"reservationGraceSeconds":1,"reservationGraceSeconds":2}}"#,
                Ok(Some(2)),
            ),
            (
                r#"{"ipam":{"reservationGraceSeconds":86400}}"#,
                Ok(Some(86_400)),
            ),
            (
                r#"{"ipam":{"reservationGraceSeconds":86401}}"#,
                Err("got 86401"),
            ),
            (r#"{"ipam":{"reservationGraceSeconds":-1}}"#, Err("got -1")),
            (
                r#"{"ipam":{"reservationGraceSeconds":1.5}}"#,
                Err("got 1.5"),
            ),
            (
                r#"{"ipam":{"reservationGraceSeconds":"30s"}}"#,
                Err("got \"30s\""),
            ),
            (
                r#"{"ipam":{"reservationGraceSeconds":[]}}"#,
                Err("got array"),
            ),
        ];
        for (json, want) in cases {
            let doc = crate::gojson::parse(json.as_bytes()).unwrap();
            let got = reservation_grace(&doc).map(|d| d.map(|d| d.as_secs()));
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{json}"),
                (Err(e), Err(part)) => {
                    let text = e.to_string();
                    assert!(
                        text.starts_with("failed to read ipam.reservationGraceSeconds:")
                            && text.ends_with(part),
                        "{json}: {text}"
                    );
                }
                (got, _) => panic!("{json}: unexpected {got:?}"),
            }
        }
    }

    fn load_str(json: &str, args: &str) -> Result<IpamConfig, String> {
        let v = crate::gojson::parse(json.as_bytes()).map_err(|e| e.to_string())?;
        load(&v, args).map_err(|e| e.to_string())
    }

    fn sets(c: &IpamConfig) -> String {
        c.range_sets
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    }

    #[test]
    fn valid_configs() {
        let cases: &[(&str, &str, &str)] = &[
            (
                r#"{"name":"n","ipam":{"subnet":"10.1.0.0/24"}}"#,
                "",
                "10.1.0.1-10.1.0.254",
            ),
            (
                r#"{"name":"n","cniVersion":"0.3.1","runtimeConfig":{"ipRanges":[[{"subnet":"12.1.3.0/24"}]]},"ipam":{"subnet":"10.1.2.0/24","ranges":[[{"subnet":"11.1.2.0/24"}]]}}"#,
                "",
                "12.1.3.1-12.1.3.254 | 10.1.2.1-10.1.2.254 | 11.1.2.1-11.1.2.254",
            ),
            (
                r#"{"NAME":"n","IPAM":{"RANGES":[[{"Subnet":"10.1.0.0/24","RangeStart":"10.1.0.10"}]]}}"#,
                "",
                "10.1.0.10-10.1.0.254",
            ),
            (
                r#"{"name":"n","ipam":{"subnet":"10.9.0.0/24"},"ipam":{"dataDir":"/x"}}"#,
                "",
                "10.9.0.1-10.9.0.254",
            ),
            (
                r#"{"name":"n","ipam":{"rangeStart":"10.1.0.5","ranges":[[{"subnet":"10.2.0.0/24"}]]}}"#,
                "",
                "10.2.0.1-10.2.0.254",
            ),
            (
                r#"{"name":"n","ipam":{"subnet":"10.1.0.0/24","ranges":null}}"#,
                "",
                "10.1.0.1-10.1.0.254",
            ),
        ];
        for (json, args, want) in cases {
            let c = load_str(json, args).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(sets(&c), *want, "{json}");
        }
        let c = load_str(
            r#"{"name":"n","ipam":{"subnet":"10.9.0.0/24"},"ipam":{"dataDir":"/x"}}"#,
            "",
        )
        .unwrap();
        assert_eq!(c.data_dir, "/x", "a repeated object is merged, as Go does");
        let c = load_str(r#"{"name":"n","ipam":{"subnet":"10.1.0.0/24"}}"#, "").unwrap();
        assert_eq!(c.data_dir, DEFAULT_DATA_DIR);
    }

    #[test]
    fn requested_ips_are_unioned_in_order() {
        let json = r#"{"name":"n","args":{"cni":{"ips":["10.1.0.7/8"]}},"runtimeConfig":{"ips":["::ffff:10.1.0.8"]},"ipam":{"subnet":"10.1.0.0/24"}}"#;
        let c = load_str(json, "IP=10.1.0.6").unwrap();
        let got: Vec<String> = c.requested.iter().map(|i| i.to_string()).collect();
        assert_eq!(got, vec!["10.1.0.6", "10.1.0.7", "10.1.0.8"]);
    }

    #[test]
    fn error_messages_are_host_locals() {
        let b = r#""name":"n","cniVersion":"0.3.1""#;
        let cases: Vec<(String, &str, &str)> = vec![
            (format!("{{{b}}}"), "", "IPAM config missing 'ipam' key"),
            (format!("{{{b},\"ipam\":null}}"), "", "IPAM config missing 'ipam' key"),
            (format!("{{{b},\"ipam\":{{}}}}"), "", "no IP ranges specified"),
            (format!("{{{b},\"ipam\":\"x\"}}"), "", "json: cannot unmarshal string into Go struct field Net.ipam of type allocator.IPAMConfig"),
            (format!("{{{b},\"ipam\":[]}}"), "", "json: cannot unmarshal array into Go struct field Net.ipam of type allocator.IPAMConfig"),
            (format!("{{{b},\"ipam\":{{\"ranges\":[[{{\"subnet\":5}}]]}}}}"), "", "json: cannot unmarshal number into Go struct field Range.ipam.ranges.subnet of type string"),
            (format!("{{{b},\"ipam\":{{\"subnet\":5}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.subnet of type string"),
            (format!("{{{b},\"ipam\":{{\"dataDir\":5,\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.dataDir of type string"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\",\"rangeStart\":5}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.rangeStart of type net.IP"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\",\"routes\":[{{\"dst\":5}}]}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.routes of type string"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\",\"routes\":5}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.routes of type []*types.Route"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\",\"routes\":[5]}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.routes of type types.route"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\",\"routes\":[{{\"dst\":\"10.0.0.0/8\",\"gw\":5}}]}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.routes of type net.IP"),
            (format!("{{{b},\"runtimeConfig\":{{\"ips\":\"x\"}},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal string into Go struct field .runtimeConfig.ips of type []*ip.IP"),
            (format!("{{{b},\"runtimeConfig\":5,\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal number into Go struct field Net.runtimeConfig of type struct { IPRanges []allocator.RangeSet \"json:\\\"ipRanges,omitempty\\\"\"; IPs []*ip.IP \"json:\\\"ips,omitempty\\\"\" }"),
            (format!("{{{b},\"args\":5,\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal number into Go struct field Net.args of type struct { A *allocator.IPAMArgs \"json:\\\"cni\\\"\" }"),
            (format!("{{{b},\"args\":{{\"cni\":5}},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal number into Go struct field .args.cni of type allocator.IPAMArgs"),
            (format!("{{{b},\"args\":{{\"cni\":{{\"ips\":[5]}}}},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMArgs.args.cni.ips of type *ip.IP"),
            (format!("{{{b},\"ipam\":{{\"ranges\":[5]}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.ranges of type allocator.RangeSet"),
            (format!("{{{b},\"ipam\":{{\"ranges\":5}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.ranges of type []allocator.RangeSet"),
            (format!("{{{b},\"ipam\":{{\"ranges\":{{}}}}}}"), "", "json: cannot unmarshal object into Go struct field IPAMConfig.ipam.ranges of type []allocator.RangeSet"),
            (format!("{{{b},\"ipam\":{{\"ranges\":[[5]]}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.ranges of type allocator.Range"),
            (format!("{{{b},\"ipam\":{{\"subnet\":null,\"ranges\":[[{{\"subnet\":\"10.1.0.0/24\",\"gateway\":5}}]]}}}}"), "", "invalid CIDR address: "),
            (format!("{{{b},\"ipam\":{{\"name\":5,\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal number into Go struct field IPAMConfig.ipam.Name of type string"),
            (format!("{{{b},\"runtimeConfig\":{{\"ipRanges\":[[{{\"subnet\":true}}]]}},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "json: cannot unmarshal bool into Go struct field Range.runtimeConfig.ipRanges.subnet of type string"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/33\"}}}}"), "", "invalid CIDR address: 10.1.0.0/33"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\",\"rangeStart\":\"10.1.0.x\"}}}}"), "", "invalid IP address: 10.1.0.x"),
            (format!("{{{b},\"ipam\":{{\"ranges\":[[{{}}]]}}}}"), "", "invalid range set 0: IP <nil> not v4 nor v6"),
            (format!("{{{b},\"ipam\":{{\"ranges\":[[]]}}}}"), "", "invalid range set 0: empty range set"),
            (format!("{{{b},\"ipam\":{{\"ranges\":[[{{\"subnet\":\"10.1.0.0/24\"}}],[{{\"subnet\":\"10.1.0.0/16\"}}]]}}}}"), "", "range set 0 overlaps with 1"),
            (format!("{{{b},\"args\":{{\"cni\":{{\"ips\":[\"\"]}}}},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "cannot understand ip: IP <nil> not v4 nor v6"),
            (format!("{{{b},\"args\":{{\"cni\":{{\"ips\":[\"10.1.0.9/33\"]}}}},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "", "invalid IP address 10.1.0.9/33"),
            (format!("{{{b},\"ipam\":{{\"subnet\":\"10.1.0.0/24\"}}}}"), "IP=foo", "ARGS: error parsing value of pair \"IP=foo\": invalid IP address foo"),
            ("{\"name\":\"n\",\"cniVersion\":\"0.2.0\",\"ipam\":{\"ranges\":[[{\"subnet\":\"10.1.0.0/24\"}],[{\"subnet\":\"10.2.0.0/24\"}]]}}".to_owned(), "", "CNI version 0.2.0 does not support more than 1 address per family"),
            ("{\"name\":\"n\",\"ipam\":{\"ranges\":[[{\"subnet\":\"10.1.0.0/24\"}],[{\"subnet\":\"10.2.0.0/24\"}]]}}".to_owned(), "", "CNI version  does not support more than 1 address per family"),
        ];
        for (json, args, want) in cases {
            assert_eq!(load_str(&json, args).unwrap_err(), want, "{json}");
        }
    }

    #[test]
    fn routes_are_kept_as_written() {
        let json = r#"{"name":"n","ipam":{"subnet":"10.1.0.0/24","routes":[{"dst":"10.9.9.9/8","gw":"10.1.0.1","mtu":1400},{"gw":""}]}}"#;
        let c = load_str(json, "").unwrap();
        assert_eq!(c.routes.len(), 2);
        let r0 = c.routes[0].clone().unwrap();
        assert_eq!(r0.dst.unwrap().to_string(), "10.9.9.9/8");
        assert_eq!(r0.gw.unwrap().to_string(), "10.1.0.1");
        assert_eq!(c.routes[1], Some(Route::default()));
    }

    #[test]
    fn gc_attachments() {
        let v = crate::gojson::parse(br#"{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"CONTAINERID":"c2"}]}"#).unwrap();
        let a = valid_attachments(&v).unwrap().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(
            (a[0].container_id.as_str(), a[0].ifname.as_str()),
            ("c1", "eth0")
        );
        assert_eq!(
            (a[1].container_id.as_str(), a[1].ifname.as_str()),
            ("c2", "")
        );
    }

    #[test]
    fn gc_attachments_missing_is_not_empty() {
        // (request, number of attachments, or None for "the runtime sent no list")
        let cases: &[(&str, Option<usize>)] = &[
            (r#"{"name":"n"}"#, None),
            (r#"{"name":"n","cni.dev/valid-attachments":null}"#, None),
            (r#"{"name":"n","cni.dev/valid-attachments":[]}"#, Some(0)),
            (
                r#"{"name":"n","CNI.dev/Valid-Attachments":[{"containerID":"c"}]}"#,
                Some(1),
            ),
        ];
        for (json, want) in cases {
            let v = crate::gojson::parse(json.as_bytes()).unwrap();
            let got = valid_attachments(&v).unwrap().map(|a| a.len());
            assert_eq!(got, *want, "{json}");
        }
    }
}
