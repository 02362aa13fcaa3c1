//! How the demo tells its story: numbered steps and notes, and the commands it runs printed with
//! their output as a user would type them (the scenarios' steps through [`Story`]).

use std::{path::PathBuf, process::Command};

use super::error::DemoError;
use crate::scenarios::Narrator;

pub(super) fn say(text: &str) {
    println!("\n==> {text}");
}

pub(super) fn note(text: &str) {
    println!("    {text}");
}

/// The scenarios' steps told to a newcomer on stdout, numbered.
#[derive(Debug, Default)]
pub(super) struct Story {
    /// Steps told so far.
    steps: usize,
}

impl Narrator for Story {
    fn step(&mut self, heading: &str) {
        self.steps += 1;
        say(&format!("{}. {heading}", self.steps));
    }

    fn note(&mut self, text: &str) {
        note(text);
    }

    fn ran(&mut self, namespace: &str, args: &[&str], manifest: Option<&str>, output: &str) {
        let line = format!("kubectl -n {namespace} {}", args.join(" "));
        match manifest {
            Some(yaml) => println!("\n$ {line} <<EOF\n{yaml}EOF"),
            None => println!("\n$ {line}"),
        }
        print!("{output}");
    }
}

/// The control plane's kubectl as admin.
pub(super) struct Kubectl {
    /// The built kubectl.
    pub(super) bin: PathBuf,
    /// The admin kubeconfig.
    pub(super) kubeconfig: PathBuf,
}

/// Runs the built kubectl, printing the command line and its output.
pub(super) fn show(k: &Kubectl, args: &[&str]) -> Result<String, DemoError> {
    println!("\n$ kubectl {}", args.join(" "));
    let out = kubectl(k, args)?;
    print!("{out}");
    Ok(out)
}

/// Runs the built kubectl without input; its stdout.
pub(super) fn kubectl(k: &Kubectl, args: &[&str]) -> Result<String, DemoError> {
    let mut cmd = Command::new(&k.bin);
    cmd.env("KUBECONFIG", &k.kubeconfig).args(args);
    Ok(crate::command::stdout_of(&mut cmd, None)?)
}
