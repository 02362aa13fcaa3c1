//! What the driver's tests share: a scratch directory, the driver process (started, killed,
//! restarted), a client that sends requests byte for byte as the engine's Go client does, and a
//! snapshot of the data directory to prove a refused request changed nothing; and a real
//! `dockerd` ([`dockerd`]).
#![allow(dead_code)]

pub mod dockerd;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The driver binary: `IPKEEP_DOCKER_BIN` (e.g. the static release build) or, in tests, this
/// build's.
pub fn driver_binary() -> PathBuf {
    let built = option_env!("CARGO_BIN_EXE_ipkeep-docker");
    let bin = std::env::var_os("IPKEEP_DOCKER_BIN")
        .map(PathBuf::from)
        .or_else(|| built.map(PathBuf::from))
        .expect("set IPKEEP_DOCKER_BIN to the ipkeep-docker binary (make bench-docker does)");
    assert!(bin.is_file(), "{} does not exist", bin.display());
    bin
}

/// A directory removed (with everything in it) when dropped.
pub type Scratch = tempfile::TempDir;

/// A fresh scratch directory under the system's temporary directory, named after `tag`.
pub fn scratch(tag: &str) -> Scratch {
    tempfile::Builder::new()
        .prefix(&format!("ipkeep-docker-{tag}-"))
        .tempdir()
        .unwrap()
}

/// Waits until `cond` holds, failing the test with `what` when `limit` passes first.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running driver; killed when dropped.
#[derive(Debug)]
pub struct Driver {
    child: Option<Child>,
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
}

impl Driver {
    /// Starts the driver on `<dir>/ipkeep.sock` with data in `<dir>/data`, automatic pools from
    /// 198.18.0.0/15 (unless `extra` says) and `extra` flags; returns once it accepts connections.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_at(&dir.join("ipkeep.sock"), dir, extra)
    }

    /// Like [`Driver::start`] with the socket at `socket`.
    pub fn start_at(socket: &Path, dir: &Path, extra: &[&str]) -> Self {
        let mut driver = Self {
            child: None,
            socket: socket.to_path_buf(),
            data_dir: dir.join("data"),
            log: dir.join("driver.log"),
            args: extra.iter().map(|s| s.to_string()).collect(),
        };
        driver.restart();
        driver
    }

    /// Starts (again) a driver over the same socket and data.
    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // setpriv: the kernel kills the driver when the thread that started it dies, even by SIGKILL.
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(driver_binary())
            .arg("--socket")
            .arg(&self.socket)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(if self.args.iter().any(|a| a == "--auto-pools") {
                &[][..]
            } else {
                &["--auto-pools", "198.18.0.0/15:24"][..]
            })
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let socket = self.socket.clone();
        wait_for(
            "the driver to accept connections",
            Duration::from_secs(20),
            || UnixStream::connect(&socket).is_ok(),
        );
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// One call (see [`call`]).
    pub fn call(&self, path: &str, body: &str) -> (u16, Value) {
        call(&self.socket, path, body).unwrap()
    }

    /// A call that must succeed; its answer.
    pub fn ok(&self, path: &str, body: &str) -> Value {
        let (status, answer) = self.call(path, body);
        assert_eq!(status, 200, "{path} {body}: {answer}");
        answer
    }

    /// A call that must fail; its `Err`.
    pub fn err(&self, path: &str, body: &str) -> String {
        let (status, answer) = self.call(path, body);
        assert_ne!(status, 200, "{path} {body} should have failed: {answer}");
        answer["Err"]
            .as_str()
            .unwrap_or_else(|| panic!("no Err in {answer}"))
            .to_owned()
    }

    /// The driver's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `body` to `path` as the engine's plugin client does (POST, no Content-Type, the JSON
/// followed by a newline, or nothing for calls without arguments) and reads the answer.
pub fn call(socket: &Path, path: &str, body: &str) -> std::io::Result<(u16, Value)> {
    let mut payload = body.to_owned();
    if !payload.is_empty() {
        payload.push('\n');
    }
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: plugin\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: {}\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\nAccept-Encoding: gzip\r\n\r\n{payload}",
        payload.len()
    );
    send_raw(socket, request.as_bytes())
}

/// Sends raw bytes and reads one answer: its status and JSON body.
pub fn send_raw(socket: &Path, request: &[u8]) -> std::io::Result<(u16, Value)> {
    let (status, body) = send_hostile(socket, request, false)?;
    let value = serde_json::from_slice(&body).map_err(|e| {
        std::io::Error::other(format!(
            "answer is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&body)
        ))
    })?;
    Ok((status, value))
}

/// Sends raw bytes and reads one answer: its status and raw body. A server refusing a request
/// may close the connection before reading all of it, so a failed write is not an error here:
/// the answer already written is still read (a Unix socket keeps what was sent before a close).
pub fn send_raw_bytes(socket: &Path, request: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    send_hostile(socket, request, true)
}

fn send_hostile(
    socket: &Path,
    request: &[u8],
    tolerate_write_error: bool,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    if let Err(e) = stream.write_all(request)
        && !tolerate_write_error
    {
        return Err(e);
    }
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((status, body))
}

/// Every file of the data directory that states something (allocation files, cursors, pool
/// state) with its content; ipkeep's rebuildable index and the lock files are left out.
pub fn snapshot(data_dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![data_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name();
            if name == ".ipkeep" || name == "lock" {
                continue;
            }
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(
                    path.strip_prefix(data_dir).unwrap().to_path_buf(),
                    target.into_os_string().into_encoded_bytes(),
                );
            } else if kind.is_dir() {
                stack.push(path);
            } else {
                out.insert(
                    path.strip_prefix(data_dir).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    out
}

/// The address part of a `RequestAddress` answer (`198.18.7.2/24` → `198.18.7.2`).
pub fn address_of(answer: &Value) -> String {
    let cidr = answer["Address"]
        .as_str()
        .unwrap_or_else(|| panic!("no Address in {answer}"));
    cidr.split('/').next().unwrap().to_owned()
}

/// The value of the sample `series` (`name{labels}`) on the driver's `/metrics` (0 if absent).
pub fn metric(socket: &Path, series: &str) -> u64 {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}
