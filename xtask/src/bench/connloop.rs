//! `cargo xtask conn-loop serve|connect`: the new-connections-per-second figure.
//! No Debian package measures it (netperf's `TCP_CRR` is not packaged), so this is
//! the same loop: connect, one byte each way, the server closes first (its side
//! keeps `TIME_WAIT`, so the client's ports free up at once), repeat. Bounded in
//! time and count; run by `bench` inside the namespaces, pinned like the other
//! figures.
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
        ConnLoopMode::Serve => serve(a.addr, a.secs),
        ConnLoopMode::Connect => {
            let (done, failed, secs) = connect(a.addr, a.secs, a.max);
            println!(r#"{{"connections":{done},"failed":{failed},"seconds":{secs}}}"#);
            Ok(())
        }
    }
}

/// Accepts, answers one byte, closes; exits after `secs` plus a margin (bench
/// also kills it when done).
fn serve(addr: SocketAddr, secs: u32) -> Result<()> {
    let l = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    // Blocking accept (no polling delay in the measured path); a watchdog ends
    // the process.
    let limit = Duration::from_secs(u64::from(secs) + 30);
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        std::process::exit(0);
    });
    loop {
        let (mut s, _) = l.accept().context("accept")?;
        s.set_read_timeout(Some(STEP))?;
        let mut b = [0u8; 1];
        if s.read_exact(&mut b).is_ok() {
            let _ = s.write_all(&b);
        }
        // Server closes first: TIME_WAIT stays on this side.
        let _ = s.shutdown(Shutdown::Both);
    }
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
