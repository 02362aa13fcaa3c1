//! The differential cases: each is a sequence of CNI calls run against a fresh scratch directory,
//! derived from `host-local-spec.md` (section numbers in the comments). Placeholders:
//! `@SCRATCH@` is the case's scratch directory, `@DATADIR@` is `@SCRATCH@/data`; both are replaced
//! in stdin, in every environment value and in seeded symlink targets.

use crate::common::CniCall;

/// One scenario: steps run in order in one fresh scratch directory per binary.
#[derive(Debug)]
pub struct Case {
    /// Unique, stable name (the deliberate-differences table refers to it).
    pub name: &'static str,
    /// The calls, in order.
    pub steps: Vec<Step>,
}

/// One CNI invocation plus the files to plant in the scratch directory just before it.
#[derive(Clone, Debug)]
pub struct Step {
    /// The invocation with placeholders not yet replaced.
    pub call: CniCall,
    /// Entries created (relative to the scratch directory) before the call runs.
    pub seeds: Vec<Seed>,
    /// Run by host-local on both sides: ipkeep must then pick up the state host-local left,
    /// as on a node switching plugins (contract 3).
    pub by_host_local: bool,
    /// Stdin is padded with spaces to exactly this many bytes after the placeholders are
    /// replaced (the scratch path's length differs between the two sides).
    pub pad_stdin_to: Option<usize>,
}

/// A file-system entry planted before a step.
#[derive(Clone, Debug)]
pub enum Seed {
    /// A regular file with this content, mode 0644.
    File {
        path: &'static str,
        content: Vec<u8>,
    },
    /// A directory (and its parents), mode 0755.
    Dir { path: &'static str },
    /// A symbolic link to `target` (placeholders replaced).
    Symlink {
        path: &'static str,
        target: &'static str,
    },
}

/// The `CNI_*` variables a step can unset or override.
#[derive(Clone, Copy, Debug)]
pub enum Var {
    Command,
    ContainerId,
    Netns,
    Ifname,
    Args,
    Path,
}

impl Step {
    /// A call with every variable a runtime sets for `command`.
    fn new(command: &str, id: &str, stdin: &str) -> Self {
        let mut call = CniCall::new(command, id, stdin);
        call.netns = Some("/var/run/netns/diff-test".to_owned());
        call.path = Some("/opt/cni/bin".to_owned());
        Self {
            call,
            seeds: Vec::new(),
            by_host_local: false,
            pad_stdin_to: None,
        }
    }

    fn by_host_local(mut self) -> Self {
        self.by_host_local = true;
        self
    }

    fn ifname(mut self, ifname: &str) -> Self {
        self.call = self.call.ifname(ifname);
        self
    }

    fn args(mut self, args: &str) -> Self {
        self.call = self.call.args(args);
        self
    }

    /// Sets (`Some`) or unsets (`None`) one variable.
    fn var(mut self, var: Var, value: Option<&str>) -> Self {
        let value = value.map(str::to_owned);
        let slot = match var {
            Var::Command => &mut self.call.command,
            Var::ContainerId => &mut self.call.container_id,
            Var::Netns => &mut self.call.netns,
            Var::Ifname => &mut self.call.ifname,
            Var::Args => &mut self.call.args,
            Var::Path => &mut self.call.path,
        };
        *slot = value;
        self
    }

    fn pad_stdin_to(mut self, len: usize) -> Self {
        self.pad_stdin_to = Some(len);
        self
    }

    fn stdin_bytes(mut self, stdin: &[u8]) -> Self {
        self.call.stdin = stdin.to_vec();
        self
    }

    fn file(mut self, path: &'static str, content: impl Into<Vec<u8>>) -> Self {
        self.seeds.push(Seed::File {
            path,
            content: content.into(),
        });
        self
    }

    fn dir(mut self, path: &'static str) -> Self {
        self.seeds.push(Seed::Dir { path });
        self
    }

    fn symlink(mut self, path: &'static str, target: &'static str) -> Self {
        self.seeds.push(Seed::Symlink { path, target });
        self
    }

    /// The `cniVersion` of the step's configuration, if stdin is a JSON object holding a string one.
    pub fn cni_version(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.call.stdin).ok()?;
        v.get("cniVersion")?.as_str().map(str::to_owned)
    }
}

/// The most stdin ipkeep reads (docs/plugin.md, deliberate difference 6).
pub const STDIN_LIMIT: usize = 1 << 20;

/// A valid container ID (CNI's `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`) of exactly `len` bytes.
pub fn container_id_of(len: usize) -> String {
    std::iter::once('c')
        .chain("0123456789abcdef-_.".chars().cycle())
        .take(len)
        .collect()
}

/// The longest container ID whose allocation file (`<id>\r\neth0`) stays within ipkeep's
/// 4 KiB limit for files in the data directory.
pub const LONGEST_ID: usize = 4096 - "\r\neth0".len();

fn add(id: &str, stdin: &str) -> Step {
    Step::new("ADD", id, stdin)
}

fn del(id: &str, stdin: &str) -> Step {
    Step::new("DEL", id, stdin)
}

fn check(id: &str, stdin: &str) -> Step {
    Step::new("CHECK", id, stdin)
}

fn cmd(command: &str, id: &str, stdin: &str) -> Step {
    Step::new(command, id, stdin)
}

/// A network config named `net1` with `top` spliced into the top level and `ipam` into the ipam
/// object (after `type` and `dataDir`). `version: None` leaves `cniVersion` out.
fn net_with(version: Option<&str>, top: &str, ipam: &str) -> String {
    let version = version
        .map(|v| format!(r#""cniVersion":"{v}","#))
        .unwrap_or_default();
    let top = if top.is_empty() {
        String::new()
    } else {
        format!("{top},")
    };
    let ipam = if ipam.is_empty() {
        String::new()
    } else {
        format!(",{ipam}")
    };
    format!(
        r#"{{{version}"name":"net1","type":"bridge",{top}"ipam":{{"type":"host-local","dataDir":"@DATADIR@"{ipam}}}}}"#
    )
}

fn net(version: &str, ipam: &str) -> String {
    net_with(Some(version), "", ipam)
}

/// The legacy single range `10.1.0.0/24` at `version`.
fn v4(version: &str) -> String {
    net(version, r#""subnet":"10.1.0.0/24""#)
}

fn subnet(version: &str, cidr: &str) -> String {
    net(version, &format!(r#""subnet":"{cidr}""#))
}

fn ranges(version: &str, sets: &str) -> String {
    net(version, &format!(r#""ranges":{sets}"#))
}

/// Dual stack: set 0 is `10.1.0.0/24`, set 1 is `fd00:1::/64`.
const DUAL_SETS: &str = r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00:1::/64"}]]"#;

/// Dual stack with routes of both families and a resolv.conf (spec 2.2, `fmt-dual-100`).
fn dual_full(version: Option<&str>) -> String {
    net_with(
        version,
        "",
        &format!(
            r#""ranges":{DUAL_SETS},"routes":[{{"dst":"0.0.0.0/0"}},{{"dst":"192.168.0.0/16","gw":"10.1.0.254","mtu":1400}},{{"dst":"::/0","gw":"fd00:1::1"}}],"resolvConf":"@SCRATCH@/resolv.conf""#
        ),
    )
}

const RESOLV_CONF: &[u8] = b"# generated for the differential suite\n; another comment\n\nnameserver 192.0.2.3\nnameserver 2001:db8::53 ignored-extra\ndomain first.example\ndomain last.example\nsearch a.example b.example\nsearch c.example\noptions ndots:2 timeout:1\nsortlist 10.0.0.0/8\nnameserver\n   nameserver   192.0.2.4   \n";

/// Every case of the suite, in a stable order.
pub fn all() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut c = |name: &'static str, steps: Vec<Step>| cases.push(Case { name, steps });

    // ── 1. Process contract: environment (spec 1.1) ─────────────────────────────────────────
    let base = v4("1.0.0");
    c(
        "env-no-command",
        vec![add("c1", &base).var(Var::Command, None)],
    );
    c(
        "env-empty-command",
        vec![add("c1", &base).var(Var::Command, Some(""))],
    );
    c(
        "env-missing-containerid",
        vec![add("c1", &base).var(Var::ContainerId, None)],
    );
    c(
        "env-missing-netns",
        vec![add("c1", &base).var(Var::Netns, None)],
    );
    c(
        "env-missing-ifname",
        vec![add("c1", &base).var(Var::Ifname, None)],
    );
    c(
        "env-missing-path",
        vec![add("c1", &base).var(Var::Path, None)],
    );
    c(
        "env-missing-several",
        vec![
            add("c1", &base)
                .var(Var::ContainerId, None)
                .var(Var::Netns, None)
                .var(Var::Ifname, None)
                .var(Var::Path, None),
        ],
    );
    c(
        "env-empty-containerid",
        vec![add("c1", &base).var(Var::ContainerId, Some(""))],
    );
    c(
        "env-del-missing-path",
        vec![del("c1", &base).var(Var::Path, None)],
    );
    c(
        "env-del-no-netns",
        vec![add("c1", &base), del("c1", &base).var(Var::Netns, None)],
    );
    c(
        "env-check-no-netns",
        vec![add("c1", &base), check("c1", &base).var(Var::Netns, None)],
    );
    c(
        "env-relative-netns",
        vec![add("c1", &base).var(Var::Netns, Some("relative/nonexistent"))],
    );
    c(
        "env-no-args-var-vs-empty",
        vec![add("c1", &base).var(Var::Args, Some("")), add("c2", &base)],
    );
    c("env-bad-containerid-space", vec![add("c 1", &base)]);
    c("env-bad-containerid-dash", vec![add("-c1", &base)]);
    c("env-bad-containerid-dotdot", vec![add("../c1", &base)]);
    c(
        "env-containerid-dots-ok",
        vec![add("c1.a_b-C9", &base), check("c1.a_b-C9", &base)],
    );
    c(
        "env-ifname-15-ok",
        vec![add("c1", &base).ifname("abcdefghijklmno")],
    );
    c(
        "env-ifname-too-long",
        vec![add("c1", &base).ifname("abcdefghijklmnop")],
    );
    c("env-ifname-empty", vec![add("c1", &base).ifname("")]);
    c("env-ifname-dot", vec![add("c1", &base).ifname(".")]);
    c("env-ifname-dotdot", vec![add("c1", &base).ifname("..")]);
    c("env-ifname-slash", vec![add("c1", &base).ifname("a/b")]);
    c("env-ifname-colon", vec![add("c1", &base).ifname("eth0:1")]);
    c("env-ifname-space", vec![add("c1", &base).ifname("eth 0")]);
    c("env-unknown-command", vec![cmd("FOO", "c1", &base)]);
    c("env-lowercase-command", vec![cmd("add", "c1", &base)]);
    c(
        "env-unknown-command-no-id",
        vec![cmd("FOO", "c1", &base).var(Var::ContainerId, None)],
    );
    c(
        "env-unknown-command-no-ifname",
        vec![cmd("FOO", "c1", &base).var(Var::Ifname, None)],
    );
    c("env-empty-stdin", vec![add("c1", "")]);
    c("env-bad-json", vec![add("c1", "{not json")]);
    c("env-stdin-array", vec![add("c1", "[1,2]")]);
    c(
        "env-name-not-string",
        vec![add("c1", r#"{"cniVersion":"1.0.0","name":5,"ipam":{}}"#)],
    );
    c(
        "env-missing-name",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","ipam":{"subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "env-empty-name",
        vec![add("c1", r#"{"cniVersion":"1.0.0","name":"","ipam":{}}"#)],
    );
    c(
        "env-bad-name",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"-net","ipam":{}}"#,
        )],
    );
    c(
        "env-bad-name-slash",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"a/b","ipam":{}}"#,
        )],
    );
    c(
        "env-bad-name-and-id",
        vec![add(
            "c 1",
            r#"{"cniVersion":"1.0.0","name":"n t","ipam":{}}"#,
        )],
    );
    c(
        "env-version-not-string",
        vec![add(
            "c1",
            r#"{"cniVersion":1,"name":"net1","ipam":{"subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "env-html-escaping",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"ranges":[[{"gateway":"10.1.0.1"}]]}}"#,
        )],
    );
    c("env-version-cmd", vec![cmd("VERSION", "c1", &base)]);
    c(
        "env-version-cmd-bad-stdin",
        vec![cmd("VERSION", "c1", "{not json").var(Var::ContainerId, None)],
    );

    // ── 2. cniVersion (spec 1.1 step 5–6, 6) ────────────────────────────────────────────────
    for (name, version) in [
        ("ver-add-010", "0.1.0"),
        ("ver-add-020", "0.2.0"),
        ("ver-add-030", "0.3.0"),
        ("ver-add-031", "0.3.1"),
        ("ver-add-040", "0.4.0"),
        ("ver-add-100", "1.0.0"),
        ("ver-add-empty", ""),
    ] {
        c(name, vec![add("c1", &v4(version)), del("c1", &v4(version))]);
    }
    c(
        "ver-add-missing",
        vec![add("c1", &net_with(None, "", r#""subnet":"10.1.0.0/24""#))],
    );
    for (name, version) in [
        ("ver-dual-010", Some("0.1.0")),
        ("ver-dual-020", Some("0.2.0")),
        ("ver-dual-030", Some("0.3.0")),
        ("ver-dual-031", Some("0.3.1")),
        ("ver-dual-040", Some("0.4.0")),
        ("ver-dual-100", Some("1.0.0")),
        ("ver-dual-missing", None),
    ] {
        c(
            name,
            vec![add("c1", &dual_full(version)).file("resolv.conf", RESOLV_CONF)],
        );
    }
    c(
        "ver-add-110",
        vec![add("c1", &v4("1.1.0")), check("c1", &v4("1.1.0"))],
    );
    c(
        "ver-del-110",
        vec![add("c1", &base), del("c1", &v4("1.1.0"))],
    );
    c(
        "ver-check-110",
        vec![add("c1", &base), check("c1", &v4("1.1.0"))],
    );
    c("ver-add-050", vec![add("c1", &v4("0.5.0"))]);
    c("ver-add-200", vec![add("c1", &v4("2.0.0"))]);
    c("ver-add-abc", vec![add("c1", &v4("abc"))]);
    c("ver-add-10", vec![add("c1", &v4("1.0"))]);
    c("ver-del-050", vec![del("c1", &v4("0.5.0"))]);
    c(
        "ver-check-031",
        vec![add("c1", &base), check("c1", &v4("0.3.1"))],
    );
    c(
        "ver-check-020",
        vec![add("c1", &base), check("c1", &v4("0.2.0"))],
    );
    c(
        "ver-check-missing",
        vec![
            add("c1", &base),
            check("c1", &net_with(None, "", r#""subnet":"10.1.0.0/24""#)),
        ],
    );
    c(
        "ver-check-040",
        vec![add("c1", &base), check("c1", &v4("0.4.0"))],
    );
    c("ver-check-abc", vec![check("c1", &v4("abc"))]);
    c(
        "ver-check-too-many-parts",
        vec![check("c1", &v4("1.2.3.4"))],
    );
    c("ver-check-200", vec![check("c1", &v4("2.0.0"))]);

    // ── 3. Configuration parsing and validation (spec 2, 2.1) ───────────────────────────────
    c(
        "cfg-no-ipam",
        vec![add("c1", r#"{"cniVersion":"1.0.0","name":"net1"}"#)],
    );
    c(
        "cfg-ipam-null",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":null}"#,
        )],
    );
    c(
        "cfg-ipam-wrongtype",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":"x"}"#,
        )],
    );
    c("cfg-no-ranges", vec![add("c1", &net("1.0.0", ""))]);
    c("cfg-ranges-null", vec![add("c1", &ranges("1.0.0", "null"))]);
    c("cfg-ranges-empty", vec![add("c1", &ranges("1.0.0", "[]"))]);
    c(
        "cfg-empty-rangeset",
        vec![add("c1", &ranges("1.0.0", "[[]]"))],
    );
    c(
        "cfg-second-rangeset-empty",
        vec![add(
            "c1",
            &ranges("1.0.0", r#"[[{"subnet":"10.1.0.0/24"}],[]]"#),
        )],
    );
    c(
        "cfg-range-nosubnet",
        vec![add("c1", &ranges("1.0.0", "[[{}]]"))],
    );
    c(
        "cfg-ranges-wrongtype",
        vec![add("c1", &ranges("1.0.0", r#"{"subnet":"10.1.0.0/24"}"#))],
    );
    c(
        "cfg-subnet-wrongtype",
        vec![add("c1", &net("1.0.0", r#""subnet":24"#))],
    );
    c(
        "cfg-bad-subnet",
        vec![add("c1", &subnet("1.0.0", "10.1.0.0"))],
    );
    c(
        "cfg-bad-prefix",
        vec![add("c1", &subnet("1.0.0", "10.1.0.0/33"))],
    );
    c(
        "cfg-subnet-empty-string",
        vec![add("c1", &ranges("1.0.0", r#"[[{"subnet":""}]]"#))],
    );
    c(
        "cfg-host-bits",
        vec![add("c1", &subnet("1.0.0", "10.1.0.7/24"))],
    );
    c(
        "cfg-host-bits-v6",
        vec![add("c1", &subnet("1.0.0", "2001:db8:24:19ff::/63"))],
    );
    c(
        "cfg-mapped-v6",
        vec![add("c1", &subnet("1.0.0", "::ffff:10.1.0.0/120"))],
    );
    c(
        "cfg-mixed-family",
        vec![add(
            "c1",
            &ranges(
                "1.0.0",
                r#"[[{"subnet":"10.1.0.0/24"},{"subnet":"fd00::/64"}]]"#,
            ),
        )],
    );
    c(
        "cfg-overlap-in-set",
        vec![add(
            "c1",
            &ranges(
                "1.0.0",
                r#"[[{"subnet":"10.1.0.0/22"},{"subnet":"10.1.2.0/24"}]]"#,
            ),
        )],
    );
    c(
        "cfg-overlap-sets",
        vec![add(
            "c1",
            &ranges(
                "1.0.0",
                r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}],[{"subnet":"10.1.0.0/25"}]]"#,
            ),
        )],
    );
    c(
        "cfg-start-gt-end",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"192.0.2.0/24","rangeStart":"192.0.2.50","rangeEnd":"192.0.2.40""#,
            ),
        )],
    );
    c(
        "cfg-rangestart-outside",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","rangeStart":"10.2.0.5""#),
        )],
    );
    c(
        "cfg-rangeend-outside",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","rangeEnd":"10.1.1.0""#),
        )],
    );
    c(
        "cfg-rangestart-v6-in-v4",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","rangeStart":"fd00::5""#),
        )],
    );
    c(
        "cfg-bad-rangestart",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","rangeStart":"10.1.0.x""#),
        )],
    );
    c(
        "cfg-bad-gateway",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","gateway":"nope""#),
        )],
    );
    c(
        "cfg-gateway-outside",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","gateway":"192.168.9.9""#),
        )],
    );
    c(
        "cfg-empty-strings-unset",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","rangeStart":"","rangeEnd":"","gateway":"""#,
            ),
        )],
    );
    c(
        "cfg-case-insensitive-keys",
        vec![add(
            "c1",
            r#"{"CNIVERSION":"0.3.1","Name":"net1","IPAM":{"TYPE":"host-local","DataDir":"@DATADIR@","RANGES":[[{"Subnet":"10.1.0.0/24","RangeStart":"10.1.0.40","GATEWAY":"10.1.0.254"}]]}}"#,
        )],
    );
    c(
        "cfg-duplicate-keys",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"dataDir":"@DATADIR@","subnet":"10.9.0.0/24","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "cfg-extra-unknown-fields",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","capabilities":{"ips":true},"prevResult":{"x":1},"foo":[1,{"a":null}],"ipam":{"type":"whatever","dataDir":"@DATADIR@","bar":true,"ranges":[[{"subnet":"10.1.0.0/24","baz":"q"}]]}}"#,
        )],
    );
    c(
        "cfg-name-in-ipam-ignored",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"name":"other","dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "cfg-legacy-nosubnet",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""rangeStart":"10.9.0.5","gateway":"10.9.0.1","ranges":[[{"subnet":"10.1.0.0/24"}]]"#,
            ),
        )],
    );
    c(
        "cfg-legacy-nosubnet-alone",
        vec![add(
            "c1",
            &net("1.0.0", r#""rangeStart":"10.9.0.5","gateway":"10.9.0.1""#),
        )],
    );
    c(
        "cfg-legacy-and-ranges",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","ranges":[[{"subnet":"fd00:1::/64"}]]"#,
            ),
        )],
    );
    c(
        "cfg-runtime-ipranges",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""runtimeConfig":{"ipRanges":[[{"subnet":"12.1.3.0/24"}]]}"#,
                r#""subnet":"10.1.2.0/24","ranges":[[{"subnet":"fd00:1::/64"}]]"#,
            ),
        )],
    );
    c(
        "cfg-runtime-ipranges-lastip-index",
        vec![
            add("c1", &subnet("1.0.0", "10.1.2.0/24")),
            add(
                "c2",
                &net_with(
                    Some("1.0.0"),
                    r#""runtimeConfig":{"ipRanges":[[{"subnet":"fd00:1::/64"}]]}"#,
                    r#""subnet":"10.1.2.0/24""#,
                ),
            ),
        ],
    );
    c(
        "cfg-two-v4-sets-020",
        vec![add(
            "c1",
            &ranges(
                "0.2.0",
                r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
            ),
        )],
    );
    c(
        "cfg-two-v4-sets-noversion",
        vec![add(
            "c1",
            &net_with(
                None,
                "",
                r#""ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
            ),
        )],
    );
    c(
        "cfg-two-v4-sets-031",
        vec![add(
            "c1",
            &ranges(
                "0.3.1",
                r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
            ),
        )],
    );
    c(
        "cfg-routes-hostbits",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","routes":[{"dst":"10.9.9.9/8"},{"dst":"fd00::/8","gw":"fd00::1","priority":5}]"#,
            ),
        )],
    );
    c(
        "cfg-routes-empty",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","routes":[]"#),
        )],
    );
    c(
        "cfg-routes-bad-dst",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","routes":[{"dst":"10.0.0.0"}]"#,
            ),
        )],
    );
    c(
        "cfg-routes-no-dst",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","routes":[{"gw":"10.1.0.1"}]"#,
            ),
        )],
    );
    c(
        "cfg-rangeend-network-addr",
        vec![add(
            "c1",
            &net("1.0.0", r#""subnet":"10.1.0.0/24","rangeEnd":"10.1.0.0""#),
        )],
    );
    c(
        "cfg-routes-bad-gw",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","routes":[{"dst":"10.0.0.0/8","gw":"x"}]"#,
            ),
        )],
    );
    c(
        "cfg-routes-020-v6-dropped",
        vec![add(
            "c1",
            &net(
                "0.2.0",
                r#""subnet":"10.1.0.0/24","routes":[{"dst":"fd00::/8"},{"dst":"10.0.0.0/8","gw":"10.1.0.1"}]"#,
            ),
        )],
    );
    c(
        "cfg-resolvconf",
        vec![
            add(
                "c1",
                &net(
                    "1.0.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/resolv.conf""#,
                ),
            )
            .file("resolv.conf", RESOLV_CONF),
        ],
    );
    c(
        "cfg-resolvconf-empty-file",
        vec![
            add(
                "c1",
                &net(
                    "0.4.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/resolv.conf""#,
                ),
            )
            .file("resolv.conf", b""),
        ],
    );
    c(
        "cfg-resolvconf-only-search",
        vec![
            add(
                "c1",
                &net(
                    "0.2.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/resolv.conf""#,
                ),
            )
            .file("resolv.conf", b"search x.example\n#nameserver 1.1.1.1\n"),
        ],
    );
    c(
        "cfg-resolvconf-long-line",
        vec![
            add(
                "c1",
                &net(
                    "1.0.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/resolv.conf""#,
                ),
            )
            .file(
                "resolv.conf",
                [
                    b"nameserver 192.0.2.1\nsearch ".as_slice(),
                    &[b'a'; 70_000],
                    b"\n",
                ]
                .concat(),
            ),
        ],
    );
    c(
        "cfg-resolvconf-is-dir",
        vec![
            add(
                "c1",
                &net(
                    "1.0.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/resolv.conf""#,
                ),
            )
            .dir("resolv.conf"),
        ],
    );
    c(
        "cfg-resolvconf-missing",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/nonexistent""#,
            ),
        )],
    );
    c(
        "cfg-datadir-nested",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"dataDir":"@SCRATCH@/a/b/c","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "cfg-datadir-is-file",
        vec![add("c1", &base).file("data", b"not a directory")],
    );
    c(
        "cfg-network-name-chars",
        vec![
            add(
                "c1",
                r#"{"cniVersion":"1.0.0","name":"Net_1.a-b","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
            ),
            del(
                "c1",
                r#"{"cniVersion":"1.0.0","name":"Net_1.a-b","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
            ),
        ],
    );
    c(
        "cfg-v6-uppercase",
        vec![add("c1", &subnet("1.0.0", "FD00:ABCD::/64"))],
    );

    // ── 4. Subnet edges and defaults (spec 2.1 table) ───────────────────────────────────────
    c("net-31", vec![add("c1", &subnet("1.0.0", "10.1.0.0/31"))]);
    c(
        "net-31-hostbits",
        vec![add("c1", &subnet("1.0.0", "10.1.0.1/31"))],
    );
    c("net-32", vec![add("c1", &subnet("1.0.0", "10.1.0.5/32"))]);
    c("net-127", vec![add("c1", &subnet("1.0.0", "fd00::/127"))]);
    c("net-128", vec![add("c1", &subnet("1.0.0", "fd00::1/128"))]);
    // host-local prints an IPv4-mapped subnet's size in its IPv4 form (/31, /32).
    c(
        "net-mapped-127",
        vec![add("c1", &subnet("1.0.0", "::ffff:10.1.0.0/127"))],
    );
    c(
        "net-mapped-128",
        vec![add("c1", &subnet("1.0.0", "::ffff:10.1.0.1/128"))],
    );
    let n30 = subnet("1.0.0", "10.1.0.0/30");
    c(
        "net-30",
        vec![
            add("c1", &n30),
            add("c2", &n30),
            del("c1", &n30),
            add("c3", &n30),
        ],
    );
    let n29 = subnet("0.4.0", "10.1.0.0/29");
    c(
        "net-29",
        vec![
            add("c1", &n29),
            add("c2", &n29),
            add("c3", &n29),
            add("c4", &n29),
            add("c5", &n29),
            add("c6", &n29),
        ],
    );
    let gw3 = net("1.0.0", r#""subnet":"10.1.0.0/29","gateway":"10.1.0.3""#);
    c(
        "net-gw-not-first",
        vec![
            add("c1", &gw3),
            add("c2", &gw3),
            add("c3", &gw3),
            add("c4", &gw3),
            add("c5", &gw3),
            add("c6", &gw3),
        ],
    );
    let n126 = subnet("1.0.0", "fd00::/126");
    c(
        "net-126",
        vec![add("c1", &n126), add("c2", &n126), add("c3", &n126)],
    );
    let v6end = net("1.0.0", r#""subnet":"fd00::/120","rangeStart":"fd00::fe""#);
    c(
        "net-v6-end",
        vec![add("c1", &v6end), add("c2", &v6end), add("c3", &v6end)],
    );
    c(
        "net-v6-64",
        vec![
            add("c1", &subnet("1.0.0", "2001:db8:1::/64")),
            add("c2", &subnet("1.0.0", "2001:db8:1::/64")),
        ],
    );
    c(
        "net-v4-top",
        vec![
            add(
                "c1",
                &net(
                    "1.0.0",
                    r#""subnet":"255.255.255.0/24","rangeStart":"255.255.255.253""#,
                ),
            ),
            add(
                "c2",
                &net(
                    "1.0.0",
                    r#""subnet":"255.255.255.0/24","rangeStart":"255.255.255.253""#,
                ),
            ),
        ],
    );
    c(
        "net-v6-top",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120","rangeStart":"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff""#,
            ),
        )],
    );
    c("net-8", vec![add("c1", &subnet("1.0.0", "10.0.0.0/8"))]);
    c(
        "net-v6-carry",
        vec![
            add(
                "c1",
                &net("1.0.0", r#""subnet":"fd00::/64","rangeStart":"fd00::ffff""#),
            ),
            add(
                "c2",
                &net("1.0.0", r#""subnet":"fd00::/64","rangeStart":"fd00::ffff""#),
            ),
        ],
    );
    let start_net = net(
        "1.0.0",
        r#""subnet":"10.1.0.0/24","rangeStart":"10.1.0.0","rangeEnd":"10.1.0.255","gateway":"10.1.0.128""#,
    );
    c(
        "net-start-network-addr",
        vec![add("c1", &start_net), add("c2", &start_net)]
            .into_iter()
            .chain([add("c3", &start_net).file("data/net1/last_reserved_ip.0", b"10.1.0.254")])
            .chain([add("c4", &start_net)])
            .collect(),
    );
    let small = net(
        "1.0.0",
        r#""subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.12""#,
    );
    c(
        "net-start-end-cycle",
        vec![
            add("c1", &small),
            add("c2", &small),
            add("c3", &small),
            add("c4", &small),
            del("c2", &small),
            add("c5", &small),
        ],
    );

    // ── 5. Allocation and round robin (spec 3.1–3.3) ────────────────────────────────────────
    c(
        "alloc-round-robin",
        vec![add("c1", &base), del("c1", &base), add("c2", &base)],
    );
    c(
        "alloc-sequence",
        vec![
            add("c1", &base),
            add("c2", &base),
            add("c3", &base),
            del("c2", &base),
            add("c4", &base),
            del("c1", &base),
            del("c3", &base),
            add("c5", &base),
        ],
    );
    c(
        "alloc-wrap",
        vec![
            add("c1", &n29)
                .file("data/net1/last_reserved_ip.0", b"10.1.0.5")
                .file("data/net1/10.1.0.6", b"x\r\neth0"),
        ],
    );
    c(
        "alloc-last-only-free",
        vec![
            add("c9", &n29)
                .file("data/net1/last_reserved_ip.0", b"10.1.0.3")
                .file("data/net1/10.1.0.2", b"a\r\neth0")
                .file("data/net1/10.1.0.4", b"b\r\neth0")
                .file("data/net1/10.1.0.5", b"c\r\neth0")
                .file("data/net1/10.1.0.6", b"d\r\neth0"),
        ],
    );
    c(
        "alloc-lastip-newline",
        vec![add("c1", &base).file("data/net1/last_reserved_ip.0", b"10.1.0.5\n")],
    );
    c(
        "alloc-lastip-outside",
        vec![add("c1", &base).file("data/net1/last_reserved_ip.0", b"10.7.0.5")],
    );
    c(
        "alloc-lastip-garbage",
        vec![add("c1", &base).file("data/net1/last_reserved_ip.0", b"garbage")],
    );
    c(
        "alloc-lastip-at-end",
        vec![add("c1", &base).file("data/net1/last_reserved_ip.0", b"10.1.0.254")],
    );
    c(
        "alloc-lastip-v6-form",
        vec![add("c1", &n126).file("data/net1/last_reserved_ip.0", b"FD00:0::2")],
    );
    c(
        "alloc-garbage-files",
        vec![
            add("c1", &base)
                .file("data/net1/garbage", b"c9\r\neth0")
                .file("data/net1/10.1.0.2", b"someone else")
                .file("data/net1/10.1.0.3", b""),
            check("c1", &base),
            del("c1", &base),
        ],
    );
    c(
        "alloc-dir-named-like-ip",
        vec![add("c1", &base).dir("data/net1/10.1.0.2"), del("c1", &base)],
    );
    let multi = ranges(
        "1.0.0",
        r#"[[{"subnet":"10.1.0.0/30"},{"subnet":"10.2.0.0/30"}]]"#,
    );
    c(
        "alloc-multi-range-in-set",
        vec![
            add("c1", &multi),
            add("c2", &multi),
            add("c3", &multi),
            del("c1", &multi),
            add("c4", &multi),
        ],
    );
    c(
        "alloc-multi-range-lastip-end",
        vec![add("c1", &multi).file("data/net1/last_reserved_ip.0", b"10.1.0.2")],
    );
    let two30 = ranges(
        "1.0.0",
        r#"[[{"subnet":"10.1.0.0/30"}],[{"subnet":"10.2.0.0/29"}]]"#,
    );
    c(
        "alloc-full-two-sets",
        vec![add("c1", &two30), add("c2", &two30), check("c2", &two30)],
    );
    c(
        "alloc-full-single",
        vec![add("c1", &n30), add("c2", &n30), add("c3", &n30)],
    );
    c("alloc-add-twice", vec![add("c1", &base), add("c1", &base)]);
    c(
        "alloc-add-twice-legacy-file",
        vec![add("c1", &base).file("data/net1/10.1.0.9", b"c1")],
    );
    c(
        "alloc-same-id-other-ifname",
        vec![
            add("c1", &base),
            add("c1", &base).ifname("eth1"),
            del("c1", &base),
        ],
    );
    c(
        "alloc-two-networks",
        vec![
            add("c1", &base),
            add(
                "c1",
                r#"{"cniVersion":"1.0.0","name":"net2","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
            ),
            del("c1", &base),
        ],
    );
    let dual = ranges("1.0.0", DUAL_SETS);
    c(
        "alloc-dual",
        vec![
            add("c1", &dual),
            add("c2", &dual),
            check("c1", &dual),
            del("c1", &dual),
            del("c1", &dual),
            add("c3", &dual),
        ],
    );
    c(
        "alloc-dual-v6-first",
        vec![add(
            "c1",
            &ranges(
                "0.3.1",
                r#"[[{"subnet":"fd00:1::/64"}],[{"subnet":"10.1.0.0/24"}]]"#,
            ),
        )],
    );
    c(
        "alloc-duplicate-in-other-set",
        vec![
            add("c1", &base),
            add(
                "c1",
                &ranges(
                    "1.0.0",
                    r#"[[{"subnet":"10.2.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]"#,
                ),
            ),
        ],
    );
    c(
        "alloc-ipv6-file-names",
        vec![add(
            "c1",
            &net(
                "1.0.0",
                r#""subnet":"2001:db8:0:0:0:0:0:0/64","rangeStart":"2001:db8::a""#,
            ),
        )],
    );

    // ── 6. Requested IPs (spec 2 step 3, 3.1, 3.5) ──────────────────────────────────────────
    c(
        "req-cniargs",
        vec![add("c1", &base).args("IP=10.1.0.50"), add("c2", &base)],
    );
    c(
        "req-cniargs-prefix-ignored",
        vec![add("c1", &base).args("IP=10.1.0.50/16")],
    );
    c(
        "req-cniargs-bad-prefix",
        vec![add("c1", &base).args("IP=10.1.0.50/40")],
    );
    c(
        "req-cniargs-v6-compress",
        vec![add("c1", &subnet("1.0.0", "2001:db8::/64")).args("IP=2001:DB8:0:0:0:0:0:00AB")],
    );
    c("req-cniargs-bad-ip", vec![add("c1", &base).args("IP=foo")]);
    c(
        "req-cniargs-badpair",
        vec![add("c1", &base).args("IP=10.1.0.5;")],
    );
    c("req-cniargs-no-eq", vec![add("c1", &base).args("IP")]);
    c(
        "req-cniargs-value-with-eq",
        vec![add("c1", &base).args("IgnoreUnknown=1;X=a=b")],
    );
    c(
        "req-cniargs-lowercase",
        vec![add("c1", &base).args("ip=10.1.0.5")],
    );
    c(
        "req-cniargs-k8s",
        vec![add("c1", &base).args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod")],
    );
    c(
        "req-cniargs-k8s-ignore",
        vec![add("c1", &base).args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u-1",
        )],
    );
    c(
        "req-cniargs-k8s-ignore-last",
        vec![add("c1", &base).args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;IgnoreUnknown=true")],
    );
    c(
        "req-cniargs-ignore-true-upper",
        vec![add("c1", &base).args("IgnoreUnknown=TRUE;foo=bar;IP=10.1.0.9")],
    );
    c(
        "req-cniargs-ignore-0",
        vec![add("c1", &base).args("IgnoreUnknown=0;foo=bar")],
    );
    c(
        "req-cniargs-ignore-yes",
        vec![add("c1", &base).args("IgnoreUnknown=Yes;IP=10.1.0.9")],
    );
    c(
        "req-cniargs-dup-key",
        vec![add("c1", &base).args("IP=10.1.0.7;IP=10.1.0.8")],
    );
    c(
        "req-cniargs-space-in-value",
        vec![add("c1", &base).args("IP= 10.1.0.5")],
    );
    c(
        "req-cniargs-space-in-key",
        vec![add("c1", &base).args("IgnoreUnknown=1; IP=10.1.0.5")],
    );
    c(
        "req-v6-in-v4-range",
        vec![add("c1", &base).args("IP=fd00::5")],
    );
    c(
        "req-when-full",
        vec![add("c1", &n30), add("c2", &n30).args("IP=10.1.0.2")],
    );
    c("req-cniargs-emptyip", vec![add("c1", &base).args("IP=")]);
    c(
        "req-cniargs-commonargs",
        vec![add("c1", &base).args("CommonArgs=x")],
    );
    c(
        "req-args-cni-ips",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""args":{"cni":{"ips":["10.1.0.60"]}}"#,
                r#""subnet":"10.1.0.0/24""#,
            ),
        )],
    );
    c(
        "req-runtime-ips",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""runtimeConfig":{"ips":["10.1.0.70/24"]}"#,
                r#""subnet":"10.1.0.0/24""#,
            ),
        )],
    );
    c(
        "req-union",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""args":{"cni":{"ips":["fd00:1::50"]}},"runtimeConfig":{"ips":["10.2.0.9"]}"#,
                r#""ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00:1::/64"}],[{"subnet":"10.2.0.0/24"}]]"#,
            ),
        )
        .args("IP=10.1.0.50")],
    );
    c(
        "req-same-ip-three-sources",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""args":{"cni":{"ips":["10.1.0.50"]}},"runtimeConfig":{"ips":["::ffff:10.1.0.50"]}"#,
                r#""subnet":"10.1.0.0/24""#,
            ),
        )
        .args("IP=10.1.0.50")],
    );
    c(
        "req-in-use",
        vec![add("c1", &base), add("c2", &base).args("IP=10.1.0.2")],
    );
    c(
        "req-in-use-multi-range",
        vec![
            add("c1", &multi).args("IP=10.2.0.2"),
            add("c2", &multi).args("IP=10.2.0.2"),
        ],
    );
    c("req-gateway", vec![add("c1", &base).args("IP=10.1.0.1")]);
    c(
        "req-gateway-explicit",
        vec![
            add("c1", &gw3).args("IP=10.1.0.3"),
            add("c2", &gw3).args("IP=10.1.0.1"),
        ],
    );
    c(
        "req-outside",
        vec![add("c1", &base).args("IP=10.9.0.1"), add("c2", &base)],
    );
    c(
        "req-outside-rangeend",
        vec![add("c1", &small).args("IP=10.1.0.13")],
    );
    c(
        "req-network-addr",
        vec![add("c1", &base).args("IP=10.1.0.0")],
    );
    c(
        "req-broadcast",
        vec![add("c1", &base).args("IP=10.1.0.255")],
    );
    c(
        "req-same-container-twice",
        vec![
            add("c1", &base),
            add("c1", &base).args("IP=10.1.0.9"),
            check("c1", &base),
            del("c1", &base),
        ],
    );
    c(
        "req-failure-releases-prior",
        vec![
            add(
                "c1",
                &ranges(
                    "1.0.0",
                    r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
                ),
            ),
            add(
                "c1",
                &ranges(
                    "1.0.0",
                    r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
                ),
            )
            .args("IP=10.1.0.50"),
            check(
                "c1",
                &ranges(
                    "1.0.0",
                    r#"[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.2.0.0/24"}]]"#,
                ),
            ),
        ],
    );
    c(
        "req-failure-in-set0-keeps",
        vec![
            add("c1", &base),
            add("c1", &base).args("IP=10.1.0.2"),
            check("c1", &base),
        ],
    );
    c(
        "req-bad-json-ip",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""runtimeConfig":{"ips":["10.1.0.x"]}"#,
                r#""subnet":"10.1.0.0/24""#,
            ),
        )],
    );
    c(
        "req-empty-json-ip",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""args":{"cni":{"ips":[""]}}"#,
                r#""subnet":"10.1.0.0/24""#,
            ),
        )],
    );
    c(
        "req-v4mapped",
        vec![add("c1", &base).args("IP=::ffff:10.1.0.9")],
    );
    c(
        "req-v6",
        vec![add("c1", &n126).args("IP=fd00::3"), add("c2", &n126)],
    );
    c(
        "req-dual-both",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""runtimeConfig":{"ips":["10.1.0.33","fd00:1::33"]}"#,
                &format!(r#""ranges":{DUAL_SETS}"#),
            ),
        )],
    );
    c(
        "req-dual-one-leftover",
        vec![add(
            "c1",
            &net_with(
                Some("1.0.0"),
                r#""runtimeConfig":{"ips":["10.1.0.33","fd00:9::33"]}"#,
                &format!(r#""ranges":{DUAL_SETS}"#),
            ),
        )],
    );
    c(
        "req-second-set-only",
        vec![add("c1", &dual).args("IP=fd00:1::abc"), add("c2", &dual)],
    );
    c(
        "req-then-round-robin-020",
        vec![
            add("c1", &v4("0.2.0")).args("IP=10.1.0.254"),
            add("c2", &v4("0.2.0")),
        ],
    );

    // ── 7. DEL (spec 5.2, 4.4) ──────────────────────────────────────────────────────────────
    c("del-unknown", vec![del("c1", &base)]);
    c(
        "del-twice",
        vec![add("c1", &base), del("c1", &base), del("c1", &base)],
    );
    c(
        "del-keeps-lastip",
        vec![
            add("c1", &base),
            add("c2", &base),
            del("c2", &base),
            del("c1", &base),
        ],
    );
    c(
        "del-legacy",
        vec![del("c1", &base).file("data/net1/10.1.0.7", b" c1 \n")],
    );
    c(
        "del-legacy-any-ifname",
        vec![
            del("c1", &base)
                .ifname("eth7")
                .file("data/net1/10.1.0.7", b"c1"),
        ],
    );
    c(
        "del-lf-linebreak",
        vec![del("c1", &base).file("data/net1/10.1.0.7", b"c1\neth0")],
    );
    c(
        "del-legacy-mixed-one-set",
        vec![
            add("c1", &base),
            del("c1", &base).file("data/net1/10.1.0.7", b"c1"),
        ],
    );
    c(
        "del-legacy-mixed-two-sets",
        vec![
            add("c1", &dual),
            del("c1", &dual).file("data/net1/10.1.0.7", b"c1"),
        ],
    );
    c(
        "del-outside-range",
        vec![del("c1", &base).file("data/net1/10.9.0.9", b"c1\r\neth0")],
    );
    c(
        "del-other-ifname",
        vec![
            add("c1", &base),
            add("c1", &base).ifname("eth1"),
            del("c1", &base).ifname("eth1"),
            check("c1", &base),
        ],
    );
    c(
        "del-bad-config",
        vec![add("c1", &base), del("c1", &net("1.0.0", ""))],
    );
    c(
        "del-v010",
        vec![add("c1", &v4("0.1.0")), del("c1", &v4("0.1.0"))],
    );
    c(
        "del-other-network",
        vec![
            add("c1", &base),
            del(
                "c1",
                r#"{"cniVersion":"1.0.0","name":"net2","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
            ),
        ],
    );
    c(
        "del-ip-looking-id",
        vec![
            add("c1", &base),
            check("10.1.0.2", &base),
            del("10.1.0.2", &base),
        ],
    );
    c(
        "del-after-add-dual",
        vec![add("c1", &dual), del("c1", &dual), check("c1", &dual)],
    );
    c(
        "del-cniargs-k8s-no-ignore",
        vec![
            add("c1", &base),
            del("c1", &base).args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod"),
        ],
    );
    c(
        "del-cniargs-k8s-ignore",
        vec![
            add("c1", &base).args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod"),
            del("c1", &base).args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod"),
        ],
    );
    c(
        "del-cniargs-ip-ignored",
        vec![add("c1", &base), del("c1", &base).args("IP=10.1.0.9")],
    );
    c(
        "del-cniargs-bad-ip",
        vec![add("c1", &base), del("c1", &base).args("IP=nope")],
    );
    c(
        "del-resolvconf-missing",
        vec![
            add("c1", &base),
            del(
                "c1",
                &net(
                    "1.0.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/nonexistent""#,
                ),
            ),
        ],
    );
    c(
        "del-with-prevresult",
        vec![
            add("c1", &base),
            del(
                "c1",
                &net_with(
                    Some("1.0.0"),
                    r#""prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.99/24"}]}"#,
                    r#""subnet":"10.1.0.0/24""#,
                ),
            ),
        ],
    );
    c(
        "del-content-trailing-space",
        vec![del("c1", &base).file("data/net1/10.1.0.8", b"c1\r\neth0  \n")],
    );

    // ── 8. CHECK (spec 5.3) ─────────────────────────────────────────────────────────────────
    c("check-hit", vec![add("c1", &base), check("c1", &base)]);
    c("check-missing", vec![check("c1", &base)]);
    c(
        "check-after-del",
        vec![add("c1", &base), del("c1", &base), check("c1", &base)],
    );
    c(
        "check-ignores-range",
        vec![
            add("c1", &base),
            check("c1", &subnet("1.0.0", "10.7.0.0/24")),
        ],
    );
    c(
        "check-100-legacy",
        vec![
            check("c1", &base)
                .ifname("eth7")
                .file("data/net1/10.1.0.7", b"c1"),
        ],
    );
    c(
        "check-other-ifname-miss",
        vec![add("c1", &base), check("c1", &base).ifname("eth1")],
    );
    c(
        "check-bad-config",
        vec![add("c1", &base), check("c1", &ranges("1.0.0", "[[]]"))],
    );
    c(
        "check-cniargs-unknown",
        vec![add("c1", &base), check("c1", &base).args("FOO=bar")],
    );
    c(
        "check-resolvconf-missing",
        vec![
            add("c1", &base),
            check(
                "c1",
                &net(
                    "1.0.0",
                    r#""subnet":"10.1.0.0/24","resolvConf":"@SCRATCH@/nonexistent""#,
                ),
            ),
        ],
    );
    c(
        "check-040-dual",
        vec![
            add("c1", &ranges("0.4.0", DUAL_SETS)),
            check("c1", &ranges("0.4.0", DUAL_SETS)),
        ],
    );

    // ── 9. GC and STATUS (spec 5.5; ipkeep implements them for 1.1.0) ───────────────────────
    let gc110 = net_with(
        Some("1.1.0"),
        r#""cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]"#,
        r#""subnet":"10.1.0.0/24""#,
    );
    c(
        "gc-110",
        vec![add("c1", &base), add("c2", &base), cmd("GC", "c1", &gc110)],
    );
    c("gc-100", vec![add("c1", &base), cmd("GC", "c1", &base)]);
    c("status-110", vec![cmd("STATUS", "c1", &v4("1.1.0"))]);
    c(
        "gc-110-no-containerid",
        vec![cmd("GC", "c1", &gc110).var(Var::ContainerId, None)],
    );
    let full110 = subnet("1.1.0", "10.1.0.0/30");
    c(
        "status-110-full",
        vec![add("c1", &n30), cmd("STATUS", "c1", &full110)],
    );
    c("status-100", vec![cmd("STATUS", "c1", &base)]);

    // ── 10. Deliberate differences that need their own scenario ─────────────────────────────
    c(
        "alloc-foreign-files",
        vec![
            add("c1", &base).file("data/net1/sub/10.1.0.2", b"c1\r\neth0"),
            del("c1", &base),
        ],
    );
    c(
        "sym-ip-file",
        vec![
            check("c1", &base)
                .file("victim", b"c1\r\neth0")
                .symlink("data/net1/10.1.0.9", "../../victim"),
            del("c1", &base),
        ],
    );
    c(
        "sym-net-dir",
        vec![
            add("c1", &base)
                .dir("elsewhere")
                .dir("data")
                .symlink("data/net1", "../elsewhere"),
        ],
    );
    c(
        "sym-lastip",
        vec![
            add("c1", &base)
                .file("victim", b"10.1.0.5")
                .symlink("data/net1/last_reserved_ip.0", "../../victim"),
        ],
    );
    c(
        "sym-lock",
        vec![
            add("c1", &base)
                .dir("data/net1")
                .symlink("data/net1/lock", "../../victim-lock"),
        ],
    );
    c(
        "net-zero-v4",
        vec![add("c1", &subnet("1.0.0", "0.0.0.0/24"))],
    );
    c("net-zero-v6", vec![add("c1", &subnet("1.0.0", "::/120"))]);
    // Hostile input (docs/plugin.md difference 6): each limit exactly, where both agree, and one past it.
    c(
        "hostile-stdin-at-limit",
        vec![add("c1", &base).pad_stdin_to(STDIN_LIMIT)],
    );
    c(
        "hostile-stdin-over-limit",
        vec![add("c1", &base).pad_stdin_to(STDIN_LIMIT + 1)],
    );
    let longest = container_id_of(LONGEST_ID);
    c(
        "hostile-container-id-at-limit",
        vec![
            add(&longest, &base),
            check(&longest, &base),
            del(&longest, &base),
        ],
    );
    c(
        "hostile-container-id-too-long",
        vec![add(&container_id_of(LONGEST_ID + 1), &base)],
    );
    // docs/plugin.md difference 8: writing the round-robin cursor fails (a directory sits at its name).
    c(
        "cursor-write-fails",
        vec![
            add("c1", &base).dir("data/net1/last_reserved_ip.0"),
            check("c1", &base),
        ],
    );

    // A network directory written by host-local and read back after a restart (contract 3):
    // every kind of file host-local leaves, then the full command set.
    c(
        "mixed-existing-state",
        vec![
            add("c3", &base)
                .file("data/net1/10.1.0.2", b"c1\r\neth0")
                .file("data/net1/10.1.0.3", b"c2")
                .file("data/net1/last_reserved_ip.0", b"10.1.0.3")
                .file("data/net1/lock", b""),
            check("c1", &base),
            check("c2", &base).ifname("net9"),
            del("c2", &base),
            del("c1", &base),
            add("c4", &base),
        ],
    );
    // Go's decoder: duplicate keys (last wins), nulls, escapes, trailing data, invalid UTF-8
    // (replaced by U+FFFD), deep nesting and huge numbers in fields nobody reads.
    c(
        "json-duplicate-name",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"bad name","name":"net1","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "json-duplicate-version",
        vec![add(
            "c1",
            r#"{"cniVersion":"9.9.9","cniVersion":"0.3.1","name":"net1","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "json-null-version",
        vec![add(
            "c1",
            r#"{"cniVersion":null,"name":"net1","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "json-null-name",
        vec![add("c1", r#"{"cniVersion":"1.0.0","name":null,"ipam":{}}"#)],
    );
    c(
        "json-escaped-name",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net\u0031","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "json-trailing-garbage",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}} x"#,
        )],
    );
    c(
        "json-trailing-whitespace",
        vec![add(
            "c1",
            "{\"cniVersion\":\"1.0.0\",\"name\":\"net1\",\"ipam\":{\"dataDir\":\"@DATADIR@\",\"subnet\":\"10.1.0.0/24\"}}\n\t ",
        )],
    );
    c(
        "json-invalid-utf8-name",
        vec![
            add("c1", "")
                .stdin_bytes(b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\xffe\",\"ipam\":{}}"),
        ],
    );
    c(
        "json-deep-unknown-field",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],"ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24"}}"#,
        )],
    );
    c(
        "json-huge-number-unknown-field",
        vec![add(
            "c1",
            r#"{"cniVersion":"1.0.0","name":"net1","mtu":1e400,"ipam":{"dataDir":"@DATADIR@","subnet":"10.1.0.0/24","routes":[{"dst":"10.0.0.0/8","mtu":1e400}]}}"#,
        )],
    );
    // Switching plugins on a node (contract 3): steps marked `by_host_local()` run host-local on
    // both sides, so ipkeep has to work from the state host-local left, and the other way round.
    let hl = |step: Step| step.by_host_local();
    c(
        "switch-host-local-to-ipkeep",
        vec![
            hl(add("c1", &base)),
            hl(add("c2", &base)),
            hl(add("c3", &base).ifname("eth1")),
            hl(del("c1", &base)),
            add("c4", &base),
            check("c2", &base),
            check("c3", &base).ifname("eth1"),
            del("c2", &base),
            check("c2", &base),
            add("c2", &base),
            add("c3", &base).ifname("eth1"),
            del("c3", &base).ifname("eth1"),
            add("c5", &base),
        ],
    );
    c(
        "switch-ipkeep-to-host-local",
        vec![
            add("c1", &dual).args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p1"),
            add("c2", &dual).args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p2"),
            del("c1", &dual),
            hl(add("c3", &dual)),
            hl(check("c2", &dual)),
            hl(add("c2", &dual)),
            hl(del("c2", &dual)),
            hl(check("c2", &dual)),
            hl(add("c4", &dual)),
        ],
    );
    c(
        "switch-interleaved",
        vec![
            add("c1", &base),
            hl(add("c2", &base)),
            add("c3", &base),
            hl(del("c1", &base)),
            check("c1", &base),
            del("c2", &base),
            hl(check("c2", &base)),
            add("c1", &base),
            hl(add("c1", &base)),
            add("c2", &base).args("IP=10.1.0.3"),
            hl(del("c3", &base)),
            add("c6", &base).args("IP=10.1.0.4"),
            hl(add("c7", &base).args("IP=10.1.0.5")),
            del("c7", &base),
            check("c7", &base),
        ],
    );
    c(
        "switch-interleaved-two-sets",
        vec![
            hl(add("c1", &two30)),
            add("c2", &two30),
            hl(del("c1", &two30)),
            add("c2", &two30),
            add("c3", &two30),
            hl(add("c4", &two30)),
            del("c3", &two30),
            hl(check("c3", &two30)),
        ],
    );
    c(
        "switch-legacy-files-then-host-local",
        vec![
            check("c1", &base)
                .ifname("eth3")
                .file("data/net1/10.1.0.7", b"c1"),
            add("c2", &base),
            hl(del("c1", &base)),
            del("c2", &base),
            hl(check("c2", &base)),
        ],
    );
    c(
        "foreign-name-file",
        vec![
            check("c1", &base).file("data/net1/notes", b"c1\r\neth0"),
            del("c1", &base),
        ],
    );
    c(
        "stdin-with-bom",
        vec![add("c1", "").stdin_bytes(b"\xef\xbb\xbf{\"name\":\"net1\"}")],
    );

    cases
}
