//! Clearing the host's stale neighbour (ARP/NDP) entries for the addresses a command hands out
//! or frees.
//!
//! An address that changes hands on a bridge leaves, in the host's neighbour table, an entry
//! naming its previous holder's MAC until the entry ages out (REACHABLE for 15–45 s, then STALE,
//! DELAY and PROBE): the host's traffic to the new holder, the kubelet's readiness probe first,
//! goes to a MAC that no longer exists. The main plugin (`bridge`) runs its IPAM plugin in the
//! host's network namespace, so ipkeep removes those entries itself, as `ip neigh flush to <ip>`
//! does: one dump of the address family's table, then `RTM_DELNEIGH` for each entry whose
//! destination is the address. Permanent and NOARP entries (an administrator's) are left alone,
//! as `ip neigh flush` leaves them.
//!
//! The messages are built and read by pure functions over bytes; [`Kernel`] is the socket. Two
//! messages and three attributes do not pay for `netlink-packet-route`: measured (issue 27), using
//! it for the dump request and the answer adds 535 KB (+35 %) to the static plugin and 124 KiB
//! (+10 %) to an ADD's peak RSS, since decoding any `RouteNetlinkMessage` links every decoder.

use std::net::IpAddr;

use rustix::fd::OwnedFd;
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// The host's neighbour tables, as a command sees them.
pub trait NeighbourTable {
    /// Removes every neighbour entry (but permanent and NOARP ones) whose destination is one of
    /// `ips`, on any interface; one [`Removal`] per entry found.
    fn flush(&self, ips: &[IpAddr]) -> Result<Vec<Removal>, FlushError>;
}

/// One entry [`NeighbourTable::flush`] found, and whether the kernel removed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// The entry as the dump listed it.
    pub entry: Neighbour,
    /// The name of its interface (`None` when the kernel no longer knows the index).
    pub interface: Option<String>,
    /// The kernel's answer to `RTM_DELNEIGH`; an entry that vanished meanwhile counts as removed.
    pub outcome: Result<(), Errno>,
}

/// A neighbour entry, as `RTM_NEWNEIGH` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// `ndm_ifindex`.
    pub ifindex: i32,
    /// `ndm_state`: a `NUD_*` bit.
    pub state: u16,
    /// `ndm_flags`: `NTF_*` bits.
    pub flags: u8,
    /// `NDA_DST`.
    pub dst: IpAddr,
    /// `NDA_LLADDR` (empty when the entry has none, e.g. INCOMPLETE).
    pub lladdr: Vec<u8>,
}

/// Why no entry could be looked at.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// `socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)` failed.
    #[error("failed to open a netlink socket")]
    Open(#[source] Errno),
    /// Sending or receiving failed.
    #[error("failed to exchange netlink messages with the kernel")]
    Exchange(#[source] Errno),
    /// The kernel answered the dump with an error.
    #[error("the kernel refused to list the {family} neighbour table")]
    Dump {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// Its error.
        #[source]
        errno: Errno,
    },
    /// A message was larger than the receive buffer.
    #[error("a netlink message of {len} bytes does not fit the {RECEIVE_BUFFER}-byte buffer")]
    Truncated {
        /// Its length.
        len: usize,
    },
    /// The kernel's answer could not be decoded.
    #[error("failed to decode the kernel's answer")]
    Decode(#[from] DecodeError),
}

/// A malformed netlink answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the netlink message at byte {offset} is malformed")]
pub struct DecodeError {
    /// Where the message starts in the datagram.
    pub offset: usize,
}

const NLMSG_HDRLEN: usize = 16;
const NDMSG_LEN: usize = 12;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// Attribute types carry two flag bits (nested, network byte order) above the type.
const NLA_TYPE_MASK: u16 = 0x3fff;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `NUD_NOARP | NUD_PERMANENT`: the states `ip neigh flush` leaves alone.
const NUD_KEPT: u16 = 0x40 | 0x80;
/// `NTF_PROXY`: a proxy entry, not a neighbour.
const NTF_PROXY: u8 = 0x08;
/// The largest datagram the kernel builds for a dump (it sizes them to what `recv` offered,
/// up to 32 KiB).
const RECEIVE_BUFFER: usize = 32 * 1024;

/// The `AF_*` value of `ip`'s family.
fn family_of(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn family_name(family: u8) -> &'static str {
    if family == AF_INET { "IPv4" } else { "IPv6" }
}

fn push_header(out: &mut Vec<u8>, len: usize, kind: u16, flags: u16, seq: u32) {
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    // The port ID: 0 addresses the kernel.
    out.extend_from_slice(&0u32.to_ne_bytes());
}

fn push_ndmsg(out: &mut Vec<u8>, family: u8, ifindex: i32) {
    out.extend_from_slice(&[family, 0, 0, 0]);
    out.extend_from_slice(&ifindex.to_ne_bytes());
    // ndm_state, ndm_flags, ndm_type.
    out.extend_from_slice(&[0, 0, 0, 0]);
}

/// `RTM_GETNEIGH` with `NLM_F_DUMP`: every neighbour entry of `family` (an `AF_*` value).
pub fn dump_request(family: u8, seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(NLMSG_HDRLEN + NDMSG_LEN);
    push_header(
        &mut out,
        NLMSG_HDRLEN + NDMSG_LEN,
        RTM_GETNEIGH,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    );
    push_ndmsg(&mut out, family, 0);
    out
}

/// `RTM_DELNEIGH` of `entry` (its interface and destination), acknowledged.
pub fn delete_request(entry: &Neighbour, seq: u32) -> Vec<u8> {
    let dst: Vec<u8> = match entry.dst {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    // 4 or 16 bytes of address: the attribute needs no padding.
    let attr_len = 4 + dst.len();
    let len = NLMSG_HDRLEN + NDMSG_LEN + attr_len;
    let mut out = Vec::with_capacity(len);
    push_header(&mut out, len, RTM_DELNEIGH, NLM_F_REQUEST | NLM_F_ACK, seq);
    push_ndmsg(&mut out, family_of(entry.dst), entry.ifindex);
    out.extend_from_slice(&u16::try_from(attr_len).unwrap_or(u16::MAX).to_ne_bytes());
    out.extend_from_slice(&NDA_DST.to_ne_bytes());
    out.extend_from_slice(&dst);
    out
}

/// One message of the kernel's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The sequence number of the request it answers.
    pub seq: u32,
    /// What it says.
    pub kind: Kind,
}

/// What a message of the kernel's answer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A neighbour entry of a dump.
    Neighbour(Neighbour),
    /// The end of a dump; `errno` is 0 or the (positive) error that ended it.
    Done {
        /// The error, 0 for none.
        errno: i32,
    },
    /// `NLMSG_ERROR`: an acknowledgement (`errno` 0) or the (positive) error of a request.
    Ack {
        /// The error, 0 for none.
        errno: i32,
    },
    /// Anything else (also a neighbour message without a destination): nothing to act on.
    Other,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Netlink's 4-byte alignment.
fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// The messages of one datagram the kernel sent.
pub fn parse(datagram: &[u8]) -> Result<Vec<Message>, DecodeError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < datagram.len() {
        let bad = DecodeError { offset: at };
        let len = u32_at(datagram, at).ok_or(bad.clone())? as usize;
        if len < NLMSG_HDRLEN || at + len > datagram.len() {
            return Err(bad);
        }
        let kind = u16_at(datagram, at + 4).ok_or(bad.clone())?;
        let seq = u32_at(datagram, at + 8).ok_or(bad.clone())?;
        let payload = &datagram[at + NLMSG_HDRLEN..at + len];
        let kind = match kind {
            // The error is negative in the message; a DONE of an older kernel may have no payload.
            NLMSG_ERROR => Kind::Ack {
                errno: -i32_at(payload, 0).ok_or(bad)?,
            },
            NLMSG_DONE => Kind::Done {
                errno: -i32_at(payload, 0).unwrap_or(0),
            },
            RTM_NEWNEIGH => parse_neighbour(payload)
                .ok_or(bad)?
                .map_or(Kind::Other, Kind::Neighbour),
            _ => Kind::Other,
        };
        out.push(Message { seq, kind });
        at += align(len);
    }
    Ok(out)
}

/// An `ndmsg` and its attributes: `None` when malformed, `Some(None)` without a destination.
fn parse_neighbour(payload: &[u8]) -> Option<Option<Neighbour>> {
    let family = *payload.first()?;
    let ifindex = i32_at(payload, 4)?;
    let state = u16_at(payload, 8)?;
    let flags = *payload.get(10)?;
    let (mut dst, mut lladdr) = (None, Vec::new());
    let mut at = NDMSG_LEN;
    while at + 4 <= payload.len() {
        let len = usize::from(u16_at(payload, at)?);
        let kind = u16_at(payload, at + 2)? & NLA_TYPE_MASK;
        if len < 4 || at + len > payload.len() {
            return None;
        }
        let value = &payload[at + 4..at + len];
        match kind {
            NDA_DST => dst = ip_of(family, value),
            NDA_LLADDR => lladdr = value.to_vec(),
            _ => {}
        }
        at += align(len);
    }
    Some(dst.map(|dst| Neighbour {
        ifindex,
        state,
        flags,
        dst,
        lladdr,
    }))
}

fn ip_of(family: u8, bytes: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        AF_INET6 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// Whether flushing `ips` removes `entry`: its destination is one of them and it is neither
/// permanent, nor NOARP, nor a proxy entry.
pub fn is_flushed(entry: &Neighbour, ips: &[IpAddr]) -> bool {
    ips.contains(&entry.dst) && entry.state & NUD_KEPT == 0 && entry.flags & NTF_PROXY == 0
}

/// The kernel's (positive, non-zero) error number as an [`Errno`]; a number outside errno's
/// range (a malformed answer) reads as `EPROTO`, never as a panic in `Errno`'s constructor.
pub fn errno_of(raw: i32) -> Errno {
    if (1..=4095).contains(&raw) {
        Errno::from_raw_os_error(raw)
    } else {
        Errno::PROTO
    }
}

/// `ip neigh`'s name for a `NUD_*` state.
pub fn state_name(state: u16) -> &'static str {
    match state {
        0x00 => "NONE",
        0x01 => "INCOMPLETE",
        0x02 => "REACHABLE",
        0x04 => "STALE",
        0x08 => "DELAY",
        0x10 => "PROBE",
        0x20 => "FAILED",
        0x40 => "NOARP",
        0x80 => "PERMANENT",
        _ => "UNKNOWN",
    }
}

/// A link-layer address as `ip neigh` prints it (`aa:bb:...`), `none` when empty.
pub fn lladdr_text(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "none".to_owned();
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.join(":")
}

/// The neighbour tables of the network namespace the plugin runs in: the host's, where the
/// main plugin runs its IPAM plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kernel;

impl NeighbourTable for Kernel {
    fn flush(&self, ips: &[IpAddr]) -> Result<Vec<Removal>, FlushError> {
        if ips.is_empty() {
            return Ok(Vec::new());
        }
        let mut socket = Socket::open()?;
        let mut removals = Vec::new();
        for family in [AF_INET, AF_INET6] {
            if !ips.iter().any(|ip| family_of(*ip) == family) {
                continue;
            }
            for entry in socket.dump(family)? {
                if !is_flushed(&entry, ips) {
                    continue;
                }
                let outcome = socket.delete(&entry)?;
                let interface = u32::try_from(entry.ifindex)
                    .ok()
                    .and_then(|i| rustix::net::netdevice::index_to_name(&socket.fd, i).ok());
                removals.push(Removal {
                    entry,
                    interface,
                    outcome,
                });
            }
        }
        Ok(removals)
    }
}

/// A `NETLINK_ROUTE` socket, its next sequence number and its receive buffer.
struct Socket {
    fd: OwnedFd,
    seq: u32,
    buffer: Vec<u8>,
}

impl Socket {
    fn open() -> Result<Self, FlushError> {
        // Protocol 0 is NETLINK_ROUTE.
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(FlushError::Open)?;
        // Uninitialised: only the pages the kernel writes to are ever touched (a zeroed buffer
        // added its 32 KiB to every ADD's peak memory).
        Ok(Self {
            fd,
            seq: 0,
            buffer: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// Sends `request(seq)` with a fresh sequence number, which it returns.
    fn send(&mut self, request: impl Fn(u32) -> Vec<u8>) -> Result<u32, FlushError> {
        self.seq += 1;
        rustix::net::send(&self.fd, &request(self.seq), SendFlags::empty())
            .map_err(FlushError::Exchange)?;
        Ok(self.seq)
    }

    /// The messages of the next datagram that answer `seq`.
    fn receive(&mut self, seq: u32) -> Result<Vec<Kind>, FlushError> {
        self.buffer.clear();
        let spare = rustix::buffer::spare_capacity(&mut self.buffer);
        let (len, full) =
            rustix::net::recv(&self.fd, spare, RecvFlags::empty()).map_err(FlushError::Exchange)?;
        if full > len {
            return Err(FlushError::Truncated { len: full });
        }
        Ok(parse(&self.buffer)?
            .into_iter()
            .filter(|m| m.seq == seq)
            .map(|m| m.kind)
            .collect())
    }

    /// Every entry of `family`'s table.
    fn dump(&mut self, family: u8) -> Result<Vec<Neighbour>, FlushError> {
        let seq = self.send(|seq| dump_request(family, seq))?;
        let mut entries = Vec::new();
        loop {
            for kind in self.receive(seq)? {
                match kind {
                    Kind::Neighbour(n) => entries.push(n),
                    Kind::Done { errno: 0 } => return Ok(entries),
                    Kind::Ack { errno: 0 } | Kind::Other => {}
                    Kind::Done { errno } | Kind::Ack { errno } => {
                        return Err(FlushError::Dump {
                            family: family_name(family),
                            errno: errno_of(errno),
                        });
                    }
                }
            }
        }
    }

    /// Deletes `entry`: the kernel's answer (an entry already gone counts as deleted).
    fn delete(&mut self, entry: &Neighbour) -> Result<Result<(), Errno>, FlushError> {
        let seq = self.send(|seq| delete_request(entry, seq))?;
        loop {
            for kind in self.receive(seq)? {
                if let Kind::Ack { errno } = kind {
                    return Ok(match errno {
                        0 => Ok(()),
                        errno if errno_of(errno) == Errno::NOENT => Ok(()),
                        errno => Err(errno_of(errno)),
                    });
                }
            }
        }
    }
}

/// A neighbour table for the library's unit tests: records what it was asked to flush and
/// answers with `answer`.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Recorder {
    /// Every `ips` argument, in order.
    pub asked: std::cell::RefCell<Vec<Vec<IpAddr>>>,
    /// What each flush returns.
    pub answer: fn(&[IpAddr]) -> Result<Vec<Removal>, FlushError>,
}

#[cfg(test)]
impl Recorder {
    /// A table that has no entry for anything.
    pub(crate) fn empty() -> Self {
        Self::answering(|_| Ok(Vec::new()))
    }

    pub(crate) fn answering(answer: fn(&[IpAddr]) -> Result<Vec<Removal>, FlushError>) -> Self {
        Self {
            asked: std::cell::RefCell::new(Vec::new()),
            answer,
        }
    }
}

#[cfg(test)]
impl NeighbourTable for Recorder {
    fn flush(&self, ips: &[IpAddr]) -> Result<Vec<Removal>, FlushError> {
        self.asked.borrow_mut().push(ips.to_vec());
        (self.answer)(ips)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn header(len: u32, kind: u16, flags: u16, seq: u32) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&4242u32.to_ne_bytes());
        out
    }

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(align(out.len()), 0);
        out
    }

    /// An `RTM_NEWNEIGH` as a dump carries it: ndmsg, then `attrs`.
    fn new_neigh(
        seq: u32,
        family: u8,
        ifindex: i32,
        state: u16,
        flags: u8,
        attrs: &[Vec<u8>],
    ) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        body.extend_from_slice(&ifindex.to_ne_bytes());
        body.extend_from_slice(&state.to_ne_bytes());
        body.extend_from_slice(&[flags, 1]);
        for a in attrs {
            body.extend_from_slice(a);
        }
        let mut out = header(
            u32::try_from(16 + body.len()).unwrap(),
            RTM_NEWNEIGH,
            2,
            seq,
        );
        out.extend_from_slice(&body);
        out
    }

    fn done(seq: u32, errno: i32) -> Vec<u8> {
        let mut out = header(20, NLMSG_DONE, 2, seq);
        out.extend_from_slice(&(-errno).to_ne_bytes());
        out
    }

    fn error(seq: u32, errno: i32) -> Vec<u8> {
        let mut out = header(36, NLMSG_ERROR, 0, seq);
        out.extend_from_slice(&(-errno).to_ne_bytes());
        out.extend_from_slice(&header(28, RTM_DELNEIGH, 5, seq));
        out
    }

    const MAC: [u8; 6] = [0xaa, 0x5d, 0x8b, 0x7d, 0x61, 0x18];

    #[test]
    fn requests_are_what_ip_neigh_flush_sends() {
        let mut dump = header(28, RTM_GETNEIGH, 0x301, 7);
        dump[12..16].copy_from_slice(&0u32.to_ne_bytes());
        dump.extend_from_slice(&[AF_INET6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(dump_request(AF_INET6, 7), dump);

        let cases: [(&str, Vec<u8>); 2] = [
            ("198.19.137.3", vec![198, 19, 137, 3]),
            ("fd00::11", {
                let mut v = vec![0xfd, 0];
                v.extend_from_slice(&[0; 13]);
                v.push(0x11);
                v
            }),
        ];
        for (dst, bytes) in cases {
            let entry = Neighbour {
                ifindex: 3,
                state: 0x02,
                flags: 0,
                dst: ip(dst),
                lladdr: MAC.to_vec(),
            };
            let len = 28 + 4 + bytes.len();
            let mut want = header(u32::try_from(len).unwrap(), RTM_DELNEIGH, 0x5, 9);
            want[12..16].copy_from_slice(&0u32.to_ne_bytes());
            want.extend_from_slice(&[family_of(ip(dst)), 0, 0, 0]);
            want.extend_from_slice(&3i32.to_ne_bytes());
            want.extend_from_slice(&[0, 0, 0, 0]);
            want.extend_from_slice(&attr(NDA_DST, &bytes));
            assert_eq!(delete_request(&entry, 9), want, "{dst}");
        }
    }

    #[test]
    fn a_dump_datagram_is_read_message_by_message() {
        let v6 = "fd00::11".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let mut datagram = Vec::new();
        // An entry with its destination and MAC, and an unknown attribute with padding.
        datagram.extend(new_neigh(
            5,
            AF_INET,
            3,
            0x02,
            0,
            &[
                attr(NDA_DST, &[198, 19, 137, 3]),
                attr(NDA_LLADDR, &MAC),
                attr(8, &[1, 2, 3]),
            ],
        ));
        // INCOMPLETE: no MAC; the nested flag bit on the type is ignored.
        datagram.extend(new_neigh(
            5,
            AF_INET6,
            4,
            0x01,
            0,
            &[attr(NDA_DST | 0x8000, &v6)],
        ));
        // No destination: nothing to act on.
        datagram.extend(new_neigh(5, AF_INET, 3, 0x04, 0, &[attr(NDA_LLADDR, &MAC)]));
        // A message of another type.
        datagram.extend(header(16, 24, 0, 5));
        datagram.extend(done(5, 0));
        assert_eq!(
            parse(&datagram).unwrap(),
            vec![
                Message {
                    seq: 5,
                    kind: Kind::Neighbour(Neighbour {
                        ifindex: 3,
                        state: 0x02,
                        flags: 0,
                        dst: ip("198.19.137.3"),
                        lladdr: MAC.to_vec(),
                    })
                },
                Message {
                    seq: 5,
                    kind: Kind::Neighbour(Neighbour {
                        ifindex: 4,
                        state: 0x01,
                        flags: 0,
                        dst: ip("fd00::11"),
                        lladdr: Vec::new(),
                    })
                },
                Message {
                    seq: 5,
                    kind: Kind::Other
                },
                Message {
                    seq: 5,
                    kind: Kind::Other
                },
                Message {
                    seq: 5,
                    kind: Kind::Done { errno: 0 }
                },
            ]
        );
    }

    #[test]
    fn acknowledgements_and_errors_carry_a_positive_errno() {
        let cases: [(Vec<u8>, Kind); 4] = [
            (error(9, 0), Kind::Ack { errno: 0 }),
            (error(9, 1), Kind::Ack { errno: 1 }),
            (done(9, 16), Kind::Done { errno: 16 }),
            // An older kernel's DONE without a payload.
            (header(16, NLMSG_DONE, 2, 9), Kind::Done { errno: 0 }),
        ];
        for (datagram, kind) in cases {
            assert_eq!(parse(&datagram).unwrap(), vec![Message { seq: 9, kind }]);
        }
    }

    #[test]
    fn malformed_datagrams_are_errors_naming_the_offset() {
        let good = done(1, 0);
        let mut too_long = good.clone();
        too_long.extend(header(40, NLMSG_DONE, 2, 1));
        let mut bad_attr = new_neigh(1, AF_INET, 3, 2, 0, &[attr(NDA_DST, &[198, 19, 137, 3])]);
        // The attribute claims more than the message holds.
        bad_attr[28..30].copy_from_slice(&200u16.to_ne_bytes());
        let cases: [(Vec<u8>, usize); 5] = [
            (good[..10].to_vec(), 0),
            (header(8, NLMSG_DONE, 2, 1), 0),
            (too_long, 20),
            (header(16, NLMSG_ERROR, 0, 1), 0),
            (bad_attr, 0),
        ];
        for (datagram, offset) in cases {
            assert_eq!(
                parse(&datagram),
                Err(DecodeError { offset }),
                "{datagram:?}"
            );
        }
    }

    #[test]
    fn flush_takes_the_addresses_entries_but_not_permanent_noarp_or_proxy_ones() {
        let entry = |dst: &str, state: u16, flags: u8| Neighbour {
            ifindex: 3,
            state,
            flags,
            dst: ip(dst),
            lladdr: MAC.to_vec(),
        };
        let ips = [ip("198.19.137.3"), ip("fd00::11")];
        let cases = [
            (entry("198.19.137.3", 0x02, 0), true),
            (entry("198.19.137.3", 0x04, 0), true),
            (entry("198.19.137.3", 0x20, 0), true),
            (entry("198.19.137.3", 0x01, 0), true),
            (entry("fd00::11", 0x10, 0x80), true),
            (entry("198.19.137.4", 0x02, 0), false),
            (entry("198.19.137.3", 0x80, 0), false),
            (entry("198.19.137.3", 0x40, 0), false),
            (entry("198.19.137.3", 0x02, NTF_PROXY), false),
        ];
        for (e, flushed) in cases {
            assert_eq!(is_flushed(&e, &ips), flushed, "{e:?}");
        }
    }

    #[test]
    fn error_numbers_outside_errnos_range_read_as_a_protocol_error() {
        let cases = [
            (1, Errno::PERM),
            (2, Errno::NOENT),
            (4095, Errno::from_raw_os_error(4095)),
            (0, Errno::PROTO),
            (-1, Errno::PROTO),
            (4096, Errno::PROTO),
            (i32::MIN, Errno::PROTO),
        ];
        for (raw, errno) in cases {
            assert_eq!(errno_of(raw), errno, "{raw}");
        }
    }

    #[test]
    fn states_and_link_addresses_read_as_ip_neigh_prints_them() {
        assert_eq!(state_name(0x02), "REACHABLE");
        assert_eq!(state_name(0x04), "STALE");
        assert_eq!(state_name(0x03), "UNKNOWN");
        assert_eq!(lladdr_text(&MAC), "aa:5d:8b:7d:61:18");
        assert_eq!(lladdr_text(&[]), "none");
    }
}
