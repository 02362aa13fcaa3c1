//! A test's own directory: the one temporary directory of the e2e tests, benches and demo
//! (`tempfile` makes it; this adds keeping it for its logs when the test fails).

use std::path::{Path, PathBuf};

/// A fresh directory `<tmp>/ipkeep-<name>-<random>`, removed when dropped; kept (and named on
/// stderr) when the test is failing, for its logs.
#[derive(Debug)]
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Scratch {
    /// Creates it, empty.
    pub fn new(name: &str) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix(&format!("ipkeep-{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("failed to create a temporary directory for {name}: {e}"));
        let path = dir.path().to_path_buf();
        Scratch {
            dir: Some(dir),
            path,
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside it.
    pub fn join(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.path.join(relative)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("kept {} for its logs", dir.keep().display());
        }
    }
}
