//! The one way this crate runs a program to completion — the real nodes' host tools, the demo's
//! kubectl and helm, the tests' commands (`testkit::commands` fails a test with this error) —
//! and the one error that says which command failed and what it said.

use std::{
    ffi::OsStr,
    fs::File,
    io::Write as _,
    process::{Command, ExitStatus, Output, Stdio},
};

/// What a command reads on its stdin.
#[derive(Debug)]
pub enum Stdin<'a> {
    /// Nothing: an empty, closed stdin.
    Empty,
    /// This text.
    Text(&'a str),
    /// This file (an image archive, say), read by the command itself.
    File(File),
}

impl<'a> From<Option<&'a str>> for Stdin<'a> {
    fn from(text: Option<&'a str>) -> Self {
        text.map_or(Stdin::Empty, Stdin::Text)
    }
}

/// A program that could not be run, or that failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// It could not be started, fed its stdin or waited for.
    #[error("failed to run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// It exited unsuccessfully.
    #[error("`{command}` failed ({status}): {said}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed, stdout then stderr, trimmed.
        said: String,
    },
}

/// `program arg…` as a person would type it, for messages.
pub fn line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command` to completion with `stdin` and returns what it did, whatever its exit status.
pub fn run<'a>(command: &mut Command, stdin: impl Into<Stdin<'a>>) -> Result<Output, CommandError> {
    let stdin = stdin.into();
    let text_of_command = line(command);
    let spawn = |source| CommandError::Spawn {
        command: text_of_command.clone(),
        source,
    };
    let (input, text) = match stdin {
        Stdin::Empty => (Stdio::null(), None),
        Stdin::Text(text) => (Stdio::piped(), Some(text)),
        Stdin::File(file) => (Stdio::from(file), None),
    };
    let mut child = command
        .stdin(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let (Some(mut pipe), Some(text)) = (child.stdin.take(), text) {
        pipe.write_all(text.as_bytes()).map_err(spawn)?;
    }
    child.wait_with_output().map_err(spawn)
}

/// [`run`], and an exit status other than success is a [`CommandError::Failed`] with what the
/// command printed.
pub fn checked<'a>(
    command: &mut Command,
    stdin: impl Into<Stdin<'a>>,
) -> Result<Output, CommandError> {
    let output = run(command, stdin)?;
    if output.status.success() {
        return Ok(output);
    }
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Err(CommandError::Failed {
        command: line(command),
        status: output.status,
        said: said.trim().to_owned(),
    })
}

/// [`checked`]'s stdout as text.
pub fn stdout_of<'a>(
    command: &mut Command,
    stdin: impl Into<Stdin<'a>>,
) -> Result<String, CommandError> {
    checked(command, stdin).map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_outcome_says() {
        let ok = stdout_of(Command::new("cat").arg("-"), Stdin::Text("fed")).expect("cat ran");
        assert_eq!(ok, "fed");

        let err = checked(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Stdin::Empty,
        )
        .expect_err("exit 3 is a failure");
        let text = err.to_string();
        assert!(
            text.starts_with(
                "`sh -c echo out; echo err >&2; exit 3` failed (exit status: 3): out\nerr"
            ),
            "{text}"
        );

        let err = run(&mut Command::new("/nonexistent/program"), Stdin::Empty)
            .expect_err("no such program");
        assert!(matches!(err, CommandError::Spawn { .. }), "{err:?}");
        assert_eq!(err.to_string(), "failed to run `/nonexistent/program`");

        let failed = run(&mut Command::new("false"), Stdin::Empty).expect("false ran");
        assert!(!failed.status.success(), "run returns a failure's output");
    }
}
