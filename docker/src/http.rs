//! A small, bounded HTTP/1.1 server side: one request read from a connection (request line,
//! headers, a `Content-Length` or chunked body), one response written. Every size is capped, so
//! a hostile peer costs at most [`Limits`] bytes of memory; a body over the cap is refused
//! without being read.

use std::io::{self, BufRead, Read, Write};

/// The caps on one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Request line plus headers.
    pub max_head: usize,
    /// The body.
    pub max_body: usize,
}

impl Default for Limits {
    /// Docker's requests are a few hundred bytes: 16 KiB of headers, 64 KiB of body.
    fn default() -> Self {
        Self {
            max_head: 16 << 10,
            max_body: 64 << 10,
        }
    }
}

/// One request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `POST`, `GET`, …
    pub method: String,
    /// The path (`/IpamDriver.RequestAddress`).
    pub path: String,
    /// The body, possibly empty.
    pub body: Vec<u8>,
    /// Whether the peer asked to close the connection after this request.
    pub close: bool,
}

/// Why a request could not be read. Every variant but `Io` is answered with a 400 or 413.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Not HTTP/1.x as this server reads it.
    #[error("failed to parse the HTTP request: {0}")]
    Malformed(&'static str),
    /// The request line and headers exceed the cap.
    #[error("failed to read the HTTP request: its headers are larger than {0} bytes")]
    HeadTooLarge(usize),
    /// The body exceeds the cap.
    #[error(
        "failed to read the request body: it is larger than the {max} bytes ipkeep-docker accepts"
    )]
    BodyTooLarge {
        /// The cap.
        max: usize,
    },
    /// The connection failed (or closed mid-request).
    #[error("failed to read the HTTP request")]
    Io(#[source] io::Error),
}

impl HttpError {
    /// The status this error is answered with (`None`: just close).
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Malformed(_) => Some(400),
            Self::HeadTooLarge(_) => Some(431),
            Self::BodyTooLarge { .. } => Some(413),
            Self::Io(_) => None,
        }
    }
}

/// Reads one line (up to `\n`) of at most `budget` bytes, charging it to the budget.
fn read_line<R: BufRead>(r: &mut R, budget: &mut usize, max: usize) -> Result<Vec<u8>, HttpError> {
    let mut line = Vec::new();
    let limit = u64::try_from(*budget).unwrap_or(u64::MAX);
    r.by_ref()
        .take(limit)
        .read_until(b'\n', &mut line)
        .map_err(HttpError::Io)?;
    if !line.ends_with(b"\n") {
        if line.len() >= *budget {
            return Err(HttpError::HeadTooLarge(max));
        }
        return Err(HttpError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    *budget -= line.len();
    line.pop();
    if line.ends_with(b"\r") {
        line.pop();
    }
    Ok(line)
}

/// Reads the next request; `Ok(None)` when the peer closed the connection between requests.
pub fn read_request<R: BufRead>(r: &mut R, limits: Limits) -> Result<Option<Request>, HttpError> {
    if r.fill_buf().map_err(HttpError::Io)?.is_empty() {
        return Ok(None);
    }
    let mut budget = limits.max_head;
    let line = read_line(r, &mut budget, limits.max_head)?;
    let line = std::str::from_utf8(&line)
        .map_err(|_| HttpError::Malformed("request line is not UTF-8"))?;
    let mut parts = line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Malformed("expected METHOD PATH HTTP/1.x"));
    };
    let mut close = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(HttpError::Malformed("expected HTTP/1.0 or HTTP/1.1")),
    };
    if method.is_empty() || !path.starts_with('/') {
        return Err(HttpError::Malformed("expected METHOD PATH HTTP/1.x"));
    }
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    loop {
        let header = read_line(r, &mut budget, limits.max_head)?;
        if header.is_empty() {
            break;
        }
        let header = std::str::from_utf8(&header)
            .map_err(|_| HttpError::Malformed("header is not UTF-8"))?;
        let (name, value) = header
            .split_once(':')
            .ok_or(HttpError::Malformed("header without a colon"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| HttpError::Malformed("Content-Length is not a number"))?;
            if content_length.is_some_and(|old| old != n) {
                return Err(HttpError::Malformed("conflicting Content-Length headers"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if !value.eq_ignore_ascii_case("chunked") {
                return Err(HttpError::Malformed(
                    "only the chunked transfer encoding is understood",
                ));
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    if chunked && content_length.is_some() {
        return Err(HttpError::Malformed("both Content-Length and chunked"));
    }
    let body = if chunked {
        read_chunked(r, limits)?
    } else {
        let len = content_length.unwrap_or(0);
        if len > limits.max_body {
            return Err(HttpError::BodyTooLarge {
                max: limits.max_body,
            });
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).map_err(HttpError::Io)?;
        body
    };
    Ok(Some(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        body,
        close,
    }))
}

fn read_chunked<R: BufRead>(r: &mut R, limits: Limits) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    // Chunk-size lines and trailers get their own small budget.
    let mut budget = limits.max_head;
    loop {
        let line = read_line(r, &mut budget, limits.max_head)?;
        let size = std::str::from_utf8(&line)
            .ok()
            .map(|l| l.split(';').next().unwrap_or_default().trim())
            .and_then(|hex| usize::from_str_radix(hex, 16).ok())
            .ok_or(HttpError::Malformed("bad chunk size"))?;
        if size == 0 {
            while !read_line(r, &mut budget, limits.max_head)?.is_empty() {}
            return Ok(body);
        }
        if size > limits.max_body.saturating_sub(body.len()) {
            return Err(HttpError::BodyTooLarge {
                max: limits.max_body,
            });
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).map_err(HttpError::Io)?;
        if !read_line(r, &mut budget, limits.max_head)?.is_empty() {
            return Err(HttpError::Malformed("chunk longer than its size"));
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// Writes one response with the plugin protocol's content type (or `text/plain` for metrics).
pub fn write_response<W: Write>(
    w: &mut W,
    status: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n",
        reason(status),
        body.len()
    );
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn read(raw: &[u8]) -> Result<Option<Request>, HttpError> {
        let limits = Limits {
            max_head: 256,
            max_body: 32,
        };
        read_request(&mut io::BufReader::new(raw), limits)
    }

    #[test]
    fn requests_as_the_engine_sends_them() {
        let raw = b"POST /IpamDriver.GetCapabilities HTTP/1.1\r\nHost: plugin\r\nContent-Length: 0\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\n\r\n";
        let req = read(raw).unwrap().unwrap();
        assert_eq!(
            (
                req.method.as_str(),
                req.path.as_str(),
                req.body.len(),
                req.close
            ),
            ("POST", "/IpamDriver.GetCapabilities", 0, false)
        );
        let raw = b"POST /x HTTP/1.1\r\ncontent-length: 4\r\nConnection: close\r\n\r\nnull";
        let req = read(raw).unwrap().unwrap();
        assert_eq!((req.body.as_slice(), req.close), (&b"null"[..], true));
        let raw = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n3;ext\r\n[1]\r\n0\r\n\r\n";
        assert_eq!(read(raw).unwrap().unwrap().body, b"{}[1]");
        assert!(read(b"").unwrap().is_none());
    }

    #[test]
    fn hostile_requests_table() {
        let long_header = format!("POST /x HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(300));
        let cases: Vec<(&[u8], Option<u16>)> = vec![
            (b"GARBAGE\r\n\r\n", Some(400)),
            (b"POST /x HTTP/2.0\r\n\r\n", Some(400)),
            (b"POST x HTTP/1.1\r\n\r\n", Some(400)),
            (b"POST /x HTTP/1.1\r\nno colon\r\n\r\n", Some(400)),
            (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", Some(400)),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                Some(400),
            ),
            (b"POST /x HTTP/1.1\r\nContent-Length: 33\r\n\r\n", Some(413)),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                Some(400),
            ),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                Some(400),
            ),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n21\r\n",
                Some(413),
            ),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                Some(400),
            ),
            (long_header.as_bytes(), Some(431)),
            (b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", None),
            (b"POST /x HTTP/1.1\r\n", None),
        ];
        for (raw, want) in cases {
            let err = read(raw).unwrap_err();
            assert_eq!(
                err.status(),
                want,
                "{:?}: {err}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn responses() {
        let mut out = Vec::new();
        write_response(&mut out, 200, "application/json", b"{}", true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
    }
}
