//! Building blocks of the bandwidth tests: a node wired to an external host with
//! a route to the pods (so traffic flows both ways without masquerade), pods
//! with limits in `runtimeConfig.bandwidth` or the static keys, `iperf3` runs
//! between a pod and the external host (the server killed on every path, every
//! client bounded by [`crate::exec::TIMEOUT`] and its own `--connect-timeout`),
//! a UDP blast of our own, `sluicectl bandwidth`, `sl_bw` as `bpftool` dumps it
//! and the qdiscs of a namespace.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    cni::CniOutput,
    err,
    exec::{self, Output},
    fixtures::{self, UPLINK},
    host::Host,
    masq::{ipv4_of, udp_socket},
    schema::Added,
    with_prev_result, Node, Pod, Result,
};

/// The external host's address ([`crate::fixtures::EXT_IP`]).
pub fn ext_ip() -> Ipv4Addr {
    Ipv4Addr::from([192, 168, 50, 2])
}

/// The burst in bits a rate without one gets, and the least depth of every
/// bucket: 300 ms of the rate, at least 128 KiB, at most 4 GiB (whole bytes:
/// the map keeps bytes).
pub fn default_burst_bits(rate_bits: u64) -> u64 {
    let rate_bytes = (rate_bits / 8).max(1);
    let burst = u64::try_from(u128::from(rate_bytes) * 300 / 1000).unwrap_or(u64::MAX);
    burst.clamp(128 * 1024, u64::from(u32::MAX)) * 8
}

/// `{"ingressRate": ..., ...}` with the given keys (`None`: left out).
pub fn limits(
    ingress_rate: Option<u64>,
    ingress_burst: Option<u64>,
    egress_rate: Option<u64>,
    egress_burst: Option<u64>,
) -> Value {
    let mut o = serde_json::Map::new();
    for (k, v) in [
        ("ingressRate", ingress_rate),
        ("ingressBurst", ingress_burst),
        ("egressRate", egress_rate),
        ("egressBurst", egress_burst),
    ] {
        if let Some(v) = v {
            o.insert(k.into(), json!(v));
        }
    }
    Value::Object(o)
}

/// A node wired to an external host ([`fixtures::external_host`]: the host has
/// a route to the pods), its config announcing the `bandwidth` capability.
pub struct BwWorld {
    pub node: Node,
    pub ext: Host,
    pub conf: Value,
}

/// A pod `ADDed` to a [`BwWorld`].
pub struct BwPod {
    pub pod: Pod,
    pub cid: String,
    pub added: Added,
    pub ip: Ipv4Addr,
    /// The config it was `ADDed` with (for CHECK and DEL).
    pub conf: Value,
}

impl BwPod {
    pub fn ip_string(&self) -> String {
        self.ip.to_string()
    }
}

impl BwWorld {
    pub fn new(subnet: &str) -> Result<Self> {
        Self::with_xdp(subnet, "auto")
    }

    /// `xdp` as configured; `native` also turns off the external side's TX
    /// checksum offload (see [`crate::host::tx_checksum_off`]).
    pub fn with_xdp(subnet: &str, xdp: &str) -> Result<Self> {
        let node = Node::new()?;
        let ext = fixtures::external_host(&node, subnet)?;
        if xdp == "native" {
            crate::host::tx_checksum_off(&ext.netns_path(), fixtures::EXT_IF)?;
        }
        let mut conf = node.conf("1.0.0", subnet);
        conf["uplink"] = json!(UPLINK);
        conf["xdp"] = json!(xdp);
        conf["capabilities"] = json!({"bandwidth": true});
        Ok(Self { node, ext, conf })
    }

    /// The config with `runtimeConfig.bandwidth` = `bw`.
    pub fn conf_runtime(&self, bw: &Value) -> Value {
        let mut c = self.conf.clone();
        c["runtimeConfig"] = json!({ "bandwidth": bw });
        c
    }

    /// The config with the static keys of `bw` at the top level.
    pub fn conf_static(&self, bw: &Value) -> Value {
        let mut c = self.conf.clone();
        crate::fixtures::merge_keys(&mut c, bw);
        c
    }

    /// ADD of a new pod `name` with `conf`: must succeed.
    #[track_caller]
    pub fn add(&self, name: &str, cid: &str, conf: &Value) -> BwPod {
        let pod = self
            .node
            .pod(name)
            .unwrap_or_else(|e| panic!("pod {name}: {e}"));
        let added = fixtures::add(&self.node, conf, cid, &pod);
        let ip = ipv4_of(added.ip()).unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
        BwPod {
            pod,
            cid: cid.to_string(),
            added,
            ip,
            conf: conf.clone(),
        }
    }

    /// ADD that may fail, into an existing pod namespace.
    pub fn try_add(&self, conf: &Value, cid: &str, pod: &Pod) -> Result<CniOutput> {
        self.node.cni("ADD", conf, cid, "eth0", Some(pod), &[])
    }

    /// CHECK of `p` with its config and ADD result.
    pub fn check(&self, p: &BwPod) -> Result<CniOutput> {
        let c = with_prev_result(&p.conf, &p.added.result);
        self.node
            .cni("CHECK", &c, &p.cid, "eth0", Some(&p.pod), &[])
    }

    /// DEL of `p`: must succeed.
    #[track_caller]
    pub fn del(&self, p: &BwPod) {
        fixtures::del(&self.node, &p.conf, &p.cid, &p.pod);
    }

    /// The host veth's ifindex of `p`.
    pub fn host_ifindex(&self, p: &BwPod) -> Result<u64> {
        crate::look::ifindex(self.node.name(), &p.added.host_veth)
    }
}

// --- sluicectl bandwidth ------------------------------------------------------

/// `sluicectl bandwidth args...` (whatever its exit).
pub fn bandwidth(node: &Node, args: &[&str]) -> Result<Output> {
    let mut all = vec!["bandwidth"];
    all.extend_from_slice(args);
    node.sluicectl(&all)
}

/// `sluicectl bandwidth list --json`: one object per pod with limits.
pub fn bw_list(node: &Node) -> Result<Vec<Value>> {
    let v = node.sluicectl_json(&["bandwidth", "list", "--json"])?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("bandwidth list printed no JSON array: {v}"))
}

/// `sluicectl bandwidth get <pod> --json`.
pub fn bw_get(node: &Node, pod: &str) -> Result<Value> {
    node.sluicectl_json(&["bandwidth", "get", pod, "--json"])
}

/// `sluicectl bandwidth set <pod> flags...`: must succeed; its stdout.
pub fn bw_set(node: &Node, pod: &str, flags: &[&str]) -> Result<String> {
    let mut args = vec!["set", pod];
    args.extend_from_slice(flags);
    let out = bandwidth(node, &args)?;
    if !out.success() {
        return Err(err!("{out}"));
    }
    Ok(out.stdout)
}

/// Asserts that `dir` (an `egress`/`ingress` value of `list`/`get --json`) is
/// `{"rate", "burst", "passed", "dropped"}` with the given rate and burst
/// (`None`: `null`).
#[track_caller]
pub fn assert_direction(v: &Value, want: Option<(u64, u64)>, what: &str) {
    match want {
        None => assert!(v.is_null(), "{what}: expected null, got {v:#}"),
        Some((rate, burst)) => {
            let o = v
                .as_object()
                .unwrap_or_else(|| panic!("{what}: expected an object, got {v:#}"));
            let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                ["burst", "depth", "dropped", "passed", "rate"],
                "{what}: {v:#}"
            );
            assert_eq!(o["rate"].as_u64(), Some(rate), "{what} rate: {v:#}");
            assert_eq!(o["burst"].as_u64(), Some(burst), "{what} burst: {v:#}");
            // The bucket is never shallower than what TCP needs.
            let depth = burst.max(default_burst_bits(rate));
            assert_eq!(o["depth"].as_u64(), Some(depth), "{what} depth: {v:#}");
            assert!(o["passed"].is_u64(), "{what} passed: {v:#}");
            assert!(o["dropped"].is_u64(), "{what} dropped: {v:#}");
        }
    }
}

/// Asserts the shape of one pod of `list`/`get --json` for `p` (on host veth
/// `ifindex`) with the given limits.
#[track_caller]
pub fn assert_pod_limits(
    v: &Value,
    p: &BwPod,
    ifindex: u64,
    egress: Option<(u64, u64)>,
    ingress: Option<(u64, u64)>,
) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("expected a JSON object, got {v:#}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "containerId",
            "egress",
            "egressMode",
            "hostIfindex",
            "ifname",
            "ingress",
            "podIps"
        ],
        "{v:#}"
    );
    assert_eq!(o["containerId"], p.cid.as_str(), "{v:#}");
    assert_eq!(o["ifname"], "eth0", "{v:#}");
    assert_eq!(o["podIps"], json!([p.ip_string()]), "{v:#}");
    assert_eq!(o["hostIfindex"].as_u64(), Some(ifindex), "{v:#}");
    // EDT only for an egress limit, and only where the kernel has sch_fq.
    match (o["egressMode"].as_str(), egress) {
        (None, None) | (Some("policer"), Some(_)) => {}
        (Some("edt"), Some(_)) => assert!(crate::kernel::has_sch_fq(), "EDT without sch_fq: {v:#}"),
        (other, _) => panic!("egressMode {other:?} for egress {egress:?}: {v:#}"),
    }
    assert_direction(&o["egress"], egress, "egress");
    assert_direction(&o["ingress"], ingress, "ingress");
}

// --- what the kernel holds ----------------------------------------------------

/// `bpftool -j map dump pinned <pin root>/maps/sl_bw`: one entry per pod.
pub fn sl_bw_dump(node: &Node) -> Result<Vec<Value>> {
    let pin = node.pin_root().join("maps").join("sl_bw");
    let out = exec::tool(
        None,
        "bpftool",
        &["-j", "map", "dump", "pinned", &pin.display().to_string()],
    )?;
    let v: Value = serde_json::from_str(out.trim())
        .map_err(|e| err!("bpftool printed no JSON ({e}): {out}"))?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("bpftool map dump printed no array: {v}"))
}

/// Whether `sluicectl endpoints` says the endpoint of `ip` is marked limited
/// (`endpoint_flags::LIMITED`: the programs look its token buckets up).
pub fn endpoint_limited(node: &Node, ip: Ipv4Addr) -> Result<bool> {
    let v = node.sluicectl_json(&["endpoints", "--json", "--ip", &ip.to_string()])?;
    v.get(0)
        .and_then(|e| e["limited"].as_bool())
        .ok_or_else(|| err!("sluicectl endpoints --ip {ip} shows no `limited`: {v}"))
}

/// Clears the endpoint of `ip`'s `LIMITED` mark in `sl_endpoints` with
/// `bpftool`, as an ADD of a datapath from before the mark left it (key: the
/// IPv4-mapped address; value: ifindex u32, flags u32, two MACs).
pub fn clear_limited_mark(node: &Node, ip: Ipv4Addr) -> Result<()> {
    const LIMITED: u8 = 1 << 2;
    let pin = node.pin_root().join("maps").join("sl_endpoints");
    let pin = pin.display().to_string();
    let mut key: Vec<String> = ["0"; 10].iter().map(ToString::to_string).collect();
    key.extend(["255".to_string(), "255".to_string()]);
    key.extend(ip.octets().iter().map(u8::to_string));
    let mut args = vec!["-j", "map", "lookup", "pinned", &pin, "key"];
    args.extend(key.iter().map(String::as_str));
    let out = exec::tool(None, "bpftool", &args)?;
    let v: Value = serde_json::from_str(out.trim())
        .map_err(|e| err!("bpftool printed no JSON ({e}): {out}"))?;
    let mut value: Vec<u8> = v["value"]
        .as_array()
        .ok_or_else(|| err!("bpftool map lookup printed no value: {v}"))?
        .iter()
        .map(|b| {
            b.as_str()
                .and_then(|h| u8::from_str_radix(h.trim_start_matches("0x"), 16).ok())
                .ok_or_else(|| err!("bpftool printed a value byte that is not hex: {b}"))
        })
        .collect::<Result<_>>()?;
    if value.len() != 20 || value[4] & LIMITED == 0 {
        return Err(err!("{ip}: not a marked 20-byte endpoint: {value:?}"));
    }
    value[4] &= !LIMITED;
    let value: Vec<String> = value.iter().map(u8::to_string).collect();
    let mut args = vec!["map", "update", "pinned", &pin, "key"];
    args.extend(key.iter().map(String::as_str));
    args.push("value");
    args.extend(value.iter().map(String::as_str));
    exec::tool(None, "bpftool", &args).map(drop)
}

/// Every qdisc of a namespace (`tc -j qdisc show`).
pub fn qdiscs(netns: &Path) -> Result<Vec<Value>> {
    let out = exec::tool(Some(netns), "tc", &["-j", "qdisc", "show"])?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    let v: Value =
        serde_json::from_str(out.trim()).map_err(|e| err!("tc printed no JSON ({e}): {out}"))?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("tc qdisc show printed no array: {v}"))
}

// --- iperf3 -------------------------------------------------------------------

/// `iperf3` of Debian (`PATH` of the harness).
const IPERF3: &str = "iperf3";
/// The control and data port of every server (each test has namespaces of its
/// own, so one port does).
pub const IPERF_PORT: u16 = 5201;
/// Longest wait for a server to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(10);

/// An `iperf3 -s -1` in a namespace, killed when dropped (also while a failed
/// test unwinds).
pub struct Iperf3Server {
    child: Child,
}

impl Iperf3Server {
    /// Starts a one-off server bound to `bind` in the namespace at `netns` and
    /// waits (bounded) until it listens.
    pub fn start(netns: &Path, bind: Ipv4Addr) -> Result<Self> {
        let child = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(IPERF3)
            .args([
                "-s",
                "-1",
                "-B",
                &bind.to_string(),
                "-p",
                &IPERF_PORT.to_string(),
            ])
            .env_clear()
            .env("PATH", exec::PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| err!("cannot start iperf3 -s in {}: {e}", netns.display()))?;
        let mut s = Self { child };
        let deadline = Instant::now() + LISTEN_WAIT;
        loop {
            if crate::look::listening(netns, IPERF_PORT)? {
                return Ok(s);
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(err!("iperf3 -s in {} ended: {st}", netns.display()));
            }
            if Instant::now() > deadline {
                return Err(err!(
                    "iperf3 -s in {} does not listen after {LISTEN_WAIT:?}",
                    netns.display()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one `iperf3 --json` run measured, from the receiver's side.
#[derive(Clone, Debug)]
pub struct Measured {
    /// What the receiver got over the run, bits per second.
    pub received_bps: f64,
    /// What the receiver got in each one-second interval, bits.
    pub interval_bits: Vec<f64>,
    /// UDP: datagrams lost, in percent (0 for TCP).
    pub lost_percent: f64,
    /// TCP: the sender's retransmissions (0 for UDP or when unknown).
    pub retransmits: u64,
    /// The whole JSON report.
    pub json: Value,
}

impl Measured {
    pub fn mbps(&self) -> f64 {
        self.received_bps / 1e6
    }

    /// The first second, bits per second.
    pub fn first_second_bps(&self) -> f64 {
        self.interval_bits.first().copied().unwrap_or(0.0)
    }
}

impl std::fmt::Display for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let iv: Vec<String> = self
            .interval_bits
            .iter()
            .map(|b| format!("{:.1}", b / 1e6))
            .collect();
        write!(
            f,
            "{:.2} Mbit/s received (per second: [{}] Mbit; lost {:.1}%, retransmits {})",
            self.mbps(),
            iv.join(", "),
            self.lost_percent,
            self.retransmits
        )
    }
}

/// A run from `sender` (namespace, address: the server, started here) to
/// `receiver` (the namespace of the client, which runs `-R` so that it is the
/// one receiving and its report is the receiver's), `-t secs` and `extra`
/// arguments (`-u -b 200M`, `-P 8`, ...).
pub fn iperf3(
    sender: &Path,
    sender_ip: Ipv4Addr,
    receiver: &Path,
    secs: u32,
    extra: &[&str],
) -> Result<Measured> {
    let _server = Iperf3Server::start(sender, sender_ip)?;
    let ip = sender_ip.to_string();
    let port = IPERF_PORT.to_string();
    let t = secs.to_string();
    let mut args = vec![
        "-c",
        ip.as_str(),
        "-p",
        port.as_str(),
        "-R",
        "-t",
        t.as_str(),
        "-i",
        "1",
        "--json",
        "--connect-timeout",
        "5000",
    ];
    args.extend_from_slice(extra);
    let out = exec::run(Some(receiver), Path::new(IPERF3), &args, &[], b"")?;
    let json: Value = serde_json::from_str(out.stdout.trim())
        .map_err(|e| err!("iperf3 printed no JSON ({e}): {out}"))?;
    if !out.success() || json.get("error").is_some() {
        return Err(err!("iperf3 failed: {out}"));
    }
    parse_iperf3(json)
}

fn parse_iperf3(json: Value) -> Result<Measured> {
    let end = &json["end"];
    let recv = &end["sum_received"];
    let bytes = recv["bytes"]
        .as_f64()
        .ok_or_else(|| err!("no end.sum_received.bytes in {json:#}"))?;
    let secs = recv["seconds"]
        .as_f64()
        .filter(|s| *s > 0.0)
        .ok_or_else(|| err!("no end.sum_received.seconds in {json:#}"))?;
    let interval_bits = json["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["sum"]["bytes"].as_f64())
                .map(|b| b * 8.0)
                .collect()
        })
        .unwrap_or_default();
    Ok(Measured {
        received_bps: bytes * 8.0 / secs,
        interval_bits,
        lost_percent: recv["lost_percent"].as_f64().unwrap_or(0.0),
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        json,
    })
}

/// Pod to external host: what the pod sends (its egress).
pub fn measure_egress(w: &BwWorld, p: &BwPod, secs: u32, extra: &[&str]) -> Result<Measured> {
    iperf3(&p.pod.path, p.ip, &w.ext.netns_path(), secs, extra)
}

/// External host to pod: what the pod receives (its ingress).
pub fn measure_ingress(w: &BwWorld, p: &BwPod, secs: u32, extra: &[&str]) -> Result<Measured> {
    iperf3(&w.ext.netns_path(), ext_ip(), &p.pod.path, secs, extra)
}

/// Pod `from` to pod `to` of the same node.
pub fn measure_between(from: &BwPod, to: &BwPod, secs: u32, extra: &[&str]) -> Result<Measured> {
    iperf3(&from.pod.path, from.ip, &to.pod.path, secs, extra)
}

// --- a UDP blast of our own ---------------------------------------------------

/// What [`udp_blast`] saw.
#[derive(Clone, Copy, Debug)]
pub struct Blast {
    /// Datagrams and payload bytes handed to the kernel.
    pub sent: u64,
    pub sent_bytes: u64,
    /// How long sending took.
    pub send_time: Duration,
    /// Datagrams and payload bytes the receiver got.
    pub received: u64,
    pub received_bytes: u64,
}

/// Longest a [`udp_blast`] receiver waits, whatever happens.
const BLAST_DEADLINE: Duration = Duration::from_secs(10);
/// The receiver stops once nothing came for this long after the sender ended.
const BLAST_IDLE: Duration = Duration::from_millis(300);

/// Sends `total` payload bytes as `size`-byte datagrams as fast as the sender's
/// socket takes them, from the namespace at `from` to `to` (a socket bound in
/// the namespace at `to_netns`, receive buffer 32 MiB), and counts what arrives.
pub fn udp_blast(
    from: &Path,
    to_netns: &Path,
    to: SocketAddr,
    total: usize,
    size: usize,
) -> Result<Blast> {
    let rx = udp_socket(to_netns, to)?;
    let size_buf: i32 = 32 << 20;
    crate::sockopt::set(
        &rx,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        &size_buf,
        "SO_RCVBUFFORCE",
    )?;
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let done = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let got_bytes = Arc::new(AtomicU64::new(0));
    let receiver: JoinHandle<()> = {
        let (done, got, got_bytes) = (Arc::clone(&done), Arc::clone(&got), Arc::clone(&got_bytes));
        thread::spawn(move || receive_all(&rx, &done, &got, &got_bytes))
    };
    // Stop the receiver on every path, then report.
    let sent = send_all(from, to, total, size);
    done.store(true, Ordering::Relaxed);
    let _ = receiver.join();
    let (sent, sent_bytes, send_time) = sent?;
    Ok(Blast {
        sent,
        sent_bytes,
        send_time,
        received: got.load(Ordering::Relaxed),
        received_bytes: got_bytes.load(Ordering::Relaxed),
    })
}

fn send_all(
    from: &Path,
    to: SocketAddr,
    total: usize,
    size: usize,
) -> Result<(u64, u64, Duration)> {
    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let tx: UdpSocket = udp_socket(from, any)?;
    let buf = vec![0x5au8; size];
    let (mut sent, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let mut left = total;
    while left > 0 && start.elapsed() < BLAST_DEADLINE {
        let n = left.min(size);
        match tx.send_to(&buf[..n], to) {
            Ok(k) => {
                sent += 1;
                bytes += k as u64;
                left -= n;
            }
            // A full device queue: try again (bounded by the deadline).
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => thread::yield_now(),
            Err(e) => return Err(err!("UDP send to {to}: {e}")),
        }
    }
    Ok((sent, bytes, start.elapsed()))
}

fn receive_all(rx: &UdpSocket, done: &AtomicBool, got: &AtomicU64, got_bytes: &AtomicU64) {
    let mut buf = vec![0u8; 65536];
    let start = Instant::now();
    let mut last = Instant::now();
    while start.elapsed() < BLAST_DEADLINE {
        match rx.recv_from(&mut buf) {
            Ok((n, _)) => {
                got.fetch_add(1, Ordering::Relaxed);
                got_bytes.fetch_add(n as u64, Ordering::Relaxed);
                last = Instant::now();
            }
            Err(_) => {
                if done.load(Ordering::Relaxed) && last.elapsed() > BLAST_IDLE {
                    return;
                }
            }
        }
    }
}
