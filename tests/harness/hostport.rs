//! Building blocks of the hostPort tests: a node wired to an external host that
//! has no route to the pods (so only the hostPort translation can bring a
//! client to a pod and the pod's replies back), a cgroup v2 directory of the
//! test's own for the socket hooks (`hostPortCgroup`), removed on every path, a
//! client process started in that cgroup, port mappings in `runtimeConfig`, and
//! `sluicectl ports`. Every wait is bounded.
use std::{
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    cni::CniOutput,
    err,
    exec::{self, Output},
    fixtures::{self, EXT_IP, NODE_IP, UPLINK},
    host::Host,
    masq::{
        ipv4_addrs, ipv4_of, masq_external_host, tcp_connect, tcp_echo_on, udp_echo_on, udp_socket,
    },
    raw::Capture,
    schema::Added,
    Counters, Node, Pod, Result, NETWORK,
};

/// A second address of the node on its uplink (same /24 as [`NODE_IP`]).
pub const SECOND_NODE_IP: &str = "192.168.50.9";

/// Makes cgroup names unique within this process; the pid makes them unique
/// between processes.
static NEXT_CGROUP: AtomicU32 = AtomicU32::new(0);

/// Longest [`Cgroup`]'s drop waits for its processes to go, then for `rmdir`.
const CGROUP_CLEANUP: Duration = Duration::from_secs(5);

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a pure v2
/// machine, `/sys/fs/cgroup/unified` on a hybrid one), from
/// `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| err!("reading /proc/self/mountinfo: {e}"))?;
    for line in info.lines() {
        // `id parent major:minor root mountpoint options... - fstype source opts`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() == Some("cgroup2") {
            if let Some(mp) = left.split_whitespace().nth(4) {
                return Ok(PathBuf::from(mp));
            }
        }
    }
    Err(err!(
        "no cgroup2 file system is mounted (/proc/self/mountinfo)"
    ))
}

/// A cgroup v2 directory of the test's own, `<cgroup2 mount>/sluice-test-<pid>-<n>`:
/// what the test's configs name as `hostPortCgroup`. Dropping it kills what is
/// left in it (only clients the test started can be there), waits for them to
/// go and removes the directory, also while a failed test unwinds.
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    pub fn new() -> Result<Self> {
        let n = NEXT_CGROUP.fetch_add(1, Ordering::Relaxed);
        let path = cgroup2_mount()?.join(format!("sluice-test-{}-{n}", std::process::id()));
        // One of this name can only be left over by a dead process whose pid
        // this one reuses.
        if path.exists() {
            let _ = fs::remove_dir(&path);
        }
        fs::create_dir(&path).map_err(|e| err!("creating cgroup {}: {e}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as a string (for configs and arguments).
    pub fn display(&self) -> String {
        self.path.display().to_string()
    }

    /// Pids of the processes in the cgroup.
    pub fn procs(&self) -> Result<Vec<i32>> {
        let p = self.path.join("cgroup.procs");
        let s = fs::read_to_string(&p).map_err(|e| err!("reading {}: {e}", p.display()))?;
        Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.path.exists() {
            return;
        }
        // Children first: a cgroup with a process in it cannot be removed.
        let deadline = Instant::now() + CGROUP_CLEANUP;
        loop {
            let procs = self.procs().unwrap_or_default();
            if procs.is_empty() || Instant::now() > deadline {
                if !procs.is_empty() {
                    eprintln!(
                        "cleanup: processes {procs:?} still in {}",
                        self.path.display()
                    );
                }
                break;
            }
            for pid in procs {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + CGROUP_CLEANUP;
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() > deadline => {
                    eprintln!("cleanup: removing cgroup {}: {e}", self.path.display());
                    return;
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// One `runtimeConfig.portMappings` entry (`host_ip` "" leaves `hostIP` out).
pub fn mapping(host_port: u16, container_port: u16, proto: &str, host_ip: &str) -> Value {
    let mut m = json!({
        "hostPort": host_port,
        "containerPort": container_port,
        "protocol": proto,
    });
    if !host_ip.is_empty() {
        m["hostIP"] = json!(host_ip);
    }
    m
}

/// `conf` with the `portMappings` capability and `runtimeConfig.portMappings`
/// set to `mappings`, as a runtime passes them.
pub fn with_mappings(conf: &Value, mappings: &[Value]) -> Value {
    with_raw_mappings(conf, &Value::Array(mappings.to_vec()))
}

/// As [`with_mappings`] with any JSON value as `portMappings` (for bad input).
pub fn with_raw_mappings(conf: &Value, mappings: &Value) -> Value {
    let mut c = conf.clone();
    c["capabilities"] = json!({"portMappings": true});
    c["runtimeConfig"] = json!({"portMappings": mappings});
    c
}

/// `sluicectl ports args...` (in the node namespace), whatever its outcome.
pub fn ports(node: &Node, args: &[&str]) -> Result<Output> {
    let mut all = vec!["ports"];
    all.extend_from_slice(args);
    node.sluicectl(&all)
}

/// `sluicectl ports list --json filters...`: one object per mapping.
pub fn ports_list(node: &Node, filters: &[&str]) -> Result<Vec<Value>> {
    let mut args = vec!["ports", "list", "--json"];
    args.extend_from_slice(filters);
    let v = node.sluicectl_json(&args)?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("ports list printed no JSON array: {v}"))
}

/// What a [`node_client`] run reported.
#[derive(Clone, Debug)]
pub struct ClientReport {
    /// The exchange worked (TCP: connected and echoed; UDP: the echo came back
    /// from the address used).
    pub ok: bool,
    /// `getpeername` (TCP, connected UDP).
    pub peer: Option<SocketAddr>,
    /// Source of the UDP echo received.
    pub from: Option<SocketAddr>,
    /// The client's own address.
    pub local: Option<SocketAddr>,
    pub errno: Option<i32>,
    /// `udp-hold`: datagrams echoed before it stopped.
    pub echoes: u64,
    pub error: String,
    /// Its cgroup v2 path (relative to the mount, `/sluice-test-...`).
    pub cgroup: String,
    /// The whole run, for messages.
    pub output: String,
}

impl ClientReport {
    /// Whether it failed with "connection refused".
    pub fn refused(&self) -> bool {
        self.errno == Some(libc::ECONNREFUSED)
    }
}

fn parse_addr(v: &Value) -> Option<SocketAddr> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// Runs the client `bin` (`sluice-test-client`, see `harness/bin/client.rs`)
/// in the node namespace, in `cgroup` when given (it joins it before making its
/// socket), with `args` (`tcp ADDR BYTES`, `udp ADDR TRIES WAIT_MS`,
/// `udp-connected ADDR TRIES WAIT_MS`).
pub fn node_client(
    bin: &Path,
    node: &Node,
    cgroup: Option<&Cgroup>,
    args: &[&str],
) -> Result<ClientReport> {
    client_in(bin, &node.netns_path(), cgroup, args)
}

/// As [`node_client`] in the network namespace at `netns` (a pod's, the
/// external host's).
pub fn client_in(
    bin: &Path,
    netns: &Path,
    cgroup: Option<&Cgroup>,
    args: &[&str],
) -> Result<ClientReport> {
    let cg = cgroup.map(Cgroup::display);
    let mut all: Vec<&str> = Vec::new();
    if let Some(c) = &cg {
        all.extend(["--cgroup", c.as_str()]);
    }
    all.extend_from_slice(args);
    let out = exec::run(Some(netns), bin, &all, &[], b"")?;
    if !out.success() {
        return Err(err!("the client could not run: {out}"));
    }
    let v: Value = serde_json::from_str(out.stdout.trim())
        .map_err(|e| err!("the client printed no JSON ({e}): {out}"))?;
    // It must have run where it was asked to: in the cgroup, or not in it.
    let in_cg = v["cgroup"].as_str().unwrap_or_default();
    let want = cgroup
        .and_then(|c| c.path().file_name())
        .map(|n| format!("/{}", n.to_string_lossy()));
    match want {
        Some(w) if in_cg != w => {
            return Err(err!("the client ran in cgroup {in_cg:?}, not {w:?}: {out}"))
        }
        None if in_cg.contains("sluice-test-") => {
            return Err(err!("the client ran in a test cgroup {in_cg:?}: {out}"))
        }
        _ => {}
    }
    Ok(ClientReport {
        ok: v["ok"].as_bool().unwrap_or(false),
        peer: parse_addr(&v["peer"]),
        from: parse_addr(&v["from"]),
        local: parse_addr(&v["local"]),
        errno: v["errno"].as_i64().and_then(|n| i32::try_from(n).ok()),
        echoes: v["echoes"].as_u64().unwrap_or(0),
        error: v["error"].as_str().unwrap_or_default().to_string(),
        cgroup: v["cgroup"].as_str().unwrap_or_default().to_string(),
        output: out.to_string(),
    })
}

/// A node with the hostPort datapath, wired to an external host with no route
/// to the pods, and a cgroup of its own for the socket hooks.
pub struct HpWorld {
    pub node: Node,
    pub ext: Host,
    /// `hostPortCgroup` of [`Self::conf`].
    pub cgroup: Cgroup,
    /// The config without port mappings (see [`HpWorld::conf_with`]).
    pub conf: Value,
}

/// A pod `ADDed` to an [`HpWorld`], with the config it was `ADDed` with.
pub struct HpPod {
    pub pod: Pod,
    pub cid: String,
    pub added: Added,
    pub ip: Ipv4Addr,
    /// The config of its ADD (with its port mappings): DEL and CHECK use it.
    pub conf: Value,
}

impl HpPod {
    pub fn sock(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), port)
    }
}

impl HpWorld {
    /// `xdp` as configured; `extra` keys are merged into the config.
    pub fn new(subnet: &str, xdp: &str, extra: &Value) -> Result<Self> {
        let node = Node::new()?;
        let ext = masq_external_host(&node)?;
        let cgroup = Cgroup::new()?;
        let mut conf = node.conf("1.0.0", subnet);
        conf["uplink"] = json!(UPLINK);
        conf["xdp"] = json!(xdp);
        conf["hostPortCgroup"] = json!(cgroup.display());
        conf["capabilities"] = json!({"portMappings": true});
        crate::fixtures::merge_keys(&mut conf, extra);
        Ok(Self {
            node,
            ext,
            cgroup,
            conf,
        })
    }

    /// [`Self::conf`] with `mappings`.
    pub fn conf_with(&self, mappings: &[Value]) -> Value {
        with_mappings(&self.conf, mappings)
    }

    /// Makes pod `name` and ADDs `cid` into it with `mappings`: must succeed.
    #[track_caller]
    pub fn add(&self, name: &str, cid: &str, mappings: &[Value]) -> HpPod {
        let pod = self
            .node
            .pod(name)
            .unwrap_or_else(|e| panic!("pod {name}: {e}"));
        self.add_into(pod, cid, mappings)
    }

    /// ADDs `cid` into `pod` with `mappings`: must succeed.
    #[track_caller]
    pub fn add_into(&self, pod: Pod, cid: &str, mappings: &[Value]) -> HpPod {
        let conf = self.conf_with(mappings);
        let added = fixtures::add(&self.node, &conf, cid, &pod);
        let ip = ipv4_of(added.ip()).unwrap_or_else(|e| panic!("{e}"));
        HpPod {
            pod,
            cid: cid.to_string(),
            added,
            ip,
            conf,
        }
    }

    /// ADD of `cid` into `pod` with `conf`, whatever its outcome.
    pub fn try_add(&self, conf: &Value, cid: &str, pod: &Pod) -> Result<CniOutput> {
        self.node.cni("ADD", conf, cid, "eth0", Some(pod), &[])
    }

    /// DEL of `p` with the config of its ADD: must succeed.
    #[track_caller]
    pub fn del(&self, p: &HpPod) {
        fixtures::del(&self.node, &p.conf, &p.cid, &p.pod);
    }

    /// CHECK of `p` with the config of its ADD, whatever its outcome.
    pub fn check(&self, p: &HpPod) -> Result<CniOutput> {
        let c = crate::with_prev_result(&p.conf, &p.added.result);
        self.node
            .cni("CHECK", &c, &p.cid, "eth0", Some(&p.pod), &[])
    }

    /// `sluicectl ports list --json filters...`; panics when it fails.
    #[track_caller]
    pub fn ports(&self, filters: &[&str]) -> Vec<Value> {
        ports_list(&self.node, filters).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `sluicectl counters --json`; panics when it fails.
    #[track_caller]
    pub fn counters(&self) -> Counters {
        self.node.counters().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Adds [`SECOND_NODE_IP`]/24 to the uplink (the datapath learns it at the
    /// next ADD with mappings, or at once from the node agent).
    pub fn add_second_address(&self) -> Result<()> {
        self.second_address("add")
    }

    /// Takes [`SECOND_NODE_IP`] off the node again.
    pub fn del_second_address(&self) -> Result<()> {
        self.second_address("del")
    }

    fn second_address(&self, op: &str) -> Result<()> {
        crate::host::ip(
            self.node.name(),
            &["addr", op, &format!("{SECOND_NODE_IP}/24"), "dev", UPLINK],
        )
        .map(drop)
    }
}

/// Asserts that exactly `pods` are attached on the node: their host veths and
/// no other, their reservations and no other, one record each.
#[track_caller]
pub fn assert_only(node: &Node, pods: &[&HpPod]) {
    let mut veths = node.host_veths().unwrap_or_else(|e| panic!("{e}"));
    veths.sort();
    let mut want: Vec<String> = pods.iter().map(|p| p.added.host_veth.clone()).collect();
    want.sort();
    assert_eq!(veths, want, "host veths on node {}", node.name());
    let mut ips = node.reservations(NETWORK).unwrap_or_else(|e| panic!("{e}"));
    ips.sort();
    let mut want_ips: Vec<IpAddr> = pods.iter().map(|p| IpAddr::V4(p.ip)).collect();
    want_ips.sort();
    assert_eq!(ips, want_ips, "IPAM reservations on node {}", node.name());
    let records = node.records(NETWORK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(records.len(), pods.len(), "attachment records: {records:?}");
}

/// The node's uplink address as an [`Ipv4Addr`].
pub fn node_ip() -> Ipv4Addr {
    NODE_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// [`SECOND_NODE_IP`] as an [`Ipv4Addr`].
pub fn second_node_ip() -> Ipv4Addr {
    SECOND_NODE_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// Bytes of each TCP echo of [`HpWorld::ext_tcp`].
pub const ECHO_BYTES: usize = 64 << 10;

impl HpWorld {
    /// A TCP connection from the external host to `to` echoing
    /// [`ECHO_BYTES`]; returns the client's address (what the server must see).
    pub fn ext_tcp(&self, to: SocketAddr, salt: u8) -> Result<SocketAddr> {
        let s = tcp_connect(&self.ext.netns_path(), None, to)?;
        let local = s.local_addr()?;
        let peer = s.peer_addr()?;
        if peer != to {
            return Err(err!("connected to {to}, but the peer is {peer}"));
        }
        tcp_echo_on(&s, ECHO_BYTES, salt)?;
        Ok(local)
    }

    /// A UDP echo from the external host to `to` (3 tries of 2 s), which must
    /// come back from `to`; returns the client's address.
    pub fn ext_udp(&self, to: SocketAddr) -> Result<SocketAddr> {
        self.ext_udp_tries(to, 3, Duration::from_secs(2))
    }

    /// As [`Self::ext_udp`] with `tries` of `wait`.
    pub fn ext_udp_tries(&self, to: SocketAddr, tries: u32, wait: Duration) -> Result<SocketAddr> {
        let u = udp_socket(
            &self.ext.netns_path(),
            SocketAddr::new(IpAddr::V4(ext_ip()), 0),
        )?;
        udp_echo_on(&u, to, b"sluice hostPort from outside", tries, wait)?;
        Ok(u.local_addr()?)
    }
}

/// The external host's address as an [`Ipv4Addr`].
pub fn ext_ip() -> Ipv4Addr {
    EXT_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// A capture on `ifname` in the namespace at `netns` of every frame whose IPv4
/// source is `src` (at most 120 s; stopped by the caller).
pub fn capture_from(netns: &Path, ifname: &str, src: Ipv4Addr) -> Result<Capture> {
    Capture::start(
        netns,
        ifname,
        usize::MAX,
        Duration::from_mins(2),
        Box::new(move |f| ipv4_addrs(f).is_some_and(|(s, _)| s == src)),
    )
}
