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
        let words: Vec<String> = args.iter().map(|a| shell_word(a)).collect();
        let line = format!("kubectl -n {namespace} {}", words.join(" "));
        match manifest {
            Some(yaml) => println!("\n$ {line} <<EOF\n{yaml}EOF"),
            None => println!("\n$ {line}"),
        }
        print!("{output}");
    }
}

/// `word` as a shell reads it back: single-quoted when it holds anything the shell would
/// interpret (a jsonpath's braces and quotes, say).
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
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

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn words_are_quoted_only_when_the_shell_would_read_them_otherwise() {
        for (word, shown) in [
            ("get", "get"),
            ("--replicas=0", "--replicas=0"),
            ("http://198.19.137.3:8080/", "http://198.19.137.3:8080/"),
            ("", "''"),
            ("a b", "'a b'"),
            (r#"jsonpath={.a\.b}{"\n"}"#, r#"'jsonpath={.a\.b}{"\n"}'"#),
            ("it's", r#"'it'\''s'"#),
        ] {
            assert_eq!(shell_word(word), shown, "{word:?}");
        }
    }
}
