//! `CNI_ARGS` exactly as host-local reads it (the CNI library's `types.LoadArgs` into
//! `{IgnoreUnknown, IP}`), plus the Kubernetes pod identity ipkeep records with each allocation.

use std::net::IpAddr;

use crate::gojson::go_quote;

/// What `CNI_ARGS` says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `IP=`: a requested address (`None` when absent or empty).
    pub ip: Option<IpAddr>,
    /// `K8S_POD_NAMESPACE=` (recorded for the index; host-local ignores it).
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME=`.
    pub pod_name: Option<String>,
}

/// A requested address as the plugins' `ip.IP` text type reads it: `ip` or `ip/prefix` (the
/// prefix is validated, then ignored). `Ok(None)` for the empty string.
pub fn parse_requested_ip(text: &str) -> Result<Option<IpAddr>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    let ip = if text.contains('/') {
        crate::addr::Cidr::parse(text).map(|c| c.ip)
    } else {
        crate::addr::parse_ip(text)
    };
    ip.map(Some)
        .ok_or_else(|| format!("invalid IP address {text}"))
}

/// Parses `CNI_ARGS` with host-local's rules and messages (`ARGS: invalid pair "x"`, …).
pub fn parse(args: &str) -> Result<CniArgs, String> {
    let mut out = CniArgs::default();
    if args.is_empty() {
        return Ok(out);
    }
    let mut ignore_unknown = false;
    let mut unknown: Vec<&str> = Vec::new();
    for pair in args.split(';') {
        let kv: Vec<&str> = pair.split('=').collect();
        let [key, value] = kv.as_slice() else {
            return Err(format!("ARGS: invalid pair {}", go_quote(pair)));
        };
        match *key {
            "IP" => {
                out.ip = parse_requested_ip(value).map_err(|e| {
                    format!("ARGS: error parsing value of pair {}: {e}", go_quote(pair))
                })?;
            }
            "IgnoreUnknown" => {
                let lower = value.to_lowercase();
                ignore_unknown = match lower.as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => {
                        return Err(format!(
                            "ARGS: error parsing value of pair {}: boolean unmarshal error: invalid input {lower}",
                            go_quote(pair)
                        ));
                    }
                };
            }
            "CommonArgs" => {
                return Err("ARGS: cannot unmarshal into field 'CommonArgs' - type '*types.CommonArgs' does not implement encoding.TextUnmarshaler".to_owned());
            }
            other => {
                match other {
                    "K8S_POD_NAMESPACE" => out.pod_namespace = Some((*value).to_owned()),
                    "K8S_POD_NAME" => out.pod_name = Some((*value).to_owned()),
                    _ => {}
                }
                unknown.push(pair);
            }
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        let list: Vec<String> = unknown.iter().map(|p| go_quote(p)).collect();
        return Err(format!("ARGS: unknown args [{}]", list.join(" ")));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let k8s =
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_INFRA_CONTAINER_ID=c1";
        type Case<'a> = (&'a str, Result<(&'a str, &'a str, &'a str), &'a str>);
        let cases: &[Case] = &[
            ("", Ok(("", "", ""))),
            ("IP=10.1.0.50", Ok(("10.1.0.50", "", ""))),
            ("IP=10.1.0.50/16", Ok(("10.1.0.50", "", ""))),
            ("IP=", Ok(("", "", ""))),
            ("IP=10.1.0.5;IP=10.1.0.6", Ok(("10.1.0.6", "", ""))),
            (k8s, Ok(("", "ns", "pod"))),
            ("K8S_POD_NAME=pod;IgnoreUnknown=TRUE", Ok(("", "", "pod"))),
            ("IP=1.2.3.4;", Err(r#"ARGS: invalid pair """#)),
            ("IP=a=b", Err(r#"ARGS: invalid pair "IP=a=b""#)),
            (
                "IP=foo",
                Err(r#"ARGS: error parsing value of pair "IP=foo": invalid IP address foo"#),
            ),
            (
                "IgnoreUnknown=Yes",
                Err(
                    r#"ARGS: error parsing value of pair "IgnoreUnknown=Yes": boolean unmarshal error: invalid input yes"#,
                ),
            ),
            (
                "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod",
                Err(r#"ARGS: unknown args ["K8S_POD_NAMESPACE=ns" "K8S_POD_NAME=pod"]"#),
            ),
            ("ip=10.1.0.5", Err(r#"ARGS: unknown args ["ip=10.1.0.5"]"#)),
            (
                "IgnoreUnknown=1;IgnoreUnknown=0;x=y",
                Err(r#"ARGS: unknown args ["x=y"]"#),
            ),
            (
                "CommonArgs=1",
                Err(
                    "ARGS: cannot unmarshal into field 'CommonArgs' - type '*types.CommonArgs' does not implement encoding.TextUnmarshaler",
                ),
            ),
        ];
        for (input, want) in cases {
            let got = parse(input).map(|a| {
                (
                    a.ip.map(|i| i.to_string()).unwrap_or_default(),
                    a.pod_namespace.unwrap_or_default(),
                    a.pod_name.unwrap_or_default(),
                )
            });
            let want = want
                .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()))
                .map_err(str::to_owned);
            assert_eq!(got, want, "{input:?}");
        }
    }
}
