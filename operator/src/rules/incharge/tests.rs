//! The in-charge rules, one case per rule and per shape of configuration a user's node has.

use super::*;

/// kube-flannel's `cni-conf.json` (its ConfigMap `kube-flannel-cfg`), as its install-cni init
/// container copies it to `/etc/cni/net.d/10-flannel.conflist`: no `ipam` anywhere.
const KUBE_FLANNEL: &str = r#"{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "flannel",
      "delegate": {
        "hairpinMode": true,
        "isDefaultGateway": true
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}"#;

/// The same with the switch the README asks for: a top-level `ipam` on the flannel plugin.
const KUBE_FLANNEL_SWITCHED: &str = r#"{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "ipam": {"type": "ipkeep"}, "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}"#;

/// A bridge with host-local, as the e2e nodes and kubenet-style clusters have.
const BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "cbr0",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}"#;

fn net(file: &str, name: &str, ipam: Option<(&str, &str)>) -> ConfFile {
    ConfFile::Net(NetConf {
        file: file.into(),
        name: name.into(),
        ipam: ipam.map(|(t, d)| Ipam {
            type_: t.into(),
            data_dir: d.into(),
        }),
    })
}

const DATA: &str = "/var/lib/cni/networks";

#[test]
fn configurations_are_read_as_the_runtime_and_flannel_read_them() {
    let cases: [(&str, &str, ConfFile); 7] = [
        (
            "kube-flannel's conflist: flannel gives its delegate host-local",
            KUBE_FLANNEL,
            net("f", "cbr0", Some(("host-local", DATA))),
        ),
        (
            "kube-flannel's conflist switched: the top-level ipam passes through",
            KUBE_FLANNEL_SWITCHED,
            net("f", "cbr0", Some(("ipkeep", DATA))),
        ),
        (
            "bridge + host-local",
            BRIDGE,
            net("f", "cbr0", Some(("host-local", DATA))),
        ),
        (
            "a single .conf with its dataDir",
            r#"{"name": "mynet", "type": "bridge", "ipam": {"type": "ipkeep", "dataDir": "/run/ipam"}}"#,
            net("f", "mynet", Some(("ipkeep", "/run/ipam"))),
        ),
        (
            "flannel as a single .conf with an ipam of its own and a dataDir",
            r#"{"name": "cbr0", "type": "flannel", "ipam": {"dataDir": "/var/lib/x"}}"#,
            net("f", "cbr0", Some(("host-local", "/var/lib/x"))),
        ),
        (
            "no IPAM at all (a plugin that allocates itself)",
            r#"{"name": "ptp-ish", "plugins": [{"type": "macvlan"}]}"#,
            net("f", "ptp-ish", None),
        ),
        (
            "not JSON",
            "{",
            ConfFile::Skipped {
                file: "f".into(),
                why: "not JSON: EOF while parsing an object at line 1 column 1".into(),
            },
        ),
    ];
    for (what, text, want) in cases {
        assert_eq!(parse_conf("f", text.as_bytes()), want, "{what}");
    }
}

fn evidence(confs: Vec<ConfFile>, ipkeep: Binary, host_local: Binary, kept: bool) -> Evidence {
    Evidence {
        conf_dir: "/etc/cni/net.d".into(),
        bin_dir: "/opt/cni/bin".into(),
        confs,
        bin: BinDir {
            ipkeep,
            host_local,
            original_kept: kept,
        },
    }
}

#[test]
fn each_rule_decides_its_case() {
    use Binary::{Ipkeep, Missing, Other};
    let flannel = parse_conf("10-flannel.conflist", KUBE_FLANNEL.as_bytes());
    let flannel_switched = parse_conf("10-flannel.conflist", KUBE_FLANNEL_SWITCHED.as_bytes());
    let bridge = parse_conf("10-cbr0.conflist", BRIDGE.as_bytes());
    let file = || "10-flannel.conflist".to_owned();
    let cases: Vec<(&str, Evidence, &str, Verdict)> = vec![
        (
            "kube-flannel unedited, host-local replaced by ipkeep",
            evidence(vec![flannel.clone()], Ipkeep, Ipkeep, true),
            "cbr0",
            Verdict::InCharge,
        ),
        (
            "kube-flannel switched to ipkeep",
            evidence(vec![flannel_switched.clone()], Ipkeep, Other, false),
            "cbr0",
            Verdict::InCharge,
        ),
        (
            "kube-flannel unedited, host-local never replaced (the issue's new user)",
            evidence(vec![flannel.clone()], Ipkeep, Other, false),
            "cbr0",
            Verdict::NotInCharge(Reason::HostLocalNotReplaced { file: file() }),
        ),
        (
            "host-local replaced, then overwritten by an upgrade",
            evidence(vec![flannel.clone()], Ipkeep, Other, true),
            "cbr0",
            Verdict::NotInCharge(Reason::HostLocalReverted { file: file() }),
        ),
        (
            "host-local replaced, then removed",
            evidence(vec![flannel.clone()], Ipkeep, Missing, true),
            "cbr0",
            Verdict::NotInCharge(Reason::HostLocalReverted { file: file() }),
        ),
        (
            "switched, but the plugin is not in the runtime's bin directory (cni.binDir wrong)",
            evidence(vec![flannel_switched.clone()], Missing, Other, false),
            "cbr0",
            Verdict::NotInCharge(Reason::PluginMissing { file: file() }),
        ),
        (
            "agent.networks names a network the node does not have",
            evidence(
                vec![
                    bridge.clone(),
                    ConfFile::Skipped {
                        file: "99-x.conf".into(),
                        why: "not JSON".into(),
                    },
                ],
                Ipkeep,
                Ipkeep,
                true,
            ),
            "mynet",
            Verdict::NotInCharge(Reason::NetworkNotConfigured {
                found: vec!["cbr0".into()],
                skipped: vec!["99-x.conf: not JSON".into()],
            }),
        ),
        (
            "no configuration at all (the network plugin not installed yet, or cni.confDir wrong)",
            evidence(vec![], Ipkeep, Ipkeep, true),
            "cbr0",
            Verdict::NotInCharge(Reason::NoConfiguration { skipped: vec![] }),
        ),
        (
            "the IPAM's dataDir is not the agent's",
            evidence(
                vec![net("a.conf", "cbr0", Some(("ipkeep", "/run/cni/ipam")))],
                Ipkeep,
                Other,
                false,
            ),
            "cbr0",
            Verdict::NotInCharge(Reason::DataDirMismatch {
                file: "a.conf".into(),
                conf: "/run/cni/ipam".into(),
                agent: DATA.into(),
            }),
        ),
        (
            "the same directory written another way is the same",
            evidence(
                vec![net(
                    "a.conf",
                    "cbr0",
                    Some(("ipkeep", "/var/lib/cni//networks/")),
                )],
                Ipkeep,
                Other,
                false,
            ),
            "cbr0",
            Verdict::InCharge,
        ),
        (
            "another IPAM",
            evidence(
                vec![net("a.conf", "cbr0", Some(("dhcp", DATA)))],
                Ipkeep,
                Ipkeep,
                true,
            ),
            "cbr0",
            Verdict::NotInCharge(Reason::OtherIpam {
                file: "a.conf".into(),
                type_: "dhcp".into(),
            }),
        ),
        (
            "no IPAM",
            evidence(vec![net("a.conf", "cbr0", None)], Ipkeep, Ipkeep, true),
            "cbr0",
            Verdict::NotInCharge(Reason::NoIpam {
                file: "a.conf".into(),
            }),
        ),
        (
            "two files name the network: the first in file-name order counts",
            evidence(
                vec![
                    net("10-a.conf", "cbr0", Some(("host-local", DATA))),
                    net("20-b.conf", "cbr0", Some(("ipkeep", DATA))),
                ],
                Ipkeep,
                Other,
                false,
            ),
            "cbr0",
            Verdict::NotInCharge(Reason::HostLocalNotReplaced {
                file: "10-a.conf".into(),
            }),
        ),
    ];
    for (what, e, network, want) in cases {
        let networks = vec![network.to_owned()];
        let got = decide(&networks, DATA, &e);
        assert_eq!(got, vec![(network, want)], "{what}");
    }
}

#[test]
fn each_reason_says_the_network_and_a_fix() {
    let e = evidence(vec![], Binary::Ipkeep, Binary::Other, false);
    let reasons = [
        Reason::NoConfiguration { skipped: vec![] },
        Reason::NetworkNotConfigured {
            found: vec!["cbr0".into()],
            skipped: vec![],
        },
        Reason::NoIpam { file: "f".into() },
        Reason::DataDirMismatch {
            file: "f".into(),
            conf: "/a".into(),
            agent: "/b".into(),
        },
        Reason::PluginMissing { file: "f".into() },
        Reason::HostLocalNotReplaced { file: "f".into() },
        Reason::HostLocalReverted { file: "f".into() },
        Reason::OtherIpam {
            file: "f".into(),
            type_: "dhcp".into(),
        },
        Reason::DirectoriesUnknown {
            why: "node n1: no containerd or CRI-O configuration found".into(),
        },
    ];
    let mut labels = Vec::new();
    for reason in &reasons {
        let text = Explained {
            network: "mynet",
            reason,
            evidence: &e,
        }
        .to_string();
        assert!(
            text.starts_with("ipkeep is not in charge of network mynet: "),
            "{text}"
        );
        labels.push(reason.label());
    }
    assert_eq!(labels, Reason::LABELS, "one label per reason, in order");
}

#[test]
fn unknown_directories_make_every_network_not_in_charge_naming_the_node_and_the_values() {
    let networks = vec!["cbr0".to_owned(), "mynet".to_owned()];
    let why = "node n1: no containerd or CRI-O configuration found (...): set the chart values cni.binDir and cni.confDir";
    let verdicts = undecided(&networks, why);
    assert_eq!(verdicts.len(), 2);
    for ((network, verdict), want) in verdicts.iter().zip(["cbr0", "mynet"]) {
        assert_eq!(*network, want);
        let Verdict::NotInCharge(reason) = verdict else {
            panic!("{verdict:?}")
        };
        assert_eq!(reason.label(), "CNIDirectoriesUnknown");
        let e = Evidence {
            conf_dir: String::new(),
            bin_dir: String::new(),
            confs: vec![],
            bin: BinDir {
                ipkeep: Binary::Missing,
                host_local: Binary::Missing,
                original_kept: false,
            },
        };
        assert_eq!(
            Explained {
                network,
                reason,
                evidence: &e
            }
            .to_string(),
            format!("ipkeep is not in charge of network {network}: {why}")
        );
    }
}

/// A conflist with a typo, as an admin's hand edit leaves it: the verdict names the file and what
/// is wrong with it, and says to fix it (not to change a chart value).
#[test]
fn a_conflist_that_cannot_be_parsed_is_named_with_the_fix() {
    let typo = parse_conf(
        "10-flannel.conflist",
        br#"{"name": "cbr0", "plugins": [{"type": "flannel",}]}"#,
    );
    let ConfFile::Skipped { why, .. } = &typo else {
        panic!("{typo:?}")
    };
    assert!(why.starts_with("not JSON: "), "{why}");
    let cases = [
        (
            "the only file",
            vec![typo.clone()],
            "/etc/cni/net.d holds no CNI network configuration that can be read (not read: 10-flannel.conflist: not JSON: ",
            "); fix that file, the container runtime reads it too",
        ),
        (
            "beside another network's",
            vec![
                typo.clone(),
                net("20-other.conflist", "other", Some(("host-local", DATA))),
            ],
            "no CNI configuration in /etc/cni/net.d names it (found: other; not read: 10-flannel.conflist: not JSON: ",
            "); if the network is configured in a file not read, fix that file, else set the chart's agent.networks to the network the pods use",
        ),
    ];
    for (what, confs, starts, ends) in cases {
        let e = evidence(confs, Binary::Ipkeep, Binary::Ipkeep, true);
        let networks = vec!["cbr0".to_owned()];
        let verdicts = decide(&networks, DATA, &e);
        let Verdict::NotInCharge(reason) = &verdicts[0].1 else {
            panic!("{what}: {verdicts:?}")
        };
        let text = Explained {
            network: "cbr0",
            reason,
            evidence: &e,
        }
        .to_string();
        let prefix = format!("ipkeep is not in charge of network cbr0: {starts}");
        assert!(
            text.starts_with(&prefix) && text.ends_with(ends),
            "{what}: {text}"
        );
    }
}
