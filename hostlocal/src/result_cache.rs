//! The container runtime's CNI result cache, read to take back the addresses of live
//! attachments when a network directory has lost its files.
//!
//! containerd (go-cni) and CRI-O (ocicni) run plugins through libcni, which, after every
//! successful ADD, writes `<cacheDir>/results/<network>-<containerID>-<ifname>` and removes it
//! after the DEL succeeds (libcni `cacheAdd`/`cacheDel`; neither runtime sets a cache directory,
//! so it is libcni's default, `/var/lib/cni`). The file is JSON:
//! `{"kind":"cniCacheV1","containerId":…,"ifName":…,"networkName":…,"cniArgs":[[k,v],…],
//! "result":{…}}`, the result in the network's CNI version: `ips[].address` from 0.3.0 on,
//! `ip4.ip`/`ip6.ip` in 0.1.0/0.2.0.
//!
//! The cache lives outside the network directory, so a wiped `/var/lib/cni/networks/<net>`
//! leaves it: it still names every attachment the runtime has not deleted.

use std::io::Read as _;
use std::net::IpAddr;
use std::path::Path;

use ipkeep_reservation::PodKey;

/// libcni's default cache directory, which containerd and CRI-O use.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
/// The sub-directory of the cache directory holding the results.
pub const RESULTS_DIR: &str = "results";
/// libcni's cache format.
const KIND: &str = "cniCacheV1";
/// A cached result is a few hundred bytes; anything larger is not one.
const MAX_ENTRY: u64 = 1 << 20;
/// A node has at most a few hundred attachments; a directory with more entries than this is not
/// read further.
const MAX_ENTRIES: usize = 100_000;

/// One attachment the runtime cached: a container's interface and the addresses it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedAttachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod `K8S_POD_NAMESPACE`/`K8S_POD_NAME` named, when both are valid names.
    pub pod: Option<PodKey>,
    /// The result's addresses, without prefix lengths, in the result's order.
    pub ips: Vec<IpAddr>,
}

/// The attachment one cache file records for `network` (`None`: the file is another network's,
/// whose name starts with `network-`), or why it records none.
pub fn parse_entry(text: &[u8], network: &str) -> Result<Option<CachedAttachment>, String> {
    let doc: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let field = |name: &str| doc.get(name).and_then(serde_json::Value::as_str);
    match field("kind") {
        Some(KIND) => {}
        other => return Err(format!("kind {other:?}, not {KIND:?}")),
    }
    if field("networkName") != Some(network) {
        return Ok(None);
    }
    let (Some(container_id), Some(ifname)) = (field("containerId"), field("ifName")) else {
        return Err("no containerId or ifName".to_owned());
    };
    if !crate::store::is_valid_container_id(container_id) {
        return Err("invalid characters in containerId".to_owned());
    }
    ipkeep_netdir::check_name(ifname).map_err(|_| "ifName is not a valid name".to_owned())?;
    let arg = |key: &str| {
        doc.get("cniArgs")?
            .as_array()?
            .iter()
            .filter_map(serde_json::Value::as_array)
            .find(|pair| pair.first().and_then(serde_json::Value::as_str) == Some(key))?
            .get(1)?
            .as_str()
    };
    let pod = match (arg("K8S_POD_NAMESPACE"), arg("K8S_POD_NAME")) {
        (Some(namespace), Some(name)) => PodKey::new(namespace, name).ok(),
        _ => None,
    };
    let result = doc.get("result").ok_or("no result")?;
    let mut addresses: Vec<&str> = result
        .get("ips")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address")?.as_str())
        .collect();
    for old in ["ip4", "ip6"] {
        addresses.extend(result.get(old).and_then(|v| v.get("ip")?.as_str()));
    }
    let ips = addresses
        .into_iter()
        .map(|cidr| {
            let address = cidr.split_once('/').map_or(cidr, |(a, _)| a);
            crate::addr::parse_ip(address).ok_or_else(|| format!("address {cidr:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ips.is_empty() {
        return Err("no address in the result".to_owned());
    }
    Ok(Some(CachedAttachment {
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
        pod,
        ips,
    }))
}

/// Every attachment the cache at `cache_dir` records for `network`, in file-name order, and one
/// line for each file of the network skipped with why. A missing cache is an empty one. Only
/// regular files are read (symbolic links are not followed); names are only compared, never
/// built into paths from what a file says.
pub fn read(cache_dir: &Path, network: &str) -> (Vec<CachedAttachment>, Vec<String>) {
    let results = cache_dir.join(RESULTS_DIR);
    let mut skipped = Vec::new();
    let entries = match std::fs::read_dir(&results) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Vec::new(), skipped),
        Err(e) => {
            skipped.push(format!("{}: {e}", results.display()));
            return (Vec::new(), skipped);
        }
    };
    let prefix = format!("{network}-");
    let mut names: Vec<String> = entries
        .take(MAX_ENTRIES)
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect();
    names.sort();
    let mut found = Vec::new();
    for name in names {
        let path = results.join(&name);
        match read_entry(&path).and_then(|text| parse_entry(&text, network)) {
            Ok(attachment) => found.extend(attachment),
            Err(why) => skipped.push(format!("{}: {why}", path.display())),
        }
    }
    (found, skipped)
}

fn read_entry(path: &Path) -> Result<Vec<u8>, String> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = std::fs::File::from(
        rustix::fs::open(path, flags, Mode::empty()).map_err(|e| e.to_string())?,
    );
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() || meta.len() > MAX_ENTRY {
        return Err("not a regular file of at most 1 MiB".to_owned());
    }
    let mut text = Vec::new();
    file.take(MAX_ENTRY)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        crate::addr::parse_ip(s).unwrap()
    }

    /// An entry in the shape of libcni's `cachedInfo` for a pod on a bridge network (1.0.0).
    const ENTRY: &str = r#"{"kind":"cniCacheV1","containerId":"c0ffee","config":"e30=","ifName":"eth0","networkName":"cbr0","netns":"/var/run/netns/cni-1","cniArgs":[["IgnoreUnknown","1"],["K8S_POD_NAMESPACE","shop"],["K8S_POD_NAME","web-0"],["K8S_POD_INFRA_CONTAINER_ID","c0ffee"]],"result":{"cniVersion":"1.0.0","interfaces":[{"name":"cni0"},{"name":"eth0","sandbox":"/var/run/netns/cni-1"}],"ips":[{"interface":1,"address":"10.88.0.5/24","gateway":"10.88.0.1"},{"interface":1,"address":"fd00::5/64"}]}}"#;

    #[test]
    fn entries_parse_or_say_why_not() {
        let web = CachedAttachment {
            container_id: "c0ffee".into(),
            ifname: "eth0".into(),
            pod: Some(PodKey::new("shop", "web-0").unwrap()),
            ips: vec![ip("10.88.0.5"), ip("fd00::5")],
        };
        let old = r#"{"kind":"cniCacheV1","containerId":"c1","ifName":"eth0","networkName":"cbr0","result":{"cniVersion":"0.2.0","ip4":{"ip":"10.88.0.6/24"}}}"#;
        type Want = Result<Option<CachedAttachment>, &'static str>;
        let cases: Vec<(&str, String, Want)> = vec![
            ("a 1.0.0 result", ENTRY.to_owned(), Ok(Some(web.clone()))),
            (
                "a 0.2.0 result, no pod",
                old.to_owned(),
                Ok(Some(CachedAttachment {
                    container_id: "c1".into(),
                    ifname: "eth0".into(),
                    pod: None,
                    ips: vec![ip("10.88.0.6")],
                })),
            ),
            (
                "a pod name Kubernetes refuses",
                ENTRY.replace("\"web-0\"", "\"Web_0\""),
                Ok(Some(CachedAttachment {
                    pod: None,
                    ..web.clone()
                })),
            ),
            (
                "another network whose name starts with this one's",
                ENTRY.replace("cbr0", "cbr0-x"),
                Ok(None),
            ),
            (
                "another kind",
                ENTRY.replace("cniCacheV1", "cniCacheV2"),
                Err("kind"),
            ),
            (
                "no result",
                old.replace(
                    r#","result":{"cniVersion":"0.2.0","ip4":{"ip":"10.88.0.6/24"}}"#,
                    "",
                ),
                Err("no result"),
            ),
            ("no address", old.replace("ip4", "dns"), Err("no address")),
            (
                "a bad address",
                ENTRY.replace("10.88.0.5/24", "10.88.0.500/24"),
                Err("address"),
            ),
            (
                "no container",
                ENTRY.replace("\"containerId\"", "\"id\""),
                Err("no containerId"),
            ),
            ("not JSON", "{".to_owned(), Err("not JSON")),
        ];
        for (what, text, want) in cases {
            let got = parse_entry(text.as_bytes(), "cbr0");
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{what}"),
                (Err(why), Err(want)) => assert!(why.contains(want), "{what}: {why}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn reads_the_networks_regular_files_only() {
        let cache = tempfile::TempDir::new().unwrap();
        assert_eq!(
            read(cache.path(), "cbr0"),
            (Vec::new(), Vec::new()),
            "no cache yet"
        );
        let results = cache.path().join(RESULTS_DIR);
        std::fs::create_dir(&results).unwrap();
        std::fs::write(results.join("cbr0-c0ffee-eth0"), ENTRY).unwrap();
        std::fs::write(
            results.join("other-c2-eth0"),
            ENTRY.replace("cbr0", "other"),
        )
        .unwrap();
        std::fs::write(results.join("cbr0-c3-eth0"), "garbage").unwrap();
        std::fs::write(
            results.join("cbr0-x-c5-eth0"),
            ENTRY.replace("cbr0", "cbr0-x"),
        )
        .unwrap();
        let outside = cache.path().join("outside");
        std::fs::write(&outside, ENTRY.replace("c0ffee", "c4")).unwrap();
        std::os::unix::fs::symlink(&outside, results.join("cbr0-c4-eth0")).unwrap();
        let (found, skipped) = read(cache.path(), "cbr0");
        assert_eq!(
            found
                .iter()
                .map(|a| a.container_id.as_str())
                .collect::<Vec<_>>(),
            ["c0ffee"]
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].contains("cbr0-c3-eth0: not JSON"), "{skipped:?}");
        assert!(skipped[1].contains("cbr0-c4-eth0"), "{skipped:?}");
    }
}
