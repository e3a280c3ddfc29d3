//! Reachability in the style of Cyclonus: every (client pod, server pod,
//! port, protocol) probed with real traffic, all at once, and compared with
//! an expected truth table. Servers are [`crate::masq::EchoServer`]s (TCP
//! and UDP on one port); a probe is a TCP connect and echo, or a UDP
//! datagram and its echo, from a thread in the client's namespace. A probe
//! that gets no answer within [`PROBE_TIMEOUT`] is "blocked". Bounded: one
//! thread per probe, each with fixed timeouts.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{Read, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    path::PathBuf,
    thread,
    time::Duration,
};

use crate::{err, traffic::enter_netns, Result};

/// How long a probe waits for its answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(700);

/// A probe's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

/// One probe: from a namespace to an address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Probe {
    /// Names for the table: "x/a" -> "y/b" 80/TCP.
    pub from: String,
    pub to: String,
    pub proto: Proto,
    pub port: u16,
    pub from_netns: PathBuf,
    pub addr: SocketAddr,
}

/// A probe's case: names, port, protocol.
pub type Case = (String, String, u16, Proto);

fn tcp(to: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&to, PROBE_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = s.set_write_timeout(Some(PROBE_TIMEOUT));
    if s.write_all(b"ping").is_err() {
        return false;
    }
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).is_ok() && &buf == b"ping"
}

fn udp(to: SocketAddr) -> bool {
    let bind: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap_or(to)
    } else {
        "[::]:0".parse().unwrap_or(to)
    };
    let Ok(s) = UdpSocket::bind(bind) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT / 2));
    let mut buf = [0u8; 16];
    // Two tries: a datagram may be lost.
    for _ in 0..2 {
        if s.send_to(b"ping", to).is_err() {
            return false;
        }
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            if from == to && &buf[..n] == b"ping" {
                return true;
            }
        }
    }
    false
}

/// Runs every probe at once; each one's answer.
pub fn run(probes: &[Probe]) -> Result<BTreeMap<Case, bool>> {
    let handles: Vec<_> = probes
        .iter()
        .cloned()
        .map(|p| {
            thread::spawn(move || -> Result<(Case, bool)> {
                enter_netns(&p.from_netns)?;
                let ok = match p.proto {
                    Proto::Tcp => tcp(p.addr),
                    Proto::Udp => udp(p.addr),
                };
                Ok(((p.from, p.to, p.port, p.proto), ok))
            })
        })
        .collect();
    let mut out = BTreeMap::new();
    for h in handles {
        let (case, ok) = h.join().map_err(|_| err!("a probe panicked"))??;
        out.insert(case, ok);
    }
    Ok(out)
}

/// The cases where `got` differs from `want` (missing in `want`: false), as a
/// table: empty when they agree.
pub fn diff(got: &BTreeMap<Case, bool>, want: &BTreeMap<Case, bool>) -> String {
    let mut out = String::new();
    for (case, g) in got {
        let w = want.get(case).copied().unwrap_or(false);
        if *g != w {
            let (from, to, port, proto) = case;
            let _ = writeln!(
                out,
                "  {from} -> {to} {port}/{proto:?}: expected {}, got {}",
                if w { "open" } else { "blocked" },
                if *g { "open" } else { "blocked" }
            );
        }
    }
    out
}
