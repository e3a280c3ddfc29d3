//! Hand-made frames sent with an `AF_PACKET` raw socket from inside a namespace,
//! for hostile and odd traffic the kernel's own stack would never send, and a
//! UDP receiver to see what of it arrives. No external tools.
use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::{err, sockopt, traffic::enter_netns, Result};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
/// IEEE 802 "local experimental" `EtherType`: certainly not IP.
pub const ETH_P_EXPERIMENTAL: u16 = 0x88b5;
pub const IPPROTO_UDP: u8 = 17;
/// IPv4 "more fragments" flag in the flags/offset field.
pub const IP_MF: u16 = 0x2000;

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(err!("not a MAC address: {s:?}"));
    }
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|e| err!("not a MAC address: {s:?}: {e}"))?;
    }
    Ok(mac)
}

/// An Ethernet frame: `dst`, `src`, `EtherType`, payload (no padding, no FCS).
pub fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The Internet checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 packet, with knobs for every field a hostile sender may get wrong.
#[derive(Clone, Debug)]
pub struct Ipv4 {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub proto: u8,
    pub ident: u16,
    /// Flags and fragment offset (in 8-byte units), e.g. `IP_MF | 0`.
    pub frag: u16,
    /// Options, padded by the caller to a multiple of 4 bytes.
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
    /// IHL to write instead of the real header length (in 4-byte words).
    pub ihl: Option<u8>,
    /// Total length to write instead of the real one.
    pub total_len: Option<u16>,
}

impl Ipv4 {
    /// A UDP-carrying packet with TTL 64 and nothing odd about it.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, payload: Vec<u8>) -> Self {
        Self {
            src,
            dst,
            ttl: 64,
            proto: IPPROTO_UDP,
            ident: 0x5155,
            frag: 0,
            options: Vec::new(),
            payload,
            ihl: None,
            total_len: None,
        }
    }

    /// Header (with a correct checksum over what is written) and payload.
    pub fn build(&self) -> Vec<u8> {
        let hlen = 20 + self.options.len();
        let ihl = self.ihl.unwrap_or((hlen / 4) as u8);
        let total = self
            .total_len
            .unwrap_or(u16::try_from(hlen + self.payload.len()).unwrap_or(u16::MAX));
        let mut h = Vec::with_capacity(hlen + self.payload.len());
        h.push(0x40 | (ihl & 0x0f));
        h.push(0);
        h.extend_from_slice(&total.to_be_bytes());
        h.extend_from_slice(&self.ident.to_be_bytes());
        h.extend_from_slice(&self.frag.to_be_bytes());
        h.push(self.ttl);
        h.push(self.proto);
        h.extend_from_slice(&[0, 0]);
        h.extend_from_slice(&self.src.octets());
        h.extend_from_slice(&self.dst.octets());
        h.extend_from_slice(&self.options);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(&self.payload);
        h
    }
}

/// A UDP datagram (header + data) without a checksum (0: none, valid for IPv4).
pub fn udp(src_port: u16, dst_port: u16, data: &[u8]) -> Vec<u8> {
    let len = u16::try_from(8 + data.len()).unwrap_or(u16::MAX);
    let mut d = Vec::with_capacity(8 + data.len());
    d.extend_from_slice(&src_port.to_be_bytes());
    d.extend_from_slice(&dst_port.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(data);
    d
}

/// An `AF_PACKET` socket bound to nothing, closed on drop.
struct PacketSocket(std::os::fd::OwnedFd);

impl PacketSocket {
    fn open() -> Result<Self> {
        use std::os::fd::FromRawFd;
        // Protocol 0: the socket sends only, it receives nothing.
        // SAFETY: plain system call with constant arguments.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(err!(
                "socket(AF_PACKET, SOCK_RAW): {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: the kernel just returned this descriptor; OwnedFd closes it.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn send(&self, ifindex: i32, frame: &[u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = ifindex;
        sa.sll_halen = 6;
        if frame.len() >= 14 {
            sa.sll_protocol = u16::from_be_bytes([frame[12], frame[13]]).to_be();
            sa.sll_addr[..6].copy_from_slice(&frame[..6]);
        }
        // SAFETY: `frame` is a live buffer of the length passed; `sa` is a valid
        // sockaddr_ll of the size passed.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::from_ref(&sa).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    }
}

/// Sends every frame of `frames`, in order, out of `ifname` in the namespace at
/// `netns` (from a thread that enters it and ends). Returns how many were sent;
/// any refused send is an error naming the frame.
pub fn send_frames(netns: &Path, ifname: &str, frames: Vec<Vec<u8>>) -> Result<usize> {
    let ns = netns.to_path_buf();
    let ifname = ifname.to_string();
    thread::spawn(move || -> Result<usize> {
        enter_netns(&ns)?;
        let c_if = std::ffi::CString::new(ifname.clone()).map_err(|e| err!("{ifname}: {e}"))?;
        // SAFETY: `c_if` is a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(c_if.as_ptr()) };
        if ifindex == 0 {
            return Err(err!("no interface {ifname} in {}", ns.display()));
        }
        let ifindex = i32::try_from(ifindex).map_err(|_| err!("ifindex {ifindex}"))?;
        let sock = PacketSocket::open()?;
        for (i, f) in frames.iter().enumerate() {
            let n = sock
                .send(ifindex, f)
                .map_err(|e| err!("sending frame {i} ({} bytes) on {ifname}: {e}", f.len()))?;
            if n != f.len() {
                return Err(err!("frame {i}: sent {n} of {} bytes", f.len()));
            }
        }
        Ok(frames.len())
    })
    .join()
    .map_err(|_| err!("the frame sender panicked"))?
}

/// A UDP socket in a namespace collecting datagrams on a thread until it has
/// `want` of them or `timeout` passes.
pub struct UdpReceiver {
    pub addr: SocketAddr,
    handle: Option<JoinHandle<Result<Vec<Vec<u8>>>>>,
}

impl UdpReceiver {
    /// Binds `bind` (port 0: any) in the namespace at `netns` and starts
    /// collecting.
    pub fn start(netns: &Path, bind: SocketAddr, want: usize, timeout: Duration) -> Result<Self> {
        let ns: PathBuf = netns.to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = thread::spawn(move || -> Result<Vec<Vec<u8>>> {
            let sock = enter_netns(&ns)
                .and_then(|()| UdpSocket::bind(bind).map_err(|e| err!("binding UDP {bind}: {e}")));
            let sock = match sock {
                Ok(s) => {
                    let _ = tx.send(s.local_addr().ok());
                    s
                }
                Err(e) => {
                    let _ = tx.send(None);
                    return Err(e);
                }
            };
            let deadline = Instant::now() + timeout;
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            while got.len() < want {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
                match sock.recv(&mut buf) {
                    Ok(n) => got.push(buf[..n].to_vec()),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => return Err(err!("UDP receive: {e}")),
                }
            }
            Ok(got)
        });
        if let Ok(Some(addr)) = rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Self {
                addr,
                handle: Some(handle),
            })
        } else {
            let why = handle.join();
            Err(err!("the UDP receiver did not start: {why:?}"))
        }
    }

    /// Waits for the collecting thread: the datagrams received, in order.
    pub fn finish(mut self) -> Result<Vec<Vec<u8>>> {
        self.handle
            .take()
            .ok_or_else(|| err!("finished twice"))?
            .join()
            .map_err(|_| err!("the UDP receiver panicked"))?
    }
}

impl Drop for UdpReceiver {
    fn drop(&mut self) {
        // Bounded by the receiver's own timeout.
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// `PACKET_OUTGOING`: a frame this host sent (`sockaddr_ll.sll_pkttype`).
const PACKET_OUTGOING: u8 = 4;

/// The most frames a stopped [`Capture`] still reads from its queue.
const DRAIN_MAX: usize = 100_000;

/// A capture socket's receive buffer: a TCP transfer's GRO-merged frames
/// (64 KiB each) overflow the default (`net.core.rmem_default`) in a few
/// frames.
const CAPTURE_RCVBUF: libc::c_int = 32 << 20;

/// What a [`Capture`] keeps: frames for which it returns `true`.
pub type FrameFilter = Box<dyn Fn(&[u8]) -> bool + Send>;

/// Frames received on an interface in a namespace (an `AF_PACKET` socket bound
/// to it, IPv4 only, outgoing frames skipped), collected on a thread until
/// `want` matched or `timeout` passed.
pub struct Capture {
    handle: Option<JoinHandle<Result<Vec<Vec<u8>>>>>,
    stop: Arc<AtomicBool>,
}

impl Capture {
    /// Starts capturing on `ifname` in the namespace at `netns`; returns once the
    /// socket is bound, so that frames sent after it are seen.
    pub fn start(
        netns: &Path,
        ifname: &str,
        want: usize,
        timeout: Duration,
        keep: FrameFilter,
    ) -> Result<Self> {
        let ns = netns.to_path_buf();
        let ifname = ifname.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let handle = thread::spawn(move || -> Result<Vec<Vec<u8>>> {
            let sock = match enter_netns(&ns).and_then(|()| capture_socket(&ifname)) {
                Ok(s) => {
                    let _ = tx.send(true);
                    s
                }
                Err(e) => {
                    let _ = tx.send(false);
                    return Err(e);
                }
            };
            let deadline = Instant::now() + timeout;
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            // Once stopped, what is already queued is still read (without
            // waiting), at most `DRAIN_MAX` frames: a frame that arrived just
            // before the stop is not lost to a reader that was behind.
            let mut drained = 0usize;
            while got.len() < want && Instant::now() < deadline && drained < DRAIN_MAX {
                use std::os::fd::AsRawFd;
                let stopping = stopped.load(Ordering::Relaxed);
                if stopping {
                    drained += 1;
                }
                // SAFETY: all-zero is a valid sockaddr_ll.
                let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut sa_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                // SAFETY: `buf` and `sa` are live and writable for the sizes passed.
                let n = unsafe {
                    libc::recvfrom(
                        sock.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        if stopping { libc::MSG_DONTWAIT } else { 0 },
                        std::ptr::from_mut(&mut sa).cast(),
                        &raw mut sa_len,
                    )
                };
                let Ok(n) = usize::try_from(n) else {
                    let e = std::io::Error::last_os_error();
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) {
                        if stopping {
                            break;
                        }
                        continue;
                    }
                    return Err(err!("capture on {ifname}: {e}"));
                };
                if sa.sll_pkttype != PACKET_OUTGOING && keep(&buf[..n]) {
                    got.push(buf[..n].to_vec());
                }
            }
            // A frame the socket had no room for is not a frame the datapath
            // lost: say so, for a test that then misses one.
            match capture_drops(&sock) {
                Ok(0) => {}
                Ok(d) => eprintln!("capture on {ifname}: the socket dropped {d} frames"),
                Err(e) => eprintln!("capture on {ifname}: {e}"),
            }
            Ok(got)
        });
        if let Ok(true) = rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Self {
                handle: Some(handle),
                stop,
            })
        } else {
            let why = handle.join();
            Err(err!("the capture did not start: {why:?}"))
        }
    }

    /// Waits for the capturing thread: the frames kept, in order.
    pub fn finish(mut self) -> Result<Vec<Vec<u8>>> {
        self.handle
            .take()
            .ok_or_else(|| err!("finished twice"))?
            .join()
            .map_err(|_| err!("the capture panicked"))?
    }

    /// Stops capturing now (within 50 ms, then what is already queued is read
    /// without waiting) and returns the frames kept: for a capture that looks
    /// for frames which must not come, or that ends when the test is done.
    pub fn stop(self) -> Result<Vec<Vec<u8>>> {
        self.stop.store(true, Ordering::Relaxed);
        self.finish()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Bounded by the capture's own timeout.
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// An `AF_PACKET` socket receiving IPv4 frames of `ifname` (this thread's
/// namespace), with a 50 ms receive timeout.
fn capture_socket(ifname: &str) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let proto = ETH_P_IP.to_be();
    // SAFETY: plain system call.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if fd < 0 {
        return Err(err!(
            "socket(AF_PACKET): {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the kernel just returned this descriptor; OwnedFd closes it.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let c_if = std::ffi::CString::new(ifname).map_err(|e| err!("{ifname}: {e}"))?;
    // SAFETY: `c_if` is a NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(c_if.as_ptr()) };
    if ifindex == 0 {
        return Err(err!("no interface {ifname}"));
    }
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = i32::try_from(ifindex).map_err(|_| err!("ifindex {ifindex}"))?;
    // SAFETY: `sa` is a valid sockaddr_ll of the size passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&sa).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(err!(
            "binding AF_PACKET to {ifname}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    sockopt::set(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv, "SO_RCVTIMEO")?;
    // SO_RCVBUFFORCE (root) is not capped by net.core.rmem_max, which the
    // tests leave alone.
    sockopt::set(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        &CAPTURE_RCVBUF,
        "SO_RCVBUFFORCE",
    )?;
    Ok(fd)
}

/// How many frames the capture socket dropped for want of room
/// (`PACKET_STATISTICS`, `tpacket_stats.tp_drops`; reading resets it).
fn capture_drops(fd: &std::os::fd::OwnedFd) -> Result<u32> {
    let mut st = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    sockopt::get(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_STATISTICS,
        &mut st,
        "PACKET_STATISTICS",
    )?;
    Ok(st.tp_drops)
}

/// Whether `frame` is IPv4/UDP to `port` (any IPv4 header length).
pub fn is_udp_to(frame: &[u8], port: u16) -> bool {
    if frame.len() < 14 + 20 || u16::from_be_bytes([frame[12], frame[13]]) != ETH_P_IP {
        return false;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    frame[14 + 9] == IPPROTO_UDP
        && frame.len() >= 14 + ihl + 4
        && u16::from_be_bytes([frame[14 + ihl + 2], frame[14 + ihl + 3]]) == port
}

/// (destination MAC, source MAC, TTL, whether the IPv4 header checksum is right)
/// of an IPv4 frame.
pub fn l2_l3(frame: &[u8]) -> Result<([u8; 6], [u8; 6], u8, bool)> {
    if frame.len() < 14 + 20 {
        return Err(err!("frame of {} bytes has no IPv4 header", frame.len()));
    }
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&frame[..6]);
    src.copy_from_slice(&frame[6..12]);
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let header = frame
        .get(14..14 + ihl)
        .ok_or_else(|| err!("truncated IPv4 header"))?;
    Ok((dst, src, frame[14 + 8], checksum(header) == 0))
}

/// Sends one UDP datagram from a socket bound to `from` (port 0: any) in the
/// namespace at `netns` to `to`.
pub fn udp_send(netns: &Path, from: SocketAddr, to: SocketAddr, data: &[u8]) -> Result<()> {
    let ns = netns.to_path_buf();
    let data = data.to_vec();
    thread::spawn(move || -> Result<()> {
        enter_netns(&ns)?;
        let s = UdpSocket::bind(from).map_err(|e| err!("binding UDP {from}: {e}"))?;
        s.send_to(&data, to)
            .map_err(|e| err!("UDP {from} -> {to}: {e}"))
            .map(drop)
    })
    .join()
    .map_err(|_| err!("the UDP sender panicked"))?
}
