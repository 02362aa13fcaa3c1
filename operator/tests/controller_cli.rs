//! `ipkeep-operator controller --help` explains every flag and its environment variable; bad
//! values are refused before anything starts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

fn controller(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ipkeep-operator"))
        .arg("controller")
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("failed to run ipkeep-operator")
}

#[test]
fn help_lists_every_flag_with_its_environment_variable() {
    let out = controller(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for (flag, env) in [
        ("--default-retain-for", "IPKEEP_DEFAULT_RETAIN_FOR"),
        ("--namespace", "IPKEEP_NAMESPACE"),
        ("--pod-selector", "IPKEEP_POD_SELECTOR"),
        ("--metrics-addr", "IPKEEP_METRICS_ADDR"),
        ("--leader-elect", "IPKEEP_LEADER_ELECT"),
        ("--lease-name", "IPKEEP_LEASE_NAME"),
        ("--lease-namespace", "POD_NAMESPACE"),
        ("--lease-duration", "IPKEEP_LEASE_DURATION"),
        ("--identity", "POD_NAME"),
        ("--workers", "IPKEEP_WORKERS"),
        ("--log-format", "IPKEEP_LOG_FORMAT"),
        ("--log-level", "IPKEEP_LOG_LEVEL"),
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
        assert!(
            help.contains(&format!("env: {env}")),
            "--help lacks env {env}:\n{help}"
        );
    }
    assert!(help.contains("[default: 24h]"), "{help}");
}

#[test]
fn malformed_values_are_refused_with_the_reason() {
    for (args, says) in [
        (&["--default-retain-for", "0s"][..], "positive whole number"),
        (&["--default-retain-for", "400d"][..], "366d"),
        (&["--lease-duration", "1"][..], "--lease-duration"),
        (&["--metrics-addr", "nowhere"][..], "--metrics-addr"),
    ] {
        let out = controller(args);
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
