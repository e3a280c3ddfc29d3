//! Connected UDP sockets of a backend that went are closed, as kube-proxy
//! clears the conntrack entries of a removed UDP endpoint: the socket hook
//! pointed such a socket at the backend itself at `connect`, so nothing
//! later can move it, and a DNS client would send to a `CoreDNS` pod that is
//! gone until it opens a new socket. Each pod's network namespace (from
//! the plugin's attachment records) and the node's own are asked for their
//! UDP sockets connected to the backend (`SOCK_DIAG_BY_FAMILY`), and each is
//! destroyed (`SOCK_DESTROY`, `CONFIG_INET_DIAG_DESTROY`, which Debian's
//! kernels have): its owner's next call fails with `ECONNABORTED`.
//! Like Cilium's socket termination over netlink.
use std::{
    collections::BTreeSet,
    fs::File,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

/// Netlink's and `sock_diag`'s numbers (`include/uapi/linux/sock_diag.h`,
/// `inet_diag.h`, `netlink.h`).
const NETLINK_SOCK_DIAG: libc::c_int = 4;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_UDP: u8 = 17;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
/// `nlmsghdr`.
const HDR: usize = 16;
/// `inet_diag_req_v2`: family, protocol, ext, pad, states, `inet_diag_sockid`.
const REQ: usize = 8 + SOCKID;
/// `inet_diag_sockid`: ports, addresses, interface, cookie.
const SOCKID: usize = 48;
/// `inet_diag_msg` up to its socket id.
const MSG_ID_AT: usize = 4;
/// A connected UDP socket's state (`TCP_ESTABLISHED`), as a state bit.
const ESTABLISHED: u32 = 1 << 1;
/// Longest a namespace's dump may take.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// The network namespaces of the pods the plugin attached: the `netns` of
/// every record under `<state_dir>/<network>/attachments/`.
pub(crate) fn pod_namespaces(state_dir: &Path) -> Vec<PathBuf> {
    let out: BTreeSet<PathBuf> = crate::records::all(state_dir)
        .iter()
        .filter_map(|v| v["netns"].as_str().filter(|s| !s.is_empty()))
        .map(PathBuf::from)
        .collect();
    out.into_iter().collect()
}

/// What a pass found and did.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    pub(crate) sockets: usize,
    /// Namespaces that could not be entered or asked, and why.
    pub(crate) errors: Vec<String>,
}

/// Destroys the UDP sockets connected to any of `backends` in this
/// process's network namespace and in each of `namespaces`. Runs on a
/// thread of its own, which enters the namespaces (`setns` changes the
/// calling thread's only) and ends with the pass.
pub(crate) fn close(backends: &[SocketAddr], namespaces: &[PathBuf]) -> Closed {
    if backends.is_empty() {
        return Closed::default();
    }
    let backends = backends.to_vec();
    let namespaces = namespaces.to_vec();
    std::thread::spawn(move || {
        let mut done = Closed::default();
        let one = |done: &mut Closed, what: &str| match close_here(&backends) {
            Ok(n) => done.sockets += n,
            Err(e) => done.errors.push(format!("{what}: {e}")),
        };
        one(&mut done, "the node");
        for ns in &namespaces {
            match enter(ns) {
                Ok(()) => one(&mut done, &ns.display().to_string()),
                // A pod gone since its record was read.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => done.errors.push(format!("entering {}: {e}", ns.display())),
            }
        }
        done
    })
    .join()
    .unwrap_or_else(|_| Closed {
        sockets: 0,
        errors: vec!["the socket closing thread panicked".into()],
    })
}

/// Moves this thread into the network namespace at `path`.
fn enter(path: &Path) -> std::io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: plain syscall on an open namespace file.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The UDP sockets connected to one of `backends` in this thread's
/// namespace, destroyed: how many.
fn close_here(backends: &[SocketAddr]) -> std::io::Result<usize> {
    let nl = Diag::open()?;
    let mut n = 0;
    for family in [AF_INET, AF_INET6] {
        for id in nl.udp_connected(family)? {
            if backends.contains(&peer(family, &id)) {
                n += usize::from(nl.destroy(family, &id)?);
            }
        }
    }
    Ok(n)
}

/// The destination of a socket id (a v4-mapped IPv6 peer as IPv4).
fn peer(family: u8, id: &[u8; SOCKID]) -> SocketAddr {
    let port = u16::from_be_bytes([id[2], id[3]]);
    let dst = &id[20..36];
    let ip = if family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]))
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(dst);
        IpAddr::V6(Ipv6Addr::from(a)).to_canonical()
    };
    SocketAddr::new(ip, port)
}

/// The size of a `T` as a socket option's length.
fn socklen<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(0)
}

/// A `NETLINK_SOCK_DIAG` socket.
struct Diag(OwnedFd);

impl Diag {
    fn open() -> std::io::Result<Self> {
        // SAFETY: plain syscall; the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(RECV_TIMEOUT.as_secs()).unwrap_or(2),
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid timeval for the kernel to read.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                socklen::<libc::timeval>(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self(fd))
    }

    fn send(&self, msg: &[u8]) -> std::io::Result<()> {
        // SAFETY: `msg` is valid for its length; the kernel is the peer
        // of an unbound netlink socket.
        let n = unsafe { libc::send(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    }

    /// The ids of the connected UDP sockets of `family`.
    fn udp_connected(&self, family: u8) -> std::io::Result<Vec<[u8; SOCKID]>> {
        self.send(&request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            family,
            &[0; SOCKID],
        ))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.recv(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            let mut at = 0;
            while at + HDR <= n {
                let len =
                    u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
                let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                if len < HDR || at + len > n {
                    return Ok(out);
                }
                match kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => return Err(nl_error(&buf[at + HDR..at + len])),
                    SOCK_DIAG_BY_FAMILY => {
                        let body = &buf[at + HDR..at + len];
                        if let Some(id) = body.get(MSG_ID_AT..MSG_ID_AT + SOCKID) {
                            let mut a = [0u8; SOCKID];
                            a.copy_from_slice(id);
                            out.push(a);
                        }
                    }
                    _ => {}
                }
                // Messages are 4-byte aligned (NLMSG_ALIGN).
                at += (len + 3) & !3;
            }
        }
    }

    /// Destroys the socket `id` of `family`; `false` when it was gone.
    fn destroy(&self, family: u8, id: &[u8; SOCKID]) -> std::io::Result<bool> {
        self.send(&request(
            SOCK_DESTROY,
            NLM_F_REQUEST | NLM_F_ACK,
            family,
            id,
        ))?;
        let mut buf = [0u8; 512];
        let n = self.recv(&mut buf)?;
        if n < HDR + 4 || u16::from_ne_bytes([buf[4], buf[5]]) != NLMSG_ERROR {
            return Ok(true);
        }
        let e = nl_error(&buf[HDR..n]);
        match e.raw_os_error() {
            None | Some(0) => Ok(true),
            Some(libc::ENOENT) => Ok(false),
            _ => Err(e),
        }
    }
}

/// A netlink request for UDP sockets of `family` in the connected state,
/// `id` naming one socket (or zeros for a dump).
fn request(kind: u16, flags: u16, family: u8, id: &[u8; SOCKID]) -> Vec<u8> {
    let len = u32::try_from(HDR + REQ).unwrap_or(u32::MAX);
    let mut m = Vec::with_capacity(HDR + REQ);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // the kernel
    m.push(family);
    m.push(IPPROTO_UDP);
    m.push(0); // no extensions
    m.push(0);
    m.extend_from_slice(&ESTABLISHED.to_ne_bytes());
    m.extend_from_slice(id);
    m
}

/// The error of an `NLMSG_ERROR` body (a negative errno; 0 is an ack).
fn nl_error(body: &[u8]) -> std::io::Error {
    let code = body
        .get(..4)
        .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    std::io::Error::from_raw_os_error(-code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_a_header_and_an_inet_diag_req_v2() {
        let m = request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 2, &[7; SOCKID]);
        assert_eq!(m.len(), 16 + 56);
        assert_eq!(u32::from_ne_bytes([m[0], m[1], m[2], m[3]]), 72);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 21);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 5);
        assert_eq!(&m[16..20], &[2, 17, 0, 0]);
        assert_eq!(u32::from_ne_bytes([m[20], m[21], m[22], m[23]]), 2);
        assert!(m[24..].iter().all(|b| *b == 7));
    }

    #[test]
    fn peers_are_read_from_the_socket_id() {
        let mut id = [0u8; SOCKID];
        id[2..4].copy_from_slice(&53u16.to_be_bytes());
        id[20..24].copy_from_slice(&[10, 88, 0, 7]);
        assert_eq!(
            peer(AF_INET, &id),
            "10.88.0.7:53".parse::<SocketAddr>().unwrap()
        );
        // A v4-mapped peer of an IPv6 socket is the IPv4 backend.
        let mapped: Ipv6Addr = "::ffff:10.88.0.7".parse().unwrap();
        id[20..36].copy_from_slice(&mapped.octets());
        assert_eq!(
            peer(AF_INET6, &id),
            "10.88.0.7:53".parse::<SocketAddr>().unwrap()
        );
    }
}
