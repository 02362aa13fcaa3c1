//! A network directory without ipkeep's index (new, host-local's, or wiped) takes back the
//! addresses of the attachments the runtime's result cache says exist ([`result_cache`]), before
//! anything else is done in it: a wiped directory would otherwise hand a running pod's address to
//! the next pod (host-local does), ipkeep's own controller among those pods.
//!
//! The cache also keeps an attachment whose DEL failed; its address is then kept too, until the
//! runtime's next DEL or GC for it, as host-local keeps the file of a failed DEL.

use std::net::IpAddr;
use std::path::Path;

use ipkeep_hostlocal::DiskStore;
use ipkeep_hostlocal::range::RangeSet;
use ipkeep_hostlocal::result_cache::{self, CachedAttachment};

use super::CniError;

/// The addresses to take back: each cached attachment's addresses that one of `sets` contains,
/// in the cache's order, each address once (the first attachment naming it).
pub(super) fn adoptions<'a>(
    cached: &'a [CachedAttachment],
    sets: &[RangeSet],
) -> Vec<(IpAddr, &'a CachedAttachment)> {
    let mut out: Vec<(IpAddr, &CachedAttachment)> = Vec::new();
    for attachment in cached {
        for ip in &attachment.ips {
            if sets.iter().any(|s| s.contains(*ip)) && !out.iter().any(|(seen, _)| seen == ip) {
                out.push((*ip, attachment));
            }
        }
    }
    out
}

/// When the directory had no index: records every address [`adoptions`] names that nothing
/// occupies, one stderr line each, and one per cache file skipped.
pub(super) fn adopt_cached(
    store: &mut DiskStore<'_>,
    network: &str,
    sets: &[RangeSet],
    cache_dir: &Path,
) -> Result<(), CniError> {
    if store.had_index() {
        return Ok(());
    }
    let (cached, skipped) = result_cache::read(cache_dir, network);
    let mut lines: Vec<String> = skipped
        .into_iter()
        .map(|why| format!("a cached result skipped: {why}"))
        .collect();
    for (ip, a) in adoptions(&cached, sets) {
        let taken = store
            .adopt(ip, &a.container_id, &a.ifname, a.pod.as_ref())
            .map_err(CniError::internal)?;
        let pod = a
            .pod
            .as_ref()
            .map(|p| format!(" (pod {p})"))
            .unwrap_or_default();
        lines.push(if taken {
            format!(
                "no index (a new or wiped directory): {ip} taken back for container {} {}{pod}, which the runtime's result cache says holds it",
                a.container_id, a.ifname
            )
        } else {
            format!(
                "no index: {ip} is cached for container {} {}{pod} but already held",
                a.container_id, a.ifname
            )
        });
    }
    store.log_lines(lines);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use ipkeep_hostlocal::addr::{Cidr, parse_ip};
    use ipkeep_hostlocal::range::{RangeSpec, canonicalize_set};

    fn set(subnet: &str) -> RangeSet {
        canonicalize_set(&[RangeSpec {
            subnet: Cidr::parse(subnet),
            ..RangeSpec::default()
        }])
        .unwrap()
    }

    fn cached(id: &str, ips: &[&str]) -> CachedAttachment {
        CachedAttachment {
            container_id: id.into(),
            ifname: "eth0".into(),
            pod: None,
            ips: ips.iter().map(|s| parse_ip(s).unwrap()).collect(),
        }
    }

    #[test]
    fn adoptions_table() {
        let v4 = set("10.88.0.0/24");
        let v6 = set("fd00::/64");
        type Case<'a> = (
            &'a str,
            Vec<CachedAttachment>,
            Vec<RangeSet>,
            &'a [(&'a str, &'a str)],
        );
        let cases: Vec<Case> = vec![
            ("nothing cached", vec![], vec![v4.clone()], &[]),
            (
                "one attachment",
                vec![cached("a", &["10.88.0.5"])],
                vec![v4.clone()],
                &[("10.88.0.5", "a")],
            ),
            (
                "dual stack, one set each",
                vec![cached("a", &["10.88.0.5", "fd00::5"])],
                vec![v4.clone(), v6.clone()],
                &[("10.88.0.5", "a"), ("fd00::5", "a")],
            ),
            (
                "addresses outside every range (another network's)",
                vec![cached("a", &["10.99.0.5", "10.88.0.0", "fd00::5"])],
                vec![v4.clone()],
                &[],
            ),
            (
                "two attachments name one address: the first keeps it",
                vec![
                    cached("a", &["10.88.0.5"]),
                    cached("b", &["10.88.0.5", "10.88.0.6"]),
                ],
                vec![v4.clone()],
                &[("10.88.0.5", "a"), ("10.88.0.6", "b")],
            ),
        ];
        for (what, cache, sets, want) in cases {
            let got: Vec<(String, String)> = adoptions(&cache, &sets)
                .into_iter()
                .map(|(ip, a)| (ip.to_string(), a.container_id.clone()))
                .collect();
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(ip, id)| ((*ip).to_owned(), (*id).to_owned()))
                .collect();
            assert_eq!(got, want, "{what}");
        }
    }
}
