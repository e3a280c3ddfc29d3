//! Building blocks of the masquerade tests: an external host with no route back to
//! the pods (so only masquerade can bring replies home), a router with a smaller
//! MTU in between, echo servers that note who talked to them, sockets made in a
//! namespace (with a chosen source port) and used from any thread, an ICMP echo
//! over a raw socket, and `sluicectl nat list`. No external tools; every wait is
//! bounded.
use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    err, exec,
    fixtures::{uplink, EXT_IF},
    host::{self, Host},
    raw::checksum,
    sockopt,
    traffic::{enter_netns, IO_TIMEOUT},
    Node, Result,
};

/// The router's address on the node's wire ([`routed_external_host`]).
pub const ROUTER_IP: &str = "192.168.50.2";
/// The router's end of the wire to the far host.
pub const ROUTER_FAR_IF: &str = "r1";
/// The router's address on the far wire.
pub const ROUTER_FAR_IP: &str = "192.168.51.1";
/// The far host's address behind the router.
pub const FAR_IP: &str = "192.168.51.2";

/// Longest an [`EchoServer`] runs, whatever the test does.
pub const SERVER_LIFETIME: Duration = Duration::from_mins(4);
/// An echo connection that sees nothing for this long is closed by the server.
const CONN_IDLE: Duration = Duration::from_mins(1);

/// An external host wired to `node` as [`crate::fixtures::external_host`] does
/// (the node's `up0` 192.168.50.1/24 with a default route via the host's `ext0`
/// 192.168.50.2/24) but with no route to the pods: replies reach a pod only when
/// masquerade brings them.
pub fn masq_external_host(node: &Node) -> Result<Host> {
    let ext = Host::new()?;
    uplink(EXT_IF).connect(node.name(), ext.name(), None)?;
    Ok(ext)
}

/// A router and a host behind it: [`routed_external_host`].
pub struct Routed {
    pub router: Host,
    pub far: Host,
}

/// `node`'s `up0` (192.168.50.1/24, default route via the router) to a router's
/// `r0` (192.168.50.2/24); the router's `r1` (192.168.51.1/24, MTU `far_mtu`) to
/// a far host's `ext0` (192.168.51.2/24, MTU `far_mtu`), whose only route off its
/// link is 192.168.50.0/24 via the router, advertising a TCP MSS of 1460 (so a
/// pod's 1500-byte segments meet the router's smaller link and its
/// "fragmentation needed"). The router forwards; nobody routes to the pods.
pub fn routed_external_host(node: &Node, far_mtu: u32) -> Result<Routed> {
    let router = Host::new()?;
    let far = Host::new()?;
    uplink("r0").connect(node.name(), router.name(), None)?;
    host::wire(
        router.name(),
        ROUTER_FAR_IF,
        &format!("{ROUTER_FAR_IP}/24"),
        far.name(),
        EXT_IF,
        &format!("{FAR_IP}/24"),
    )?;
    let mtu = far_mtu.to_string();
    router.ip(&["link", "set", ROUTER_FAR_IF, "mtu", &mtu])?;
    far.ip(&["link", "set", EXT_IF, "mtu", &mtu])?;
    sysctl(&router.netns_path(), "net.ipv4.ip_forward", "1")?;
    far.ip(&[
        "route",
        "add",
        "192.168.50.0/24",
        "via",
        ROUTER_FAR_IP,
        "advmss",
        "1460",
    ])?;
    Ok(Routed { router, far })
}

/// The IPv6 addresses of [`routed_external_host6`]: the node's uplink, the
/// router on the node's wire and on the far wire, the far host.
pub const NODE6_ROUTED: &str = "fd00:50::1";
pub const ROUTER6_IP: &str = "fd00:50::2";
pub const ROUTER6_FAR_IP: &str = "fd00:51::1";
pub const FAR6_IP: &str = "fd00:51::2";

/// [`routed_external_host`] with IPv6 too: the node's `up0` `fd00:50::1/64`
/// (default route via the router's `fd00:50::2`), the far host `fd00:51::2/64`
/// behind the router's `fd00:51::1/64` on the `far_mtu` link, its route back to
/// the node's wire advertising a TCP MSS of 1440 (a pod's 1500-byte packets
/// meet the smaller link and the router's Packet Too Big). The router forwards
/// IPv6 and answers without rate limit; nobody routes to the pods.
pub fn routed_external_host6(node: &Node, far_mtu: u32) -> Result<Routed> {
    let r = routed_external_host(node, far_mtu)?;
    let nodad = |h: &str, addr: &str, dev: &str| {
        host::ip(
            h,
            &["addr", "add", &format!("{addr}/64"), "dev", dev, "nodad"],
        )
    };
    nodad(node.name(), NODE6_ROUTED, crate::fixtures::UPLINK)?;
    nodad(r.router.name(), ROUTER6_IP, "r0")?;
    nodad(r.router.name(), ROUTER6_FAR_IP, ROUTER_FAR_IF)?;
    nodad(r.far.name(), FAR6_IP, EXT_IF)?;
    host::ip(
        node.name(),
        &["-6", "route", "add", "default", "via", ROUTER6_IP],
    )?;
    sysctl(&r.router.netns_path(), "net.ipv6.conf.all.forwarding", "1")?;
    sysctl(&r.router.netns_path(), "net.ipv6.icmp.ratelimit", "0")?;
    r.far.ip(&[
        "-6",
        "route",
        "add",
        "fd00:50::/64",
        "via",
        ROUTER6_FAR_IP,
        "advmss",
        "1440",
    ])?;
    Ok(r)
}

/// Sets a sysctl in the namespace at `netns` (one of the test's own).
pub fn sysctl(netns: &Path, key: &str, value: &str) -> Result<()> {
    exec::tool(
        Some(netns),
        "sysctl",
        &["-q", "-w", &format!("{key}={value}")],
    )
    .map(drop)
}

/// `sluicectl nat list --json filters...`: one object per flow.
pub fn nat_list(node: &Node, filters: &[&str]) -> Result<Vec<Value>> {
    let mut args = vec!["nat", "list", "--json"];
    args.extend_from_slice(filters);
    let v = node.sluicectl_json(&args)?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("nat list printed no JSON array: {v}"))
}

/// `sluice-node sweep` on `node`'s datapath: the NAT sweep from the node
/// agent (killed when dropped).
pub fn sweep_agent(node: &Node) -> Result<exec::Running> {
    node_agent(node, "sweep")
}

/// `sluice-node <duty>` on `node`'s datapath, in its namespace (killed when
/// dropped).
pub fn node_agent(node: &Node, duty: &str) -> Result<exec::Running> {
    let bin = crate::sluice_node_bin()?;
    exec::spawn(
        Some(&node.netns_path()),
        &bin,
        &[duty, "--pin-root", &node.pin_root().display().to_string()],
        &[],
        b"",
    )
}

/// Polls `cond` every 100 ms for at most `timeout`; whether it came to hold.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `f` on a thread in the network namespace at `netns` and returns what it
/// returned. Sockets made there stay in that namespace and may be used from any
/// thread afterwards.
pub fn in_netns<T, F>(netns: &Path, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let ns = netns.to_path_buf();
    thread::spawn(move || {
        enter_netns(&ns)?;
        f()
    })
    .join()
    .map_err(|_| err!("a thread in {} panicked", netns.display()))?
}

fn last_os_error(what: &str) -> crate::Error {
    err!("{what}: {}", std::io::Error::last_os_error())
}

/// `a` as the kernel takes an IPv4 socket address.
pub fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = a.port().to_be();
    sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
    sa
}

/// `a` as a socket address for the system calls (`sockaddr_in` or
/// `sockaddr_in6`) and its length.
fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe {
                std::ptr::from_mut(&mut ss)
                    .cast::<libc::sockaddr_in>()
                    .write(sockaddr_in(a));
            }
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: all-zero is a valid sockaddr_in6.
            let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = a.port().to_be();
            sa.sin6_addr.s6_addr = a.ip().octets();
            sa.sin6_scope_id = a.scope_id();
            // SAFETY: as above, for sockaddr_in6.
            unsafe {
                std::ptr::from_mut(&mut ss)
                    .cast::<libc::sockaddr_in6>()
                    .write(sa);
            }
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn timeval(d: Duration) -> libc::timeval {
    libc::timeval {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(d.subsec_micros()),
    }
}

/// A TCP connection made in the namespace at `netns`, from `bind` when given
/// (`SO_REUSEADDR`, so a port a closed connection still holds can be taken
/// again), to `to`, IPv4 or IPv6 (`bind` of the same family). Connect, read
/// and write time out after [`IO_TIMEOUT`].
pub fn tcp_connect(netns: &Path, bind: Option<SocketAddr>, to: SocketAddr) -> Result<TcpStream> {
    if bind.is_some_and(|b| b.is_ipv4() != to.is_ipv4()) {
        return Err(err!("binding {bind:?} to connect to {to}: not one family"));
    }
    in_netns(netns, move || {
        let family = if to.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain system call.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(last_os_error(&format!("socket({family}, SOCK_STREAM)")));
        }
        // SAFETY: the kernel just returned this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        sockopt::set(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &1i32,
            "SO_REUSEADDR",
        )?;
        // A blocking connect gives up after SO_SNDTIMEO.
        sockopt::set(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &timeval(IO_TIMEOUT),
            "SO_SNDTIMEO",
        )?;
        if let Some(b) = bind {
            let (sa, len) = sockaddr(b);
            // SAFETY: `sa` holds a valid socket address of the length passed.
            let r = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::from_ref(&sa).cast(), len) };
            if r < 0 {
                return Err(last_os_error(&format!("binding TCP {b}")));
            }
        }
        let (sa, len) = sockaddr(to);
        // SAFETY: as above.
        let r = unsafe { libc::connect(fd.as_raw_fd(), std::ptr::from_ref(&sa).cast(), len) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            // A blocking connect cut short by SO_SNDTIMEO says EINPROGRESS.
            let why = if e.raw_os_error() == Some(libc::EINPROGRESS) {
                format!("no answer within {IO_TIMEOUT:?}")
            } else {
                e.to_string()
            };
            return Err(err!("connecting {bind:?} -> {to}: {why}"));
        }
        let s = TcpStream::from(fd);
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(s)
    })
}

/// A TCP listener on `bind` in the namespace at `netns`.
pub fn tcp_listen(netns: &Path, bind: SocketAddr) -> Result<TcpListener> {
    in_netns(netns, move || {
        TcpListener::bind(bind).map_err(|e| err!("listening on TCP {bind}: {e}"))
    })
}

/// The next connection of `l`, waiting at most [`IO_TIMEOUT`]; reads and writes
/// time out after [`IO_TIMEOUT`].
pub fn tcp_accept(l: &TcpListener) -> Result<TcpStream> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(err!("no connection within {IO_TIMEOUT:?}"));
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

/// Closes `s` with a reset (`SO_LINGER` 0): no FIN, no `TIME_WAIT`.
pub fn tcp_abort(s: TcpStream) -> Result<()> {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    sockopt::set(&s, libc::SOL_SOCKET, libc::SO_LINGER, &l, "SO_LINGER")?;
    drop(s);
    Ok(())
}

/// Writes `data` on `from` and reads exactly as many bytes on `to`, which must
/// be the same: one direction of a connection whose two ends the test holds.
pub fn tcp_send_over(from: &TcpStream, to: &TcpStream, data: &[u8]) -> Result<()> {
    (&*from)
        .write_all(data)
        .map_err(|e| err!("writing {} bytes: {e}", data.len()))?;
    let mut back = vec![0u8; data.len()];
    (&*to)
        .read_exact(&mut back)
        .map_err(|e| err!("reading {} bytes on the other end: {e}", data.len()))?;
    if back != data {
        return Err(err!("{} bytes arrived changed", data.len()));
    }
    Ok(())
}

/// Deterministic payload of an echo: byte `i` is `(i * 7 + salt) mod 251`.
pub fn payload(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + usize::from(salt)) % 251) as u8)
        .collect()
}

/// Sends `bytes` bytes on `s` while reading the echo on this thread; the echo
/// must be exactly what was sent. Bounded by `s`'s read timeout: a read that
/// gives up shuts the socket down, which ends a writer stuck on a stalled path.
pub fn tcp_echo_on(s: &TcpStream, bytes: usize, salt: u8) -> Result<()> {
    let data = payload(bytes, salt);
    let mut w = s.try_clone()?;
    let to_send = data.clone();
    let writer = thread::spawn(move || w.write_all(&to_send));
    let mut back = vec![0u8; bytes];
    let read = (&*s).read_exact(&mut back);
    if read.is_err() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let written = writer.join().map_err(|_| err!("the writer panicked"))?;
    let peer = s.peer_addr().map_or_else(|_| "?".into(), |p| p.to_string());
    read.map_err(|e| err!("reading the echo of {bytes} bytes from {peer}: {e}"))?;
    written.map_err(|e| err!("writing {bytes} bytes to {peer}: {e}"))?;
    if back != data {
        return Err(err!("the echo from {peer} differs from what was sent"));
    }
    Ok(())
}

/// The path MTU the kernel knows for a connected socket (`IP_MTU`).
pub fn path_mtu(s: &impl AsRawFd) -> Result<u32> {
    mtu_opt(s, libc::IPPROTO_IP, libc::IP_MTU)
}

/// The path MTU an IPv6 socket knows (`IPV6_MTU`, ipv6(7)).
pub fn path_mtu6(s: &impl AsRawFd) -> Result<u32> {
    mtu_opt(s, libc::IPPROTO_IPV6, libc::IPV6_MTU)
}

fn mtu_opt(s: &impl AsRawFd, level: i32, opt: i32) -> Result<u32> {
    let mut mtu: i32 = 0;
    sockopt::get(
        s,
        level,
        opt,
        &mut mtu,
        &format!("(level {level}, {opt}) for the MTU"),
    )?;
    u32::try_from(mtu).map_err(|_| err!("path MTU {mtu}"))
}

/// A UDP socket bound to `bind` (port 0: any) in the namespace at `netns`.
pub fn udp_socket(netns: &Path, bind: SocketAddr) -> Result<UdpSocket> {
    in_netns(netns, move || {
        UdpSocket::bind(bind).map_err(|e| err!("binding UDP {bind}: {e}"))
    })
}

/// Makes every datagram `s` sends carry a destination-options extension
/// header (RFC 8200 4.6) of eight bytes: next header and length (the kernel
/// fills them in), then a `PadN` option of four bytes.
pub fn set_dstopts(s: &UdpSocket) -> Result<()> {
    let opts: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
    sockopt::set(
        s,
        libc::IPPROTO_IPV6,
        libc::IPV6_DSTOPTS,
        &opts,
        "IPV6_DSTOPTS",
    )
}

/// Sends `data` to `to` and waits up to `wait` for the same bytes back from
/// `to`, `tries` times at most. Returns the attempt that got the echo (1-based).
pub fn udp_echo_on(
    s: &UdpSocket,
    to: SocketAddr,
    data: &[u8],
    tries: u32,
    wait: Duration,
) -> Result<u32> {
    let mut buf = vec![0u8; 65536];
    for attempt in 1..=tries {
        s.send_to(data, to)
            .map_err(|e| err!("UDP {:?} -> {to}: {e}", s.local_addr().ok()))?;
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s.set_read_timeout(Some(left))?;
            match s.recv_from(&mut buf) {
                Ok((n, from)) if from == to && buf[..n] == *data => return Ok(attempt),
                // Something else (a late echo of another datagram): keep waiting.
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => {
                    return Err(err!(
                        "UDP receive on {:?} from {to}: {e}",
                        s.local_addr().ok()
                    ))
                }
            }
        }
    }
    Err(err!(
        "no echo from {to} to {:?} after {tries} tries of {wait:?}",
        s.local_addr().ok()
    ))
}

/// Who talked to an [`EchoServer`], in the order they came.
#[derive(Clone, Debug, Default)]
pub struct Peers {
    /// One per accepted connection.
    pub tcp: Vec<SocketAddr>,
    /// One per datagram.
    pub udp: Vec<SocketAddr>,
}

impl Peers {
    /// The distinct UDP sources.
    pub fn udp_sources(&self) -> BTreeSet<SocketAddr> {
        self.udp.iter().copied().collect()
    }
}

/// A TCP and a UDP echo server on the same address and port in a namespace,
/// serving every connection and datagram until dropped (at most
/// [`SERVER_LIFETIME`]), noting each peer's address.
pub struct EchoServer {
    /// Where it listens (TCP and UDP).
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Peers>>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServer {
    /// Starts both servers on `bind` in the namespace at `netns` (port 0: a free
    /// port, the same for both).
    pub fn start(netns: &Path, bind: SocketAddr) -> Result<Self> {
        let (listener, udp) = in_netns(netns, move || {
            let l = TcpListener::bind(bind).map_err(|e| err!("binding TCP {bind}: {e}"))?;
            let at = l.local_addr()?;
            let u = UdpSocket::bind(at).map_err(|e| err!("binding UDP {at}: {e}"))?;
            Ok((l, u))
        })?;
        let addr = listener.local_addr()?;
        // Room for bursts of datagrams (root may exceed rmem_max).
        let size: i32 = 4 << 20;
        sockopt::set(
            &udp,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &size,
            "SO_RCVBUFFORCE",
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Peers::default()));
        let started = Instant::now();
        let mut threads = Vec::new();
        {
            let (stop, peers) = (Arc::clone(&stop), Arc::clone(&peers));
            threads.push(thread::spawn(move || {
                serve_udp(&udp, &stop, &peers, started);
            }));
        }
        {
            let (stop, peers) = (Arc::clone(&stop), Arc::clone(&peers));
            threads.push(thread::spawn(move || {
                serve_tcp(&listener, &stop, &peers, started);
            }));
        }
        Ok(Self {
            addr,
            stop,
            peers,
            threads,
        })
    }

    /// What the servers saw so far.
    pub fn peers(&self) -> Peers {
        match self.peers.lock() {
            Ok(p) => p.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn running(stop: &AtomicBool, started: Instant) -> bool {
    !stop.load(Ordering::Relaxed) && started.elapsed() < SERVER_LIFETIME
}

fn note(peers: &Mutex<Peers>, f: impl FnOnce(&mut Peers)) {
    match peers.lock() {
        Ok(mut p) => f(&mut p),
        Err(p) => f(&mut p.into_inner()),
    }
}

fn serve_udp(s: &UdpSocket, stop: &AtomicBool, peers: &Mutex<Peers>, started: Instant) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0u8; 65536];
    while running(stop, started) {
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            note(peers, |p| p.udp.push(from));
            let _ = s.send_to(&buf[..n], from);
        }
    }
}

fn serve_tcp(l: &TcpListener, stop: &Arc<AtomicBool>, peers: &Mutex<Peers>, started: Instant) {
    if l.set_nonblocking(true).is_err() {
        return;
    }
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while running(stop, started) {
        match l.accept() {
            Ok((s, from)) => {
                note(peers, |p| p.tcp.push(from));
                let stop = Arc::clone(stop);
                conns.push(thread::spawn(move || echo_conn(s, &stop, started)));
            }
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

/// Echoes one connection until its end, an error, [`CONN_IDLE`] without data, or
/// the server stops.
fn echo_conn(mut s: TcpStream, stop: &AtomicBool, started: Instant) {
    if s.set_nonblocking(false).is_err()
        || s.set_read_timeout(Some(Duration::from_millis(100)))
            .is_err()
        || s.set_write_timeout(Some(IO_TIMEOUT)).is_err()
    {
        return;
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut last = Instant::now();
    while running(stop, started) && last.elapsed() < CONN_IDLE {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
                last = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// A raw ICMP socket in a namespace sending echo requests with an identifier of
/// its choosing (the kernel leaves a raw socket's identifier alone).
pub struct Pinger {
    fd: OwnedFd,
}

/// ICMP echo request / reply types.
const ICMP_ECHO: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;

/// An ICMP echo request (type 8) with `ident`, `seq` and `data`.
pub fn icmp_echo_request(ident: u16, seq: u16, data: &[u8]) -> Vec<u8> {
    let mut m = vec![ICMP_ECHO, 0, 0, 0];
    m.extend_from_slice(&ident.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(data);
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

impl AsRawFd for Pinger {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl Pinger {
    /// Opens the socket in the namespace at `netns`.
    pub fn new(netns: &Path) -> Result<Self> {
        Ok(Self {
            fd: raw_icmp_socket(netns, libc::AF_INET, libc::IPPROTO_ICMP)?,
        })
    }

    /// Sends one echo request to `dst` and does not wait.
    pub fn send(&self, dst: Ipv4Addr, ident: u16, seq: u16) -> Result<()> {
        let msg = icmp_echo_request(ident, seq, &payload(48, seq as u8));
        let sa = sockaddr_in(SocketAddrV4::new(dst, 0));
        // SAFETY: `msg` and `sa` are live for the sizes passed.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                std::ptr::from_ref(&sa).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(last_os_error(&format!("sending an echo request to {dst}")));
        }
        Ok(())
    }

    /// The first ICMP packet (IP header included) for which `want` holds,
    /// waiting at most `wait`.
    pub fn recv_matching(&self, wait: Duration, want: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            // SAFETY: `buf` is live and writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else { continue };
            if want(&buf[..n]) {
                return Some(buf[..n].to_vec());
            }
        }
        None
    }

    /// Sends one echo request to `dst` and waits up to `wait` for its reply
    /// (from `dst`, same identifier, sequence and data), `tries` times at most.
    pub fn ping(
        &self,
        dst: Ipv4Addr,
        ident: u16,
        seq: u16,
        tries: u32,
        wait: Duration,
    ) -> Result<()> {
        let data = payload(48, seq as u8);
        let msg = icmp_echo_request(ident, seq, &data);
        let sa = sockaddr_in(SocketAddrV4::new(dst, 0));
        let answered = echo_exchange(&self.fd, &msg, &sa, tries, wait, |p| {
            // A raw socket receives the IP header too.
            if p.len() < 20 {
                return false;
            }
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let Some(icmp) = p.get(ihl..) else {
                return false;
            };
            p[12..16] == dst.octets()
                && icmp.len() == msg.len()
                && icmp[0] == ICMP_ECHO_REPLY
                && icmp[4..8] == msg[4..8]
                && icmp[8..] == data[..]
        })
        .map_err(|e| err!("sending an echo request to {dst}: {e}"))?;
        if answered {
            return Ok(());
        }
        Err(err!(
            "no echo reply from {dst} for identifier {ident} sequence {seq} after {tries} tries"
        ))
    }
}

/// A raw ICMP (`family` `AF_INET`) or ICMPv6 socket in the namespace at
/// `netns`, its receive timeout 50 ms.
fn raw_icmp_socket(netns: &Path, family: libc::c_int, proto: libc::c_int) -> Result<OwnedFd> {
    in_netns(netns, move || {
        // SAFETY: plain system call.
        let fd = unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(last_os_error(&format!(
                "socket({family}, SOCK_RAW, {proto})"
            )));
        }
        // SAFETY: the kernel just returned this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        sockopt::set(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &timeval(Duration::from_millis(50)),
            "SO_RCVTIMEO",
        )?;
        Ok(fd)
    })
}

/// Sends `msg` to `sa` on the raw socket `fd` and waits up to `wait` for a
/// packet `reply` accepts, `tries` times at most: whether one came.
fn echo_exchange<A>(
    fd: &OwnedFd,
    msg: &[u8],
    sa: &A,
    tries: u32,
    wait: Duration,
    reply: impl Fn(&[u8]) -> bool,
) -> std::io::Result<bool> {
    let mut buf = vec![0u8; 2048];
    for _ in 0..tries {
        // SAFETY: `msg` and `sa` are live for the sizes passed.
        let n = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                std::ptr::from_ref(sa).cast(),
                std::mem::size_of::<A>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            // SAFETY: `buf` is live and writable for its length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else { continue };
            if reply(&buf[..n]) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The IPv4 source and destination of an Ethernet frame, if it carries IPv4.
pub fn ipv4_addrs(frame: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    if frame.len() < 14 + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let a = |o: usize| Ipv4Addr::new(frame[o], frame[o + 1], frame[o + 2], frame[o + 3]);
    Some((a(14 + 12), a(14 + 16)))
}

/// Whether `ip` is an IPv4 address.
pub fn ipv4_of(ip: IpAddr) -> Result<Ipv4Addr> {
    match ip {
        IpAddr::V4(v) => Ok(v),
        IpAddr::V6(_) => Err(err!("{ip} is not IPv4")),
    }
}

/// Whether an Ethernet frame's IPv4 header checksum and its TCP, UDP or ICMP
/// checksum are right (`None`: not such a frame, or a fragment). A UDP checksum
/// of 0 (none) counts as right. Only meaningful for frames sent with complete
/// checksums (TX checksum offload off on the sender).
pub fn checksums_ok(frame: &[u8]) -> Option<bool> {
    let ip = frame.get(14..)?;
    if frame.get(12..14)? != [0x08, 0x00] || ip.len() < 20 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
    if frag != 0 || total < ihl || total > ip.len() {
        return None;
    }
    let header_ok = checksum(&ip[..ihl]) == 0;
    let l4 = &ip[ihl..total];
    let proto = ip[9];
    let l4_ok = match proto {
        1 => checksum(l4) == 0,
        6 | 17 => {
            if proto == 17 && l4.get(6..8)? == [0, 0] {
                true
            } else {
                let mut pseudo = Vec::with_capacity(12 + l4.len());
                pseudo.extend_from_slice(&ip[12..20]);
                pseudo.extend_from_slice(&[0, proto]);
                pseudo.extend_from_slice(&u16::try_from(l4.len()).ok()?.to_be_bytes());
                pseudo.extend_from_slice(l4);
                checksum(&pseudo) == 0
            }
        }
        _ => return None,
    };
    Some(header_ok && l4_ok)
}

/// A raw ICMPv6 socket in a namespace sending echo requests with an identifier
/// of its choosing (the kernel fills in the checksum of raw ICMPv6 sockets,
/// RFC 3542 3.1).
pub struct Pinger6 {
    fd: OwnedFd,
}

impl Pinger6 {
    /// Opens the socket in the namespace at `netns`.
    pub fn new(netns: &Path) -> Result<Self> {
        Ok(Self {
            fd: raw_icmp_socket(netns, libc::AF_INET6, libc::IPPROTO_ICMPV6)?,
        })
    }

    /// Sends an echo request (type 128) to `dst` and waits up to `wait` for its
    /// reply (type 129, same identifier, sequence and data), `tries` times at most.
    pub fn ping(
        &self,
        dst: std::net::Ipv6Addr,
        ident: u16,
        seq: u16,
        tries: u32,
        wait: Duration,
    ) -> Result<()> {
        let data = payload(48, seq as u8);
        let mut msg = vec![128, 0, 0, 0];
        msg.extend_from_slice(&ident.to_be_bytes());
        msg.extend_from_slice(&seq.to_be_bytes());
        msg.extend_from_slice(&data);
        // SAFETY: all-zero is a valid sockaddr_in6.
        let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sa.sin6_addr.s6_addr = dst.octets();
        // A raw ICMPv6 socket receives from the ICMPv6 header on.
        let answered = echo_exchange(&self.fd, &msg, &sa, tries, wait, |m| {
            m.len() >= 8
                && m[0] == 129
                && m[4..6] == ident.to_be_bytes()
                && m[6..8] == seq.to_be_bytes()
                && m[8..] == data[..]
        })
        .map_err(|e| err!("sending an echo request to {dst}: {e}"))?;
        if answered {
            return Ok(());
        }
        Err(err!(
            "no echo reply from {dst} (identifier {ident}, sequence {seq})"
        ))
    }
}
