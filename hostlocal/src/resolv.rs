//! `resolvConf`: host-local's resolv.conf reader (its parsing rules and error texts).

use std::io::Read;

/// DNS settings for the result, in host-local's field order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dns {
    /// `nameserver` lines (second field only).
    pub nameservers: Vec<String>,
    /// The last `domain` line.
    pub domain: String,
    /// All `search` fields.
    pub search: Vec<String>,
    /// All `options` fields.
    pub options: Vec<String>,
}

/// Go's `bufio.Scanner` limit: longer lines make host-local fail.
const MAX_LINE: usize = 64 * 1024;

/// Reads at most this much of the file; resolv.conf files are tiny.
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// Reads and parses `path` (an administrator-chosen file: symlinks are followed, as host-local does).
pub fn read(path: &str) -> Result<Dns, String> {
    let go_err = |op: &str, e: &std::io::Error| {
        let errno = rustix::io::Errno::from_io_error(e).unwrap_or(rustix::io::Errno::IO);
        format!("{op} {path}: {}", ipkeep_netdir::go_errno_text(errno))
    };
    let file = std::fs::File::open(path).map_err(|e| go_err("open", &e))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE)
        .read_to_end(&mut bytes)
        .map_err(|e| go_err("read", &e))?;
    parse(&bytes)
}

/// Parses resolv.conf content with host-local's rules.
pub fn parse(bytes: &[u8]) -> Result<Dns, String> {
    let mut dns = Dns::default();
    for raw in bytes.split(|b| *b == b'\n') {
        if raw.len() >= MAX_LINE {
            return Err("bufio.Scanner: token too long".to_owned());
        }
        let line = String::from_utf8_lossy(raw);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        match fields[0] {
            "nameserver" => dns.nameservers.push(fields[1].to_owned()),
            "domain" => fields[1].clone_into(&mut dns.domain),
            "search" => dns
                .search
                .extend(fields[1..].iter().map(|s| (*s).to_owned())),
            "options" => dns
                .options
                .extend(fields[1..].iter().map(|s| (*s).to_owned())),
            _ => {}
        }
    }
    Ok(dns)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_host_local() {
        let text = "# comment\n; other\nnameserver 192.0.2.3\nnameserver 2001:db8::53 extra\n  domain first.example\n\
                    domain last.example\nsearch a.example b.example\nsearch c.example\noptions ndots:2 timeout:1\n\
                    sortlist 10.0.0.0\nnameserver\r\nnameserver 192.0.2.4\r\n";
        let dns = parse(text.as_bytes()).unwrap();
        assert_eq!(
            dns.nameservers,
            vec!["192.0.2.3", "2001:db8::53", "192.0.2.4"]
        );
        assert_eq!(dns.domain, "last.example");
        assert_eq!(dns.search, vec!["a.example", "b.example", "c.example"]);
        assert_eq!(dns.options, vec!["ndots:2", "timeout:1"]);
    }

    #[test]
    fn long_lines_and_missing_files_fail_like_go() {
        let long = "a".repeat(MAX_LINE);
        assert_eq!(
            parse(long.as_bytes()).unwrap_err(),
            "bufio.Scanner: token too long"
        );
        assert!(parse("a".repeat(MAX_LINE - 1).as_bytes()).is_ok());
        assert_eq!(
            read("/nonexistent/ipkeep-resolv").unwrap_err(),
            "open /nonexistent/ipkeep-resolv: no such file or directory"
        );
    }
}
