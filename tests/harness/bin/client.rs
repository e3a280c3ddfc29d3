//! `sluice-test-client`: one TCP or UDP exchange made by a process of its own, for
//! the hostPort tests of node-local access. The cgroup socket hooks act on the
//! cgroup a socket was created in, which is a process's (not a thread's): a
//! client that must go through them has to be a separate process that joins the
//! test's cgroup before it makes its socket. This is that process.
//!
//! ```text
//! sluice-test-client [--cgroup DIR] tcp ADDR BYTES
//! sluice-test-client [--cgroup DIR] udp ADDR TRIES WAIT_MS
//! sluice-test-client [--cgroup DIR] udp-connected ADDR TRIES WAIT_MS
//! sluice-test-client [--cgroup DIR] udp-hold ADDR SECONDS
//! ```
//!
//! `udp-hold` keeps one connected UDP socket for up to SECONDS, a datagram
//! every 100 ms, until a call on it fails (its `errno`); `"echoes"` counts
//! the datagrams echoed before.
//!
//! It runs in whatever network namespace it was started in (the harness starts
//! it with `nsenter --net=`). With `--cgroup`, it first writes its pid to
//! `DIR/cgroup.procs`. It prints one JSON object and exits 0 once the exchange
//! was tried, whatever came of it: `{"ok": bool, "peer": "ip:port" (TCP and
//! connected UDP: getpeername), "from": "ip:port" (UDP: the source of the
//! datagram received), "local": "ip:port", "cgroup": "/path" (its cgroup v2
//! path), "error": "...", "errno": N}`. It exits
//! 2 when it could not even start (bad arguments, cgroup not joinable). Every
//! wait is bounded.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    process::ExitCode,
    time::{Duration, Instant},
};

use serde_json::{json, Map, Value};

/// Connect, read and write timeout.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes a TCP exchange may move (keeps a run bounded).
const MAX_BYTES: usize = 16 << 20;

fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + 3) % 251).unwrap_or(0))
        .collect()
}

fn io_err(out: &mut Map<String, Value>, what: &str, e: &std::io::Error) {
    out.insert("ok".into(), json!(false));
    out.insert("error".into(), json!(format!("{what}: {e}")));
    if let Some(n) = e.raw_os_error() {
        out.insert("errno".into(), json!(n));
    }
}

fn tcp(to: SocketAddr, bytes: usize, out: &mut Map<String, Value>) {
    let s = match TcpStream::connect_timeout(&to, IO_TIMEOUT) {
        Ok(s) => s,
        Err(e) => return io_err(out, &format!("connecting to {to}"), &e),
    };
    if let Ok(p) = s.peer_addr() {
        out.insert("peer".into(), json!(p.to_string()));
    }
    if let Ok(l) = s.local_addr() {
        out.insert("local".into(), json!(l.to_string()));
    }
    if s.set_read_timeout(Some(IO_TIMEOUT)).is_err()
        || s.set_write_timeout(Some(IO_TIMEOUT)).is_err()
    {
        out.insert("ok".into(), json!(false));
        out.insert("error".into(), json!("setting socket timeouts"));
        return;
    }
    let data = payload(bytes);
    let mut w = match s.try_clone() {
        Ok(w) => w,
        Err(e) => return io_err(out, "dup", &e),
    };
    let to_send = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&to_send));
    let mut back = vec![0u8; bytes];
    let read = (&s).read_exact(&mut back);
    let written = writer.join();
    match (written, read) {
        (Ok(Ok(())), Ok(())) if back == data => {
            out.insert("ok".into(), json!(true));
        }
        (Ok(Ok(())), Ok(())) => {
            out.insert("ok".into(), json!(false));
            out.insert("error".into(), json!("the echo differs from what was sent"));
        }
        (Ok(Err(e)), _) => io_err(out, &format!("writing {bytes} bytes"), &e),
        (Err(_), _) => {
            out.insert("ok".into(), json!(false));
            out.insert("error".into(), json!("the writer panicked"));
        }
        (_, Err(e)) => io_err(out, &format!("reading the echo of {bytes} bytes"), &e),
    }
}

fn udp(to: SocketAddr, tries: u32, wait: Duration, connected: bool, out: &mut Map<String, Value>) {
    // Bound in the destination's family.
    let any = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let s = match UdpSocket::bind(any) {
        Ok(s) => s,
        Err(e) => return io_err(out, "binding UDP", &e),
    };
    if connected {
        if let Err(e) = s.connect(to) {
            return io_err(out, &format!("connecting UDP to {to}"), &e);
        }
        if let Ok(p) = s.peer_addr() {
            out.insert("peer".into(), json!(p.to_string()));
        }
    }
    let data = b"sluice hostPort node-local UDP".to_vec();
    let mut buf = vec![0u8; 2048];
    let mut others: Vec<String> = Vec::new();
    for _ in 0..tries {
        let sent = if connected {
            s.send(&data)
        } else {
            s.send_to(&data, to)
        };
        if let Err(e) = sent {
            return io_err(out, &format!("sending to {to}"), &e);
        }
        if let Ok(l) = s.local_addr() {
            out.insert("local".into(), json!(l.to_string()));
        }
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if s.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match s.recv_from(&mut buf) {
                Ok((n, from)) if buf[..n] == data[..] => {
                    out.insert("from".into(), json!(from.to_string()));
                    // The echo counts only when it comes from the address used.
                    out.insert("ok".into(), json!(from == to));
                    if from != to {
                        out.insert(
                            "error".into(),
                            json!(format!("the echo came from {from}, not from {to}")),
                        );
                    }
                    return;
                }
                Ok((_, from)) => others.push(from.to_string()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return io_err(out, &format!("receiving from {to}"), &e),
            }
        }
    }
    out.insert("ok".into(), json!(false));
    out.insert(
        "error".into(),
        json!(format!(
            "no echo from {to} after {tries} tries of {wait:?} (other datagrams from {others:?})"
        )),
    );
}

/// One connected socket held for `secs` (see the module's note).
fn udp_hold(to: SocketAddr, secs: u64, out: &mut Map<String, Value>) {
    let any = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let s = match UdpSocket::bind(any).and_then(|s| s.connect(to).map(|()| s)) {
        Ok(s) => s,
        Err(e) => return io_err(out, &format!("connecting UDP to {to}"), &e),
    };
    if let Ok(l) = s.local_addr() {
        out.insert("local".into(), json!(l.to_string()));
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let data = b"sluice udp-hold".to_vec();
    let mut buf = vec![0u8; 2048];
    let mut echoes = 0u64;
    let end = Instant::now() + Duration::from_secs(secs.min(60));
    while Instant::now() < end {
        let r = s.send(&data).and_then(|_| match s.recv(&mut buf) {
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        });
        match r {
            Ok(n) if n == data.len() && buf[..n] == data[..] => echoes += 1,
            Ok(_) => {}
            Err(e) => {
                out.insert("echoes".into(), json!(echoes));
                return io_err(out, "the held socket", &e);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out.insert("echoes".into(), json!(echoes));
    out.insert("ok".into(), json!(true));
}

fn join_cgroup(dir: &str) -> Result<(), String> {
    let procs = std::path::Path::new(dir).join("cgroup.procs");
    std::fs::write(&procs, format!("{}\n", std::process::id()))
        .map_err(|e| format!("writing my pid to {}: {e}", procs.display()))
}

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "sluice-test-client: {why}\nusage: sluice-test-client [--cgroup DIR] \
         (tcp ADDR BYTES | udp ADDR TRIES WAIT_MS | udp-connected ADDR TRIES WAIT_MS | \
         udp-hold ADDR SECONDS)"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--cgroup") {
        if args.len() < 2 {
            return usage("--cgroup needs a directory");
        }
        let dir = args.remove(1);
        args.remove(0);
        if let Err(e) = join_cgroup(&dir) {
            return usage(&e);
        }
    }
    let Some(op) = args.first().cloned() else {
        return usage("no operation");
    };
    let Some(to) = args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()) else {
        return usage("ADDR must be ip:port");
    };
    let mut out = Map::new();
    // The cgroup v2 path it runs in (`0::/path` of /proc/self/cgroup).
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .unwrap_or_default();
    out.insert("cgroup".into(), json!(cgroup));
    out.insert("op".into(), json!(op));
    out.insert("to".into(), json!(to.to_string()));
    match op.as_str() {
        "tcp" => {
            let Some(bytes) = args.get(2).and_then(|b| b.parse::<usize>().ok()) else {
                return usage("BYTES must be a number");
            };
            tcp(to, bytes.min(MAX_BYTES), &mut out);
        }
        "udp" | "udp-connected" => {
            let (Some(tries), Some(wait)) = (
                args.get(2).and_then(|t| t.parse::<u32>().ok()),
                args.get(3).and_then(|w| w.parse::<u64>().ok()),
            ) else {
                return usage("TRIES and WAIT_MS must be numbers");
            };
            udp(
                to,
                tries.min(20),
                Duration::from_millis(wait.min(10_000)),
                op == "udp-connected",
                &mut out,
            );
        }
        "udp-hold" => {
            let Some(secs) = args.get(2).and_then(|t| t.parse::<u64>().ok()) else {
                return usage("SECONDS must be a number");
            };
            udp_hold(to, secs, &mut out);
        }
        _ => return usage(&format!("unknown operation {op}")),
    }
    println!("{}", Value::Object(out));
    ExitCode::SUCCESS
}
