//! One measurement each: the real peers (iperf3, sockperf) between two
//! namespaces, both ends pinned to one CPU, or CNI ADD/DEL timed the way a runtime
//! runs a plugin (spawned from a process already in the node's namespace).
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use sluice_testbed::{cni::Invocation, exec::Background, netns::wait_listening};

use super::conflist::in_netns;
use crate::{cmd, testbed::Netns};

/// Both ends of every traffic figure run on this CPU: on a 2-vCPU VM a round trip
/// across CPUs pays ~50 us of wakeup (IPI) noise (docs/development.md, "Benchmarks").
pub(super) const CPU: &str = "1";

fn pinned(ns: &Netns, program: &str) -> Command {
    let mut c = ns.command("taskset");
    c.args(["-c", CPU, program]);
    c
}

/// [`pinned`], first joining the cgroup v2 directory `cgroup` when given (a
/// client whose sockets the Service socket hooks attached there translate):
/// the shell moves itself in, then becomes the program.
fn pinned_client(ns: &Netns, program: &str, cgroup: Option<&Path>) -> Command {
    let Some(cg) = cgroup else {
        return pinned(ns, program);
    };
    let mut c = ns.command("sh");
    c.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
        .arg(cg)
        .args(["taskset", "-c", CPU, program]);
    c
}

/// TCP throughput client -> server in Gbit/s (iperf3, one stream).
pub(super) fn tcp_gbps(client: &Netns, server: &Netns, addr: &str, secs: u32) -> Result<f64> {
    tcp_gbps_via(client, server, (addr, IPERF_PORT), IPERF_PORT, secs)
}

/// The same through a port mapping: the client connects to `to` (address,
/// port), the server listens on `listen_port`.
pub(super) fn tcp_gbps_via(
    client: &Netns,
    server: &Netns,
    to: (&str, u16),
    listen_port: u16,
    secs: u32,
) -> Result<f64> {
    let v = iperf(client, server, to, listen_port, &["-t", &secs.to_string()])?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 reported no received rate")?;
    Ok(bps / 1e9)
}

/// UDP packets per second received with 64-byte payloads, unlimited send rate
/// (small packets show per-packet cost that big TCP segments hide).
pub(super) fn udp_small_pps(client: &Netns, server: &Netns, addr: &str, secs: u32) -> Result<f64> {
    let v = iperf(
        client,
        server,
        (addr, IPERF_PORT),
        IPERF_PORT,
        &["-u", "-l", "64", "-b", "0", "-t", &secs.to_string()],
    )?;
    let sum = &v["end"]["sum"];
    let sent = sum["packets"]
        .as_f64()
        .context("iperf3 -u reported no packets")?;
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    let seconds = sum["seconds"].as_f64().unwrap_or(f64::from(secs));
    Ok((sent - lost) / seconds)
}

const IPERF_PORT: u16 = 5301;
/// The port of sockperf's server (the RTT figures).
pub(super) const SOCKPERF_PORT: u16 = 11311;
/// The port of `conn-loop`'s server (new connections, IPv6 round trips).
pub(super) const CONN_LOOP_PORT: u16 = 5302;

fn iperf(
    client: &Netns,
    server: &Netns,
    to: (&str, u16),
    listen_port: u16,
    args: &[&str],
) -> Result<Value> {
    Ok(iperf_cpu(client, server, to, listen_port, args)?.0)
}

/// The same, with the CPU time the whole machine spent while the client ran
/// (from its start to its exit), in seconds.
fn iperf_cpu(
    client: &Netns,
    server: &Netns,
    (addr, port): (&str, u16),
    listen_port: u16,
    args: &[&str],
) -> Result<(Value, f64)> {
    let mut s = pinned(server, "iperf3");
    s.args(["-s", "-1", "-p", &listen_port.to_string()]);
    let _server = Background::spawn(s)?;
    wait_listening(&server.path(), listen_port, Duration::from_secs(5))?;
    let mut c = pinned(client, "timeout");
    c.args(["60", "iperf3", "-c", addr, "-p", &port.to_string(), "-J"])
        .args(args);
    let before = busy_cpu_secs()?;
    let out = cmd::stdout(&mut c)?;
    let cpu = busy_cpu_secs()? - before;
    Ok((
        serde_json::from_str(&out).context("parsing iperf3 -J output")?,
        cpu,
    ))
}

/// CPU time the whole machine has spent busy since boot, in seconds: the
/// `cpu` line of /proc/stat, user + nice + system + irq + softirq (guest time
/// is already in user; idle, iowait and steal left out), in `USER_HZ` ticks,
/// which the kernel fixes at 100 per second for /proc/stat.
fn busy_cpu_secs() -> Result<f64> {
    const USER_HZ: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("parsing the cpu line of /proc/stat")?;
    if f.len() < 7 {
        bail!("a short cpu line in /proc/stat: {line}");
    }
    // user nice system idle iowait irq softirq ...
    let busy = f[0] + f[1] + f[2] + f[5] + f[6];
    Ok(busy as f64 / USER_HZ)
}

/// One rate-limited TCP stream client -> server (iperf3, one stream, `secs`
/// seconds): the rate the server received in Mbit/s, the Gbit it received, and
/// the machine's busy CPU seconds meanwhile.
pub(super) struct Limited {
    pub mbps: f64,
    pub gbit: f64,
    pub cpu_secs: f64,
    /// The sender's TCP retransmissions over the run.
    pub retransmits: f64,
}

pub(super) fn tcp_limited(
    client: &Netns,
    server: &Netns,
    addr: &str,
    secs: u32,
) -> Result<Limited> {
    let to = (addr, IPERF_PORT);
    let (v, cpu_secs) = iperf_cpu(client, server, to, IPERF_PORT, &["-t", &secs.to_string()])?;
    let r = &v["end"]["sum_received"];
    let bps = r["bits_per_second"]
        .as_f64()
        .context("iperf3 reported no received rate")?;
    let bytes = r["bytes"]
        .as_f64()
        .context("iperf3 reported no received bytes")?;
    Ok(Limited {
        mbps: bps / 1e6,
        gbit: bytes * 8.0 / 1e9,
        cpu_secs,
        retransmits: v["end"]["sum_sent"]["retransmits"]
            .as_f64()
            .context("iperf3 reported no retransmissions")?,
    })
}

/// UDP client -> server sent at `rate` bits/s (iperf3 -u, 1400-byte datagrams):
/// Mbit/s received (datagrams that arrived, over the client's duration).
pub(super) fn udp_received_mbps(
    client: &Netns,
    server: &Netns,
    addr: &str,
    rate: u64,
    secs: u32,
) -> Result<f64> {
    let v = iperf(
        client,
        server,
        (addr, IPERF_PORT),
        IPERF_PORT,
        &[
            "-u",
            "-l",
            &UDP_LEN.to_string(),
            "-b",
            &rate.to_string(),
            "-t",
            &secs.to_string(),
        ],
    )?;
    let sum = &v["end"]["sum"];
    let sent = sum["packets"]
        .as_f64()
        .context("iperf3 -u reported no packets")?;
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    let seconds = sum["seconds"].as_f64().unwrap_or(f64::from(secs));
    Ok((sent - lost) * UDP_LEN as f64 * 8.0 / seconds / 1e6)
}

/// TCP round trip (as [`tcp_rtt_us`]) client -> server while one bulk TCP
/// stream (iperf3, not pinned) goes the same way and fills the limit: the
/// latency the limit adds under load (queueing in a shaper, losses and their
/// retransmissions in a policer). The ping starts half a second after the
/// stream and ends before it.
pub(super) fn tcp_rtt_loaded_us(
    client: &Netns,
    server: &Netns,
    addr: &str,
    secs: u32,
) -> Result<(f64, f64)> {
    let mut s = server.command("iperf3");
    s.args(["-s", "-1", "-p", &IPERF_PORT.to_string()]);
    let _server = Background::spawn(s)?;
    wait_listening(&server.path(), IPERF_PORT, Duration::from_secs(5))?;
    let mut c = client.command("timeout");
    c.args([
        &(secs + 10).to_string(),
        "iperf3",
        "-c",
        addr,
        "-p",
        &IPERF_PORT.to_string(),
        "-t",
        &(secs + 2).to_string(),
    ]);
    let _bulk = Background::spawn(c)?;
    std::thread::sleep(Duration::from_millis(500));
    tcp_rtt_us(client, server, addr, secs)
}

/// UDP payload of the bandwidth table's UDP figure (fits a 1500-byte MTU).
pub(super) const UDP_LEN: usize = 1400;

/// TCP round trip (request/response of 64 bytes) in microseconds: (median, p99),
/// from sockperf ping-pong with --full-rtt; to an IPv6 address, which Debian
/// 12's sockperf 3.7 refuses, from `cargo xtask conn-loop ping` (the same
/// exchange).
pub(super) fn tcp_rtt_us(
    client: &Netns,
    server: &Netns,
    addr: &str,
    secs: u32,
) -> Result<(f64, f64)> {
    if is_ipv6(addr) {
        let v = conn_loop(
            (client, None),
            server,
            (addr, addr),
            secs,
            &["--echo"],
            &["ping", "--size", "64"],
        )?;
        let pct = |k: &str| {
            v[k].as_f64()
                .with_context(|| format!("conn-loop ping reported no {k}: {v}"))
        };
        return Ok((pct("p50Us")?, pct("p99Us")?));
    }
    let to = (addr, SOCKPERF_PORT);
    let pp = sockperf_pp((client, None), server, to, to, &[], secs)?;
    Ok((pp.p50_us, pp.p99_us))
}

/// An IPv4 TCP ping-pong as [`tcp_rtt_us`] measures it: (median in
/// microseconds, round trips completed).
pub(super) fn tcp_round_trips(
    client: &Netns,
    server: &Netns,
    addr: &str,
    secs: u32,
) -> Result<(f64, f64)> {
    let to = (addr, SOCKPERF_PORT);
    let pp = sockperf_pp((client, None), server, to, to, &[], secs)?;
    Ok((pp.p50_us, pp.round_trips))
}

fn is_ipv6(addr: &str) -> bool {
    addr.parse::<std::net::Ipv6Addr>().is_ok()
}

/// The same through a translation (a port mapping, a Service's ClusterIP):
/// the client connects to `to`, the server listens on `listen` (address,
/// port), with `SO_REUSEADDR` (`--uc-reuseaddr`): the port may be the one a
/// server used just before, whose closed connections wait in `TIME_WAIT`.
pub(super) fn tcp_rtt_us_via(
    client: &Netns,
    server: &Netns,
    to: (&str, u16),
    listen: (&str, u16),
    secs: u32,
) -> Result<(f64, f64)> {
    tcp_rtt_us_via_in((client, None), server, to, listen, secs)
}

/// [`tcp_rtt_us_via`] with the client in the cgroup v2 directory `cgroup`
/// when given (see [`pinned_client`]).
pub(super) fn tcp_rtt_us_via_in(
    client: (&Netns, Option<&Path>),
    server: &Netns,
    to: (&str, u16),
    listen: (&str, u16),
    secs: u32,
) -> Result<(f64, f64)> {
    let pp = sockperf_pp(client, server, to, listen, &["--uc-reuseaddr"], secs)?;
    Ok((pp.p50_us, pp.p99_us))
}

/// What one sockperf ping-pong run reported.
struct PingPong {
    p50_us: f64,
    p99_us: f64,
    /// Replies received over the whole run, warm-up included (`[Total Run]`
    /// `ReceivedMessages`).
    round_trips: f64,
}

fn sockperf_pp(
    (client, cgroup): (&Netns, Option<&Path>),
    server: &Netns,
    (addr, port): (&str, u16),
    (listen_addr, listen_port): (&str, u16),
    server_args: &[&str],
    secs: u32,
) -> Result<PingPong> {
    let mut s = pinned(server, "sockperf");
    s.args([
        "sr",
        "--tcp",
        "-i",
        listen_addr,
        "-p",
        &listen_port.to_string(),
    ])
    .args(server_args);
    let _server = Background::spawn(s)?;
    wait_listening(&server.path(), listen_port, Duration::from_secs(5))?;
    let mut c = pinned_client(client, "timeout", cgroup);
    c.args([
        "60",
        "sockperf",
        "pp",
        "--tcp",
        "-i",
        addr,
        "-p",
        &port.to_string(),
    ])
    .args(["-t", &secs.to_string(), "-m", "64", "--full-rtt"]);
    let out = cmd::capture(&mut c)?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let pct = |p: &str| -> Result<f64> {
        text.lines()
            .find(|l| l.contains(&format!("percentile {p} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no percentile {p} in sockperf output: {text}"))
    };
    let round_trips = text
        .lines()
        .find(|l| l.contains("[Total Run]"))
        .and_then(|l| l.split("ReceivedMessages=").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no [Total Run] ReceivedMessages in sockperf output: {text}"))?;
    Ok(PingPong {
        p50_us: pct("50.000")?,
        p99_us: pct("99.000")?,
        round_trips,
    })
}

/// New TCP connections per second client -> server (`cargo xtask conn-loop`: one
/// byte each way, the server closes first), at most `MAX_CONNS` per measurement:
/// a masqueraded reference run leaves one `nf_conntrack` entry per connection for
/// two minutes, and that table is shared with the host.
pub(super) fn conns_per_sec(client: &Netns, server: &Netns, addr: &str, secs: u32) -> Result<f64> {
    conns_per_sec_via(client, server, (addr, addr), secs)
}

/// Datagrams another pod sends to the external host during the flood
/// figure: about 13,000 new flows a second over the default 3 s, more than a
/// pod's share of a default Sluice table (32,768), so its share is full from
/// the first round on.
pub(super) const FLOOD_FLOWS: u64 = 40_000;

/// [`conns_per_sec`] while `flooder` sends [`FLOOD_FLOWS`] datagrams to as
/// many ports of `addr` (on the other CPU than the figure's; each a new flow
/// through the same node).
pub(super) fn conns_per_sec_flooded(
    client: &Netns,
    flooder: &Netns,
    server: &Netns,
    addr: &str,
    secs: u32,
) -> Result<f64> {
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let ip: std::net::IpAddr = addr
        .parse()
        .with_context(|| format!("flood to {addr}: not an IP address"))?;
    let mut f = flooder.command("taskset");
    f.args(["-c", FLOOD_CPU])
        .arg(&exe)
        .args(["conn-loop", "flood", "--addr"])
        .arg(std::net::SocketAddr::new(ip, 10_000).to_string())
        .args([
            "--secs",
            &secs.to_string(),
            "--max",
            &FLOOD_FLOWS.to_string(),
        ]);
    let _flood = Background::spawn(f)?;
    conns_per_sec(client, server, addr, secs)
}

/// The CPU the flood runs on: not the measured one.
const FLOOD_CPU: &str = "0";

/// The same through a translation (a Service's ClusterIP): the client
/// connects to `to`, the server listens on `listen` (same port).
pub(super) fn conns_per_sec_via(
    client: &Netns,
    server: &Netns,
    (to, listen): (&str, &str),
    secs: u32,
) -> Result<f64> {
    conns_per_sec_via_in((client, None), server, (to, listen), secs)
}

/// [`conns_per_sec_via`] with the client in the cgroup v2 directory `cgroup`
/// when given (see [`pinned_client`]).
pub(super) fn conns_per_sec_via_in(
    client: (&Netns, Option<&Path>),
    server: &Netns,
    (to, listen): (&str, &str),
    secs: u32,
) -> Result<f64> {
    let (done, seconds) = conns_via(client, server, (to, listen), secs)?;
    Ok(done / seconds)
}

/// The same run: (connections completed, seconds they took).
pub(super) fn conns(client: &Netns, server: &Netns, addr: &str, secs: u32) -> Result<(f64, f64)> {
    conns_via((client, None), server, (addr, addr), secs)
}

/// [`conns`] to `to`, the server listening on `listen`.
fn conns_via(
    client: (&Netns, Option<&Path>),
    server: &Netns,
    (to, listen): (&str, &str),
    secs: u32,
) -> Result<(f64, f64)> {
    const MAX_CONNS: u64 = 20_000;
    let max = MAX_CONNS.to_string();
    let v = conn_loop(
        client,
        server,
        (to, listen),
        secs,
        &[],
        &["connect", "--max", &max],
    )?;
    let (done, failed, seconds) = (
        v["connections"].as_f64().unwrap_or(0.0),
        v["failed"].as_f64().unwrap_or(0.0),
        v["seconds"].as_f64().unwrap_or(0.0),
    );
    if done == 0.0 || seconds <= 0.0 || failed > done / 100.0 {
        bail!("connections to {to}: {done} completed, {failed} failed");
    }
    Ok((done, seconds))
}

/// `cargo xtask conn-loop serve <server_args>` in `server`, listening on
/// `listen`, and `conn-loop <client_args>` (the mode first) in `client`, to
/// `to` (IPv4 or IPv6; the same address but where a translation is measured),
/// both on `CONN_LOOP_PORT`, for `secs`, both pinned: what the client printed.
fn conn_loop(
    (client, cgroup): (&Netns, Option<&Path>),
    server: &Netns,
    (to, listen): (&str, &str),
    secs: u32,
    server_args: &[&str],
    client_args: &[&str],
) -> Result<Value> {
    let port = CONN_LOOP_PORT;
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let socket = |addr: &str| -> Result<String> {
        let ip: std::net::IpAddr = addr
            .parse()
            .with_context(|| format!("conn-loop to {addr}: not an IP address"))?;
        Ok(std::net::SocketAddr::new(ip, port).to_string())
    };
    let (target, bind) = (socket(to)?, socket(listen)?);
    let mut s = pinned(server, &exe.to_string_lossy());
    s.args(["conn-loop", "serve", "--addr", &bind, "--secs"])
        .arg(secs.to_string())
        .args(server_args);
    let _server = Background::spawn(s)?;
    wait_listening(&server.path(), port, Duration::from_secs(5))?;
    let mut c = pinned_client(client, "timeout", cgroup);
    c.arg("90")
        .arg(&exe)
        .arg("conn-loop")
        .args(client_args)
        .args(["--addr", &target, "--secs"])
        .arg(secs.to_string());
    let out = cmd::stdout(&mut c)?;
    serde_json::from_str(&out).with_context(|| format!("parsing conn-loop output: {out}"))
}

/// The source address `server`'s side sees on a TCP connection `client` makes
/// to `addr` (any port, IPv4 or IPv6): the node's address where masquerade is
/// at work. Fails when no connection is made in 5 s.
pub(super) fn source_seen(client: &Netns, server: &Netns, addr: &str) -> Result<std::net::IpAddr> {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    let ip: std::net::IpAddr = addr
        .parse()
        .with_context(|| format!("{addr}: not an IP address"))?;
    let listener = in_netns(&server.path(), || {
        TcpListener::bind(SocketAddr::new(ip, 0)).with_context(|| format!("binding {ip}"))
    })?;
    let to = listener.local_addr()?;
    let _client = in_netns(&client.path(), || {
        TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .with_context(|| format!("connecting to {to} from {}", client.name()))
    })?;
    // The handshake is done: the connection waits in the backlog.
    let (_conn, peer) = listener.accept().context("accept")?;
    Ok(peer.ip())
}

/// One TCP exchange `client` -> `to`, answered by a listener of `server`'s on
/// `listen` (a translation in between, a Service's ClusterIP): a byte each
/// way, so the handshake and a reply came back through it. The source address
/// the server saw. Fails when any step takes more than 5 s.
pub(super) fn answered_through(
    client: &Netns,
    server: &Netns,
    to: std::net::SocketAddr,
    listen: std::net::SocketAddr,
) -> Result<std::net::IpAddr> {
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
    };
    const WAIT: Duration = Duration::from_secs(5);
    let listener = in_netns(&server.path(), || {
        TcpListener::bind(listen).with_context(|| format!("binding {listen} in {}", server.name()))
    })?;
    let mut conn = in_netns(&client.path(), || {
        TcpStream::connect_timeout(&to, WAIT)
            .with_context(|| format!("connecting to {to} from {}", client.name()))
    })?;
    conn.set_read_timeout(Some(WAIT))?;
    conn.write_all(b"?")
        .with_context(|| format!("sending to {to}"))?;
    // The handshake is done: the connection waits in the backlog.
    let (mut accepted, peer) = listener.accept().context("accept")?;
    accepted.set_read_timeout(Some(WAIT))?;
    let mut b = [0u8; 1];
    accepted
        .read_exact(&mut b)
        .with_context(|| format!("{listen}: reading what {} sent", peer.ip()))?;
    accepted
        .write_all(b"!")
        .with_context(|| format!("{listen}: answering {}", peer.ip()))?;
    conn.read_exact(&mut b)
        .with_context(|| format!("{to}: reading the answer from {listen}"))?;
    if b != *b"!" {
        bail!("{to}: answered {b:?}, not what {listen} sent");
    }
    Ok(peer.ip())
}

/// p50 and p99 of a sample, in the sample's unit.
pub(super) fn p50_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "an index between 0 and len - 1"
    )]
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// ADD then DEL of `n` pods (namespaces `<node>-l<i>`), each timed in ms: the
/// plugin is spawned by a thread that entered the node's namespace, as a runtime
/// in that namespace would run it (no nsenter in the timed path).
pub(super) fn add_del_ms(
    node: &Netns,
    plugin: &Path,
    conf: &Value,
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let pods: Vec<Netns> = (0..n)
        .map(|i| Ok(Netns::add(format!("{}-l{i}", node.name()))?))
        .collect::<Result<_>>()?;
    let node_path = node.path();
    let plugin = plugin.to_path_buf();
    let conf = conf.clone();
    let pod_paths: Vec<_> = pods.iter().map(Netns::path).collect();
    let handle = std::thread::spawn(move || -> Result<(Vec<f64>, Vec<f64>)> {
        let ns = std::fs::File::open(&node_path)?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .context("entering the node namespace")?;
        let run = |command: &str, i: usize, netns: &Path| -> Result<f64> {
            let id = format!("bench{i}");
            let started = Instant::now();
            Invocation {
                command,
                container_id: &id,
                ifname: "eth0",
                netns: Some(netns),
            }
            .run(None, &plugin, &conf)
            .with_context(|| format!("{} {command} {id}", plugin.display()))?;
            Ok(started.elapsed().as_secs_f64() * 1e3)
        };
        let adds = pod_paths
            .iter()
            .enumerate()
            .map(|(i, p)| run("ADD", i, p))
            .collect::<Result<Vec<_>>>()?;
        let dels = pod_paths
            .iter()
            .enumerate()
            .map(|(i, p)| run("DEL", i, p))
            .collect::<Result<Vec<_>>>()?;
        Ok((adds, dels))
    });
    let r = handle
        .join()
        .map_err(|_| anyhow::anyhow!("the ADD/DEL timing thread panicked"))?;
    drop(pods);
    r
}
