//! The CNI result and error JSON for every cniVersion, byte for byte as host-local prints them
//! (Go `MarshalIndent` with 4 spaces, no trailing newline, struct key order, `"dns": {}` always).

use std::net::IpAddr;

use crate::config::Route;
use crate::gojson::{Out, object, to_indented};
use crate::resolv::Dns;

/// One allocated address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// The address.
    pub address: IpAddr,
    /// The prefix length of its range's subnet.
    pub prefix: u8,
    /// The range's gateway.
    pub gateway: Option<IpAddr>,
}

/// What ADD returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniResult {
    /// One address per range set, in range-set order.
    pub ips: Vec<IpConfig>,
    /// Routes from the configuration (`None`: a JSON `null` entry, echoed as `null`).
    pub routes: Vec<Option<Route>>,
    /// DNS from `resolvConf`.
    pub dns: Dns,
}

fn str_list(items: &[String]) -> Out {
    Out::Array(items.iter().map(|s| Out::String(s.clone())).collect())
}

fn dns_out(dns: &Dns) -> Out {
    let mut m = Vec::new();
    if !dns.nameservers.is_empty() {
        m.push(("nameservers", str_list(&dns.nameservers)));
    }
    if !dns.domain.is_empty() {
        m.push(("domain", Out::String(dns.domain.clone())));
    }
    if !dns.search.is_empty() {
        m.push(("search", str_list(&dns.search)));
    }
    if !dns.options.is_empty() {
        m.push(("options", str_list(&dns.options)));
    }
    object(m)
}

fn route_out(route: Option<&Route>) -> Out {
    let Some(route) = route else { return Out::Null };
    let dst = route
        .dst
        .map_or_else(|| "<nil>".to_owned(), |d| d.to_string());
    let mut m = vec![("dst", Out::String(dst))];
    if let Some(gw) = route.gw {
        m.push(("gw", Out::String(gw.to_string())));
    }
    object(m)
}

fn address(ip: &IpConfig) -> String {
    format!("{}/{}", ip.address, ip.prefix)
}

/// The result printed for `cni_version` (`""` prints as 0.1.0, like host-local).
pub fn result_json(result: &CniResult, cni_version: &str) -> String {
    let version = if cni_version.is_empty() {
        "0.1.0"
    } else {
        cni_version
    };
    let mut top = vec![("cniVersion", Out::String(version.to_owned()))];
    if matches!(version, "0.1.0" | "0.2.0") {
        // The 0.2.0 shape: the first address of each family, routes sorted into them by family.
        let v4 = result.ips.iter().find(|i| i.address.is_ipv4());
        let v6 = result.ips.iter().find(|i| i.address.is_ipv6());
        for (key, ip, want_v4) in [("ip4", v4, true), ("ip6", v6, false)] {
            let Some(ip) = ip else { continue };
            let mut m = vec![("ip", Out::String(address(ip)))];
            if let Some(gw) = ip.gateway {
                m.push(("gateway", Out::String(gw.to_string())));
            }
            let routes: Vec<Out> = result
                .routes
                .iter()
                .flatten()
                .filter(|r| r.dst.is_some_and(|d| d.ip.is_ipv4()) == want_v4)
                .map(|r| route_out(Some(r)))
                .collect();
            if !routes.is_empty() {
                m.push(("routes", Out::Array(routes)));
            }
            top.push((key, object(m)));
        }
    } else {
        let with_version = matches!(version, "0.3.0" | "0.3.1" | "0.4.0");
        let ips: Vec<Out> = result
            .ips
            .iter()
            .map(|ip| {
                let mut m = Vec::new();
                if with_version {
                    m.push((
                        "version",
                        Out::String(if ip.address.is_ipv4() { "4" } else { "6" }.to_owned()),
                    ));
                }
                m.push(("address", Out::String(address(ip))));
                if let Some(gw) = ip.gateway {
                    m.push(("gateway", Out::String(gw.to_string())));
                }
                object(m)
            })
            .collect();
        if !ips.is_empty() {
            top.push(("ips", Out::Array(ips)));
        }
        if !result.routes.is_empty() {
            top.push((
                "routes",
                Out::Array(
                    result
                        .routes
                        .iter()
                        .map(|r| route_out(r.as_ref()))
                        .collect(),
                ),
            ));
        }
    }
    top.push(("dns", dns_out(&result.dns)));
    to_indented(&object(top))
}

/// A CNI error as the CNI library prints it (no `cniVersion`, `details` omitted when empty).
pub fn error_json(code: u32, msg: &str, details: &str) -> String {
    let mut m = vec![
        ("code", Out::from(u64::from(code))),
        ("msg", Out::String(msg.to_owned())),
    ];
    if !details.is_empty() {
        m.push(("details", Out::String(details.to_owned())));
    }
    to_indented(&object(m))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::addr::{Cidr, parse_ip};

    fn basic() -> CniResult {
        CniResult {
            ips: vec![IpConfig {
                address: parse_ip("10.1.0.2").unwrap(),
                prefix: 24,
                gateway: parse_ip("10.1.0.1"),
            }],
            ..CniResult::default()
        }
    }

    #[test]
    fn every_version() {
        for version in [
            "", "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ] {
            let got = result_json(&basic(), version);
            let want = match version {
                "" | "0.1.0" | "0.2.0" => format!(
                    "{{\n    \"cniVersion\": \"{}\",\n    \"ip4\": {{\n        \"ip\": \"10.1.0.2/24\",\n        \"gateway\": \"10.1.0.1\"\n    }},\n    \"dns\": {{}}\n}}",
                    if version.is_empty() { "0.1.0" } else { version }
                ),
                "0.3.0" | "0.3.1" | "0.4.0" => format!(
                    "{{\n    \"cniVersion\": \"{version}\",\n    \"ips\": [\n        {{\n            \"version\": \"4\",\n            \"address\": \"10.1.0.2/24\",\n            \"gateway\": \"10.1.0.1\"\n        }}\n    ],\n    \"dns\": {{}}\n}}"
                ),
                _ => format!(
                    "{{\n    \"cniVersion\": \"{version}\",\n    \"ips\": [\n        {{\n            \"address\": \"10.1.0.2/24\",\n            \"gateway\": \"10.1.0.1\"\n        }}\n    ],\n    \"dns\": {{}}\n}}"
                ),
            };
            assert_eq!(got, want, "version {version:?}");
        }
    }

    #[test]
    fn dual_stack_routes_and_dns() {
        let mut r = basic();
        r.ips.push(IpConfig {
            address: parse_ip("fd00::2").unwrap(),
            prefix: 120,
            gateway: parse_ip("fd00::1"),
        });
        r.routes = vec![
            Some(Route {
                dst: Cidr::parse("0.0.0.0/0"),
                gw: None,
            }),
            Some(Route {
                dst: Cidr::parse("::/0"),
                gw: parse_ip("fd00::1"),
            }),
        ];
        r.dns = Dns {
            nameservers: vec!["192.0.2.3".into()],
            domain: "d".into(),
            search: vec![],
            options: vec!["ndots:2".into()],
        };
        let v1 = result_json(&r, "1.0.0");
        assert!(v1.contains("\"routes\": [\n        {\n            \"dst\": \"0.0.0.0/0\"\n        },\n        {\n            \"dst\": \"::/0\",\n            \"gw\": \"fd00::1\"\n        }\n    ],\n    \"dns\": {\n        \"nameservers\": [\n            \"192.0.2.3\"\n        ],\n        \"domain\": \"d\",\n        \"options\": [\n            \"ndots:2\"\n        ]\n    }\n}"), "{v1}");
        let v2 = result_json(&r, "0.2.0");
        assert!(v2.contains("\"ip6\": {\n        \"ip\": \"fd00::2/120\",\n        \"gateway\": \"fd00::1\",\n        \"routes\": [\n            {\n                \"dst\": \"::/0\",\n                \"gw\": \"fd00::1\"\n            }\n        ]\n    }"), "{v2}");
        // A v6 route is dropped in 0.2.0 when there is no v6 address.
        let mut only4 = basic();
        only4.routes = vec![Some(Route {
            dst: Cidr::parse("::/0"),
            gw: None,
        })];
        assert!(!result_json(&only4, "0.2.0").contains("routes"));
    }

    #[test]
    fn errors() {
        assert_eq!(
            error_json(7, "missing network name", ""),
            "{\n    \"code\": 7,\n    \"msg\": \"missing network name\"\n}"
        );
        assert_eq!(
            error_json(999, "invalid range set 0: IP <nil> not v4 nor v6", "x"),
            "{\n    \"code\": 999,\n    \"msg\": \"invalid range set 0: IP \\u003cnil\\u003e not v4 nor v6\",\n    \"details\": \"x\"\n}"
        );
    }
}
