//! `cargo xtask conn-loop serve|connect|ping`: the new-connections-per-second
//! figure, and the round trips where sockperf cannot go (IPv6: Debian 12's
//! sockperf 3.7 takes IPv4 addresses only). No Debian package measures new
//! connections (netperf's `TCP_CRR` is not packaged), so `connect` is the same
//! loop: connect, one byte each way, the server closes first (its side keeps
//! `TIME_WAIT`, so the client's ports free up at once), repeat. `ping` is
//! sockperf's ping-pong: one connection, one message at a time, each round trip
//! timed from the send to the whole echo read. `flood` sends datagrams to
//! thousands of ports, a new flow each (what another pod does to the
//! masquerade table in the flood figure). Bounded in time and count; run by
//! `bench` inside the namespaces, pinned like the other figures. IPv4 or IPv6.
use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::cli::{ConnLoopArgs, ConnLoopMode};

/// Per-connection limit: a connection that takes longer is counted as failed.
const STEP: Duration = Duration::from_secs(2);

pub(super) fn run(a: &ConnLoopArgs) -> Result<()> {
    match a.mode {
        ConnLoopMode::Serve => serve(a.addr, a.secs, a.echo),
        ConnLoopMode::Connect => {
            let (done, failed, secs) = connect(a.addr, a.secs, a.max);
            println!(r#"{{"connections":{done},"failed":{failed},"seconds":{secs}}}"#);
            Ok(())
        }
        ConnLoopMode::Flood => {
            let sent = flood(a.addr, a.secs, a.max)?;
            println!(r#"{{"sent":{sent}}}"#);
            Ok(())
        }
        ConnLoopMode::Ping => {
            let rtts = ping(a.addr, a.secs, usize::try_from(a.size)?)?;
            let n = rtts.len();
            let (p50, p99) = super::measure::p50_p99(rtts);
            println!(r#"{{"roundTrips":{n},"p50Us":{p50},"p99Us":{p99}}}"#);
            Ok(())
        }
    }
}

/// `max` datagrams to `addr`'s address, ports from `addr`'s up (50,000 of
/// them, then again), in batches of 100 spread evenly over `secs`.
fn flood(addr: SocketAddr, secs: u32, max: u64) -> Result<u64> {
    const BATCH: u64 = 100;
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let s = std::net::UdpSocket::bind(bind).context("binding the flood's socket")?;
    let start = Instant::now();
    let batches = max.div_ceil(BATCH).max(1);
    let step = Duration::from_secs(u64::from(secs)) / u32::try_from(batches)?;
    let mut sent = 0u64;
    for b in 0..batches {
        for i in 0..BATCH.min(max - b * BATCH) {
            let n = b * BATCH + i;
            let port = u16::try_from(u64::from(addr.port()) + n % 50_000).unwrap_or(u16::MAX);
            // A full socket buffer only loses a datagram.
            if s.send_to(b"flood", SocketAddr::new(addr.ip(), port))
                .is_ok()
            {
                sent += 1;
            }
        }
        let due = step * u32::try_from(b + 1)?;
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Ok(sent)
}

/// Accepts, answers one byte, closes (with `echo`: echoes everything until the
/// client closes); exits after `secs` plus a margin (bench also kills it when
/// done).
fn serve(addr: SocketAddr, secs: u32, echo: bool) -> Result<()> {
    let l = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    // Blocking accept (no polling delay in the measured path); a watchdog ends
    // the process.
    let limit = Duration::from_secs(u64::from(secs) + 30);
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        std::process::exit(0);
    });
    loop {
        let (s, _) = l.accept().context("accept")?;
        answer(s, echo)?;
    }
}

/// One accepted connection: one byte answered, then closed first (with
/// `echo`: everything echoed until the client closes).
fn answer(mut s: TcpStream, echo: bool) -> Result<()> {
    s.set_read_timeout(Some(STEP))?;
    if echo {
        s.set_nodelay(true)?;
        let mut b = vec![0u8; 65_536];
        while let Ok(n @ 1..) = s.read(&mut b) {
            if s.write_all(&b[..n]).is_err() {
                break;
            }
        }
        return Ok(());
    }
    let mut b = [0u8; 1];
    if s.read_exact(&mut b).is_ok() {
        let _ = s.write_all(&b);
    }
    // Server closes first: TIME_WAIT stays on this side.
    let _ = s.shutdown(Shutdown::Both);
    Ok(())
}

/// Connections completed (connect, request, response, the server's close seen)
/// in `secs` or until `max`: (done, failed, elapsed seconds).
fn connect(addr: SocketAddr, secs: u32, max: u64) -> (u64, u64, f64) {
    let start = Instant::now();
    let end = start + Duration::from_secs(u64::from(secs));
    let (mut done, mut failed) = (0u64, 0u64);
    while Instant::now() < end && done + failed < max {
        if one(addr).is_ok() {
            done += 1;
        } else {
            failed += 1;
        }
    }
    (done, failed, start.elapsed().as_secs_f64())
}

fn one(addr: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, STEP)?;
    s.set_read_timeout(Some(STEP))?;
    s.set_nodelay(true)?;
    s.write_all(b"x")?;
    let mut b = [0u8; 8];
    s.read_exact(&mut b[..1])?;
    // The server's FIN.
    let n = s.read(&mut b)?;
    if n != 0 {
        return Err(std::io::Error::other("more than one byte of response"));
    }
    Ok(())
}

/// Round trips skipped at the start of `ping` (connection warm-up: slow
/// start, first cache misses), as sockperf sends warm-up messages first.
pub(super) const WARMUP: usize = 100;

/// Round trips of `size`-byte messages on one connection for `secs`, one at a
/// time, each timed from its send until the whole echo is read: microseconds
/// each, the first `WARMUP` left out.
fn ping(addr: SocketAddr, secs: u32, size: usize) -> Result<Vec<f64>> {
    let mut s =
        TcpStream::connect_timeout(&addr, STEP).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(STEP))?;
    s.set_nodelay(true)?;
    let msg = vec![0x5a_u8; size];
    let mut back = vec![0u8; size];
    let end = Instant::now() + Duration::from_secs(u64::from(secs));
    let mut rtts = Vec::new();
    let mut n = 0usize;
    while Instant::now() < end {
        let t = Instant::now();
        s.write_all(&msg).context("sending")?;
        s.read_exact(&mut back).context("reading the echo")?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        n += 1;
        if n > WARMUP {
            rtts.push(us);
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    if rtts.is_empty() {
        anyhow::bail!("no round trip to {addr} in {secs} s after {WARMUP} warm-up ones");
    }
    Ok(rtts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on IPv6 loopback answering `n` connections.
    fn server(n: usize, echo: bool) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("[::1]:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            for _ in 0..n {
                let (s, _) = l.accept().unwrap();
                answer(s, echo).unwrap();
            }
        });
        (addr, t)
    }

    #[test]
    fn connects_and_pings_over_ipv6() {
        let (addr, t) = server(5, false);
        assert_eq!(connect(addr, 5, 5).0, 5);
        t.join().unwrap();
        let (addr, t) = server(1, true);
        let rtts = ping(addr, 1, 64).unwrap();
        t.join().unwrap();
        assert!(!rtts.is_empty());
        assert!(rtts.iter().all(|r| *r > 0.0 && *r < 2e6), "{rtts:?}");
    }
}
