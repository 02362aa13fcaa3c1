//! The CNI process contract (the CNI library's "skel" as Debian's host-local 1.1.1 has it):
//! environment validation in its exact order, stdin, version gates, dispatch, exit codes.
//! GC and STATUS follow the newer library (only `CNI_COMMAND`/`CNI_PATH` required, no container
//! ID or interface checks, gated on cniVersion ≥ 1.1.0).

use std::io::Read;
use std::time::SystemTime;

use crate::commands::{self, CmdArgs, CniError, Failure, Output};
use crate::neighbour::NeighbourTable;
use ipkeep_hostlocal::gojson::{self, Decoder, Value};
use ipkeep_hostlocal::store::is_valid_container_id;
use ipkeep_hostlocal::version;

/// The largest network configuration accepted on stdin.
pub const MAX_STDIN: usize = 1 << 20;

/// What the process prints and how it exits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// Bytes for stdout.
    pub stdout: String,
    /// Bytes for stderr.
    pub stderr: String,
    /// The exit status.
    pub exit_code: i32,
}

impl Reply {
    fn error(e: &CniError, log: &[String]) -> Self {
        Self {
            stdout: ipkeep_hostlocal::result::error_json(e.code, &e.msg, &e.details),
            stderr: log_text(log),
            exit_code: 1,
        }
    }
}

fn log_text(log: &[String]) -> String {
    log.iter().map(|l| format!("{l}\n")).collect()
}

/// The text printed to stderr when `CNI_COMMAND` is not set.
pub fn about() -> String {
    format!(
        "CNI ipkeep plugin v{}\nCNI protocol versions supported: {}\n",
        env!("CARGO_PKG_VERSION"),
        version::SUPPORTED.join(", ")
    )
}

const VARS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fn required(var: &str, cmd: &str) -> bool {
    match cmd {
        "ADD" | "CHECK" => matches!(
            var,
            "CNI_CONTAINERID" | "CNI_NETNS" | "CNI_IFNAME" | "CNI_PATH"
        ),
        "DEL" => matches!(var, "CNI_CONTAINERID" | "CNI_IFNAME" | "CNI_PATH"),
        "GC" | "STATUS" => var == "CNI_PATH",
        _ => false,
    }
}

/// Decodes one string field of the whole document like `json.Unmarshal` into a one-field struct.
fn string_field(
    doc: &Value,
    field: &'static str,
    go_type: &str,
) -> Result<String, gojson::DecodeError> {
    let mut d = Decoder::new();
    let mut out = String::new();
    d.object(doc, go_type, "", &[field], |d, _, v| {
        d.string(v, &mut out);
        Ok(())
    })?;
    d.finish()?;
    Ok(out)
}

fn config_version(doc: &Value) -> Result<String, CniError> {
    let v = string_field(
        doc,
        "cniVersion",
        r#"struct { CNIVersion string "json:\"cniVersion\"" }"#,
    )
    .map_err(|e| CniError::new(6, format!("decoding version from network config: {e}")))?;
    Ok(if v.is_empty() { "0.1.0".to_owned() } else { v })
}

fn check_version(doc: &Value) -> Result<(), CniError> {
    let v = config_version(doc)?;
    if version::is_supported(&v) {
        Ok(())
    } else {
        Err(CniError {
            code: 1,
            msg: "incompatible CNI versions".to_owned(),
            details: version::incompatible_details(&v),
        })
    }
}

/// The newer-verb gate (CHECK ≥ 0.4.0, GC/STATUS ≥ 1.1.0), as the CNI library words it.
fn gate(doc: &Value, minimum: &str, verb: &str) -> Result<(), CniError> {
    let v = config_version(doc)?;
    if !version::at_least(&v, minimum).map_err(|e| CniError::new(6, e))? {
        return Err(CniError::new(
            1,
            format!("config version does not allow {verb}"),
        ));
    }
    for plugin in version::SUPPORTED {
        if version::at_least(plugin, &v).map_err(|e| CniError::new(6, e))? {
            return check_version(doc);
        }
    }
    Err(CniError::new(
        1,
        format!("plugin version does not allow {verb}"),
    ))
}

fn validate_ifname(ifname: &str) -> Result<(), CniError> {
    if ifname.is_empty() {
        return Err(CniError::new(4, "interface name is empty"));
    }
    if ifname.len() > 15 {
        return Err(CniError {
            code: 4,
            msg: "interface name is too long".to_owned(),
            details: "interface name should be less than 16 characters".to_owned(),
        });
    }
    if ifname == "." || ifname == ".." {
        return Err(CniError::new(4, "interface name is . or .."));
    }
    if ifname
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(CniError::new(
            4,
            "interface name contains / or : or whitespace characters",
        ));
    }
    Ok(())
}

/// Runs one plugin invocation: `getenv` gives the environment, `stdin` the configuration,
/// `neighbours` the host's neighbour tables (which ADD and DEL clear of the addresses they hand
/// out and free).
pub fn run(
    getenv: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    now: SystemTime,
    neighbours: &dyn NeighbourTable,
) -> Reply {
    let value = |name: &str| getenv(name).unwrap_or_default();
    let cmd = value("CNI_COMMAND");
    let missing: Vec<&str> = VARS
        .iter()
        .copied()
        .filter(|v| value(v).is_empty() && (*v == "CNI_COMMAND" || required(v, &cmd)))
        .collect();
    if !missing.is_empty() {
        if cmd.is_empty() {
            return Reply {
                stdout: String::new(),
                stderr: about(),
                exit_code: 0,
            };
        }
        return Reply::error(
            &CniError::new(
                4,
                format!("required env variables [{}] missing", missing.join(",")),
            ),
            &[],
        );
    }
    if cmd == "VERSION" {
        return Reply {
            stdout: version_json(),
            stderr: String::new(),
            exit_code: 0,
        };
    }
    let mut bytes = Vec::new();
    let limit = u64::try_from(MAX_STDIN).unwrap_or(u64::MAX) + 1;
    if let Err(e) = stdin.take(limit).read_to_end(&mut bytes) {
        return Reply::error(
            &CniError::new(5, format!("error reading from stdin: {e}")),
            &[],
        );
    }
    if bytes.len() > MAX_STDIN {
        return Reply::error(
            &CniError::new(
                5,
                format!(
                    "error reading from stdin: network configuration is larger than {MAX_STDIN} bytes"
                ),
            ),
            &[],
        );
    }
    let args = CmdArgs {
        container_id: value("CNI_CONTAINERID"),
        ifname: value("CNI_IFNAME"),
        args: value("CNI_ARGS"),
    };
    match dispatch(&cmd, &bytes, &args, now, neighbours) {
        Ok(out) => Reply {
            stdout: out.stdout,
            stderr: log_text(&out.log),
            exit_code: 0,
        },
        Err((e, log)) => Reply::error(&e, &log),
    }
}

fn validate(
    cmd: &str,
    doc: Result<&Value, &gojson::DecodeError>,
    args: &CmdArgs,
) -> Result<(), CniError> {
    let doc = doc.map_err(|e| CniError::new(6, format!("error unmarshall network config: {e}")))?;
    let name = string_field(doc, "name", r#"struct { Name string "json:\"name\"" }"#)
        .map_err(|e| CniError::new(6, format!("error unmarshall network config: {e}")))?;
    if name.is_empty() {
        return Err(CniError::new(7, "missing network name"));
    }
    if !is_valid_container_id(&name) {
        return Err(CniError {
            code: 7,
            msg: "invalid characters found in network name".to_owned(),
            details: name,
        });
    }
    if matches!(cmd, "GC" | "STATUS") {
        return Ok(());
    }
    if args.container_id.is_empty() {
        return Err(CniError::new(3, "missing containerID"));
    }
    if !is_valid_container_id(&args.container_id) {
        return Err(CniError {
            code: 4,
            msg: "invalid characters in containerID".to_owned(),
            details: args.container_id.clone(),
        });
    }
    validate_ifname(&args.ifname)
}

fn dispatch(
    cmd: &str,
    bytes: &[u8],
    args: &CmdArgs,
    now: SystemTime,
    neighbours: &dyn NeighbourTable,
) -> Result<Output, Failure> {
    let parsed = gojson::parse(bytes);
    validate(cmd, parsed.as_ref(), args).map_err(|e| (e, Vec::new()))?;
    let Ok(doc) = parsed else {
        return Err((
            CniError::new(6, "error unmarshall network config"),
            Vec::new(),
        ));
    };
    let gated = |r: Result<(), CniError>| r.map_err(|e| (e, Vec::new()));
    match cmd {
        "ADD" => {
            gated(check_version(&doc))?;
            commands::add(&doc, args, now, neighbours)
        }
        "DEL" => {
            gated(check_version(&doc))?;
            commands::del(&doc, args, now, neighbours)
        }
        "CHECK" => {
            gated(gate(&doc, "0.4.0", "CHECK"))?;
            commands::check(&doc, args, now)
        }
        "GC" => {
            gated(gate(&doc, "1.1.0", "GC"))?;
            commands::gc(&doc, args, now)
        }
        "STATUS" => {
            gated(gate(&doc, "1.1.0", "STATUS"))?;
            commands::status(&doc, args, now)
        }
        other => Err((
            CniError::new(4, format!("unknown CNI_COMMAND: {other}")),
            Vec::new(),
        )),
    }
}

/// VERSION's output: compact, with a trailing newline.
pub fn version_json() -> String {
    use gojson::{Out, object};
    let supported = Out::Array(
        version::SUPPORTED
            .iter()
            .map(|v| Out::String((*v).to_owned()))
            .collect(),
    );
    gojson::to_compact_line(&object(vec![
        ("cniVersion", Out::String(version::CURRENT.to_owned())),
        ("supportedVersions", supported),
    ]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn call(env: &[(&str, &str)], stdin: &str) -> Reply {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        run(
            &|k| map.get(k).cloned(),
            &mut stdin.as_bytes(),
            SystemTime::UNIX_EPOCH,
            &crate::neighbour::Recorder::empty(),
        )
    }

    fn env(cmd: &str) -> Vec<(&str, &str)> {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/x"),
        ]
    }

    fn msg(r: &Reply) -> (i32, u64, String) {
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        (
            r.exit_code,
            v["code"].as_u64().unwrap(),
            v["msg"].as_str().unwrap().to_owned(),
        )
    }

    #[test]
    fn about_and_version() {
        let r = call(&[], "");
        assert_eq!((r.exit_code, r.stdout.as_str()), (0, ""));
        assert!(r.stderr.starts_with("CNI ipkeep plugin v"), "{}", r.stderr);
        assert!(r.stderr.ends_with(
            "CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0\n"
        ));
        let r = call(&[("CNI_COMMAND", "VERSION")], "not json");
        assert_eq!(
            r.stdout,
            "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n"
        );
    }

    #[test]
    fn validation_order_and_messages() {
        let ok = r#"{"name":"n","cniVersion":"1.0.0"}"#;
        type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, (i32, u64, &'a str));
        let cases: Vec<Case> = vec![
            (
                vec![("CNI_COMMAND", "ADD")],
                ok,
                (
                    1,
                    4,
                    "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing",
                ),
            ),
            (
                vec![("CNI_COMMAND", "DEL"), ("CNI_PATH", "/x")],
                ok,
                (
                    1,
                    4,
                    "required env variables [CNI_CONTAINERID,CNI_IFNAME] missing",
                ),
            ),
            (
                env("ADD"),
                "",
                (
                    1,
                    6,
                    "error unmarshall network config: unexpected end of JSON input",
                ),
            ),
            (
                env("ADD"),
                "5",
                (
                    1,
                    6,
                    "error unmarshall network config: json: cannot unmarshal number into Go value of type struct { Name string \"json:\\\"name\\\"\" }",
                ),
            ),
            (
                env("ADD"),
                r#"{"name":5}"#,
                (
                    1,
                    6,
                    "error unmarshall network config: json: cannot unmarshal number into Go struct field .name of type string",
                ),
            ),
            (env("ADD"), "null", (1, 7, "missing network name")),
            (
                env("ADD"),
                r#"{"name":"a b"}"#,
                (1, 7, "invalid characters found in network name"),
            ),
            (
                env("ADD"),
                r#"{"name":"n","cniVersion":5}"#,
                (
                    1,
                    6,
                    "decoding version from network config: json: cannot unmarshal number into Go struct field .cniVersion of type string",
                ),
            ),
            (
                env("ADD"),
                r#"{"name":"n","cniVersion":"9.9.9"}"#,
                (1, 1, "incompatible CNI versions"),
            ),
            (
                env("CHECK"),
                r#"{"name":"n","cniVersion":"0.3.1"}"#,
                (1, 1, "config version does not allow CHECK"),
            ),
            (
                env("CHECK"),
                r#"{"name":"n","cniVersion":"1.2.0"}"#,
                (1, 1, "plugin version does not allow CHECK"),
            ),
            (
                env("CHECK"),
                r#"{"name":"n","cniVersion":"a.b"}"#,
                (
                    1,
                    6,
                    "failed to convert major version part \"a\": strconv.Atoi: parsing \"a\": invalid syntax",
                ),
            ),
            (
                env("GC"),
                r#"{"name":"n","cniVersion":"1.0.0"}"#,
                (1, 1, "config version does not allow GC"),
            ),
            (
                env("STATUS"),
                r#"{"name":"n","cniVersion":"1.0.0"}"#,
                (1, 1, "config version does not allow STATUS"),
            ),
            (env("add"), ok, (1, 4, "unknown CNI_COMMAND: add")),
            (
                vec![("CNI_COMMAND", "FOO")],
                ok,
                (1, 3, "missing containerID"),
            ),
            (
                vec![("CNI_COMMAND", "FOO"), ("CNI_CONTAINERID", "c1")],
                ok,
                (1, 4, "interface name is empty"),
            ),
        ];
        for (env, stdin, (exit, code, text)) in cases {
            let r = call(&env, stdin);
            assert_eq!(
                msg(&r),
                (exit, code, text.to_owned()),
                "env {env:?} stdin {stdin}"
            );
        }
    }

    #[test]
    fn container_and_interface_checks() {
        let ok = r#"{"name":"n","cniVersion":"1.0.0"}"#;
        let mut e = env("ADD");
        e[1] = ("CNI_CONTAINERID", "bad id");
        let r = call(&e, ok);
        assert_eq!(
            msg(&r),
            (1, 4, "invalid characters in containerID".to_owned())
        );
        assert!(r.stdout.contains("\"details\": \"bad id\""));
        for (ifname, text) in [
            ("eth0123456789012", "interface name is too long"),
            ("..", "interface name is . or .."),
            (
                "a/b",
                "interface name contains / or : or whitespace characters",
            ),
            (
                "a:b",
                "interface name contains / or : or whitespace characters",
            ),
        ] {
            let mut e = env("ADD");
            e[3] = ("CNI_IFNAME", ifname);
            assert_eq!(msg(&call(&e, ok)).2, text, "{ifname}");
        }
        // A bad network name wins over a bad container ID.
        let mut e = env("ADD");
        e[1] = ("CNI_CONTAINERID", "bad id");
        assert_eq!(msg(&call(&e, r#"{"name":"a b"}"#)).1, 7);
    }

    #[test]
    fn huge_stdin_is_rejected() {
        let big = format!("{{\"name\":\"n\",\"x\":\"{}\"}}", "a".repeat(MAX_STDIN));
        let r = call(&env("ADD"), &big);
        assert_eq!(msg(&r).1, 5);
        assert!(msg(&r).2.contains("larger than"));
    }
}
