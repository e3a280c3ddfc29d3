//! Building blocks of the `sluicectl` tests: a node with every feature a
//! subcommand shows (masquerade, hostPorts with a cgroup of its own, bandwidth
//! limits) wired to an external host that has no route to the pods, a
//! `sluicectl monitor` running as a child process (its lines collected as they
//! come, killed on every path), the monitor's lease and the event ring buffer as
//! the kernel holds them, UDP bursts from a chosen source port, `sluicectl` as
//! an unprivileged user, and bpffs directories of the test's own. Every wait is
//! bounded.
use std::{
    io::{BufRead, BufReader, Read},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::{
    err,
    exec::{self, Output},
    fixtures::{self, UPLINK},
    host::Host,
    hostport::Cgroup,
    look,
    masq::{ipv4_of, masq_external_host, udp_socket},
    node::unique_name,
    schema::Added,
    Node, Pod, Result,
};

/// Every reason name `sluicectl counters --json` prints under `node`, in the
/// datapath's order (`sluice_common::reason::NAMES`): the stable JSON names.
pub const REASONS: [&str; 64] = [
    "from_pod_to_local_pod",
    "from_pod_fib_redirect",
    "from_pod_fib_neigh",
    "from_pod_not_forwarded",
    "from_pod_fib_pass",
    "pass_not_ip",
    "pass_ttl",
    "drop_malformed",
    "uplink_to_pod",
    "uplink_pass",
    "xdp_to_pod",
    "xdp_pass_to_tc",
    "pass_redirect_failed",
    "ipv4_options_or_fragment",
    "from_pod_to_self",
    "to_pod_from_kernel",
    "from_pod_fib_frag_needed",
    "from_pod_fib_no_route",
    "masq_new_flow",
    "masq_snat",
    "masq_dnat",
    "masq_icmp_error",
    "drop_masq_fragment",
    "drop_masq_proto",
    "drop_masq_no_port",
    "drop_masq_map_full",
    "nat_expired",
    "xdp_masq_dnat",
    "drop_masq_malformed",
    "masq_inbound_flow",
    "drop_masq_no_flow",
    "masq_fragment",
    "hostport_dnat",
    "hostport_reply",
    "hostport_hairpin",
    "hostport_sock",
    "drop_hostport_no_port",
    "drop_bw_egress",
    "drop_bw_ingress",
    "events_lost",
    "drop_spoofed",
    "from_pod_link_multicast",
    "from_pod_to_service",
    "from_pod_kernel_flow",
    "uplink_kernel_flow",
    "kernel_flow_new",
    "kernel_flow_client",
    "nat_evict_unreplied",
    "nat_evict_idle",
    "nat_evict_pod_share",
    "drop_masq_pod_share",
    "lb_sock",
    "drop_lb_no_endpoint",
    "lb_uplink_new",
    "lb_uplink_flow",
    "drop_lb_no_port",
    "lb_packet_new",
    "drop_policy_ingress",
    "drop_policy_egress",
    "drop_policy_pending",
    "policy_new",
    "policy_audit_ingress",
    "policy_audit_egress",
    "xdp_lb_send",
];

/// A node with masquerade on, the hostPort socket hooks on a cgroup of its own
/// and the `portMappings` and `bandwidth` capabilities, wired to an external host
/// with no route to the pods ([`masq_external_host`]).
pub struct CtlWorld {
    pub node: Node,
    pub ext: Host,
    pub cgroup: Cgroup,
    /// The config without `runtimeConfig`.
    pub conf: Value,
}

/// A pod `ADDed` to a [`CtlWorld`].
pub struct CtlPod {
    pub pod: Pod,
    pub cid: String,
    pub added: Added,
    pub ip: Ipv4Addr,
    /// The config of its ADD (DEL uses it).
    pub conf: Value,
}

impl CtlPod {
    pub fn sock(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), port)
    }

    pub fn ip_string(&self) -> String {
        self.ip.to_string()
    }
}

impl CtlWorld {
    /// `extra` keys are merged into the config (`"debug": true`, ...).
    pub fn new(subnet: &str, extra: &Value) -> Result<Self> {
        let node = Node::new()?;
        let ext = masq_external_host(&node)?;
        let cgroup = Cgroup::new()?;
        let mut conf = node.conf("1.0.0", subnet);
        conf["ipMasq"] = json!(true);
        conf["uplink"] = json!(UPLINK);
        conf["xdp"] = json!("auto");
        conf["hostPortCgroup"] = json!(cgroup.display());
        conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
        crate::fixtures::merge_keys(&mut conf, extra);
        Ok(Self {
            node,
            ext,
            cgroup,
            conf,
        })
    }

    /// The config with `runtimeConfig` = `runtime` (`{"portMappings": [...],
    /// "bandwidth": {...}}`, or `{}`).
    pub fn conf_with(&self, runtime: &Value) -> Value {
        let mut c = self.conf.clone();
        c["runtimeConfig"] = runtime.clone();
        c
    }

    /// Makes pod `name` and ADDs `cid` into it with `runtime` as
    /// `runtimeConfig`: must succeed.
    #[track_caller]
    pub fn add(&self, name: &str, cid: &str, runtime: &Value) -> CtlPod {
        let pod = self
            .node
            .pod(name)
            .unwrap_or_else(|e| panic!("pod {name}: {e}"));
        let conf = self.conf_with(runtime);
        let added = fixtures::add(&self.node, &conf, cid, &pod);
        let ip = ipv4_of(added.ip()).unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
        CtlPod {
            pod,
            cid: cid.to_string(),
            added,
            ip,
            conf,
        }
    }

    /// DEL of `p` with the config of its ADD: must succeed.
    #[track_caller]
    pub fn del(&self, p: &CtlPod) {
        fixtures::del(&self.node, &p.conf, &p.cid, &p.pod);
    }

    /// The host veth's ifindex of `p`.
    #[track_caller]
    pub fn host_ifindex(&self, p: &CtlPod) -> u64 {
        look::ifindex(self.node.name(), &p.added.host_veth).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `sluicectl --pin-root <node's> args...` in the node namespace, whatever
    /// its outcome.
    #[track_caller]
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.node.sluicectl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `sluicectl args...`: must exit 0 and print JSON.
    #[track_caller]
    pub fn ctl_json(&self, args: &[&str]) -> Value {
        self.node
            .sluicectl_json(args)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Asserts that `out` failed with exit code 1 and that its stderr names every
/// one of `words` (case-insensitive) and stdout is empty.
#[track_caller]
pub fn assert_refused(out: &Output, words: &[&str]) {
    assert_eq!(out.status, Some(1), "expected exit code 1: {out}");
    let err = out.stderr.to_lowercase();
    for w in words {
        assert!(
            err.contains(&w.to_lowercase()),
            "stderr should name {w:?}: {out}"
        );
    }
    assert!(
        out.stdout.trim().is_empty(),
        "a refusal printed on stdout: {out}"
    );
}

// --- sluicectl monitor as a child process ---------------------------------------

/// Longest a monitor started by [`CtlChild::monitor`] runs, whatever the test
/// does (its `--duration` unless the test gives its own).
pub const MONITOR_LIFETIME: Duration = Duration::from_mins(1);

/// `sluicectl --pin-root <node's> args...` running in the node namespace as a
/// child process (`monitor`, `counters --watch`), its stdout lines and stderr
/// collected as they come. Killed when dropped (also while a failed test
/// unwinds), and by the kernel when the test process dies
/// (`PR_SET_PDEATHSIG`).
pub struct CtlChild {
    child: Option<Child>,
    what: String,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

/// How a [`CtlChild`] ended.
#[derive(Debug)]
pub struct ChildEnd {
    /// Exit code; `None` when a signal ended it.
    pub status: Option<i32>,
    /// From the start of [`CtlChild::wait`] (right after the signal of
    /// [`CtlChild::stop_with`]) to its end.
    pub took: Duration,
    pub lines: Vec<String>,
    pub stderr: String,
}

impl ChildEnd {
    /// Every stdout line as JSON; panics on a line that is not.
    #[track_caller]
    pub fn json(&self) -> Vec<Value> {
        parse_lines(&self.lines, &self.stderr)
    }
}

#[track_caller]
fn parse_lines(lines: &[String], stderr: &str) -> Vec<Value> {
    lines
        .iter()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| {
                panic!("sluicectl printed a line that is not JSON ({e}): {l:?}\nstderr: {stderr}")
            })
        })
        .collect()
}

fn lock<T: Clone>(m: &Mutex<T>) -> T {
    match m.lock() {
        Ok(g) => g.clone(),
        Err(p) => p.into_inner().clone(),
    }
}

impl CtlChild {
    /// `sluicectl monitor args...` (with `--duration 60` unless `args` has a
    /// `--duration`), waiting (bounded) until it says it is monitoring: from
    /// then on it has drained what was in the ring and takes the lease.
    pub fn monitor(node: &Node, args: &[&str]) -> Result<Self> {
        let mut all = vec!["monitor"];
        all.extend_from_slice(args);
        let secs = MONITOR_LIFETIME.as_secs().to_string();
        if !args.contains(&"--duration") {
            all.extend(["--duration", secs.as_str()]);
        }
        let m = Self::spawn(node, &all)?;
        m.wait_started(Duration::from_secs(10))?;
        Ok(m)
    }

    /// Starts `sluicectl --pin-root <node's> args...` without waiting for it.
    pub fn spawn(node: &Node, args: &[&str]) -> Result<Self> {
        let bin = crate::sluicectl_bin()?;
        let root = node.pin_root().display().to_string();
        let mut all: Vec<String> = vec!["--pin-root".into(), root];
        all.extend(args.iter().map(ToString::to_string));
        let what = format!(
            "nsenter --net={} {} {}",
            node.netns_path().display(),
            bin.display(),
            all.join(" ")
        );
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", node.netns_path().display()))
            .arg("--")
            .arg(&bin)
            .args(&all)
            .env_clear()
            .env("PATH", exec::PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        exec::die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| err!("cannot start `{what}`: {e}"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            let lines = Arc::clone(&lines);
            readers.push(thread::spawn(move || {
                for l in BufReader::new(out).lines() {
                    let Ok(l) = l else { break };
                    match lines.lock() {
                        Ok(mut v) => v.push(l),
                        Err(p) => p.into_inner().push(l),
                    }
                }
            }));
        }
        if let Some(mut err_pipe) = child.stderr.take() {
            let stderr = Arc::clone(&stderr);
            readers.push(thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match err_pipe.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let s = String::from_utf8_lossy(&buf[..n]).into_owned();
                            match stderr.lock() {
                                Ok(mut v) => v.push_str(&s),
                                Err(p) => p.into_inner().push_str(&s),
                            }
                        }
                    }
                }
            }));
        }
        Ok(Self {
            child: Some(child),
            what,
            lines,
            stderr,
            readers,
        })
    }

    /// Waits until stderr says "monitoring" (printed once the ring was drained,
    /// right before the lease is taken), at most `timeout`.
    pub fn wait_started(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            // The whole line: stderr is unbuffered, so a line may arrive in
            // pieces.
            let err = self.stderr();
            if err.lines().any(|l| l.contains("monitoring")) && err.ends_with('\n') {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(err!(
                    "`{}` did not start monitoring within {timeout:?}; stderr: {}",
                    self.what,
                    self.stderr()
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stdout lines so far.
    pub fn lines(&self) -> Vec<String> {
        lock(&self.lines)
    }

    /// Stdout lines so far, as JSON; panics on a line that is not.
    #[track_caller]
    pub fn json(&self) -> Vec<Value> {
        parse_lines(&self.lines(), &self.stderr())
    }

    /// Stderr so far.
    pub fn stderr(&self) -> String {
        lock(&self.stderr)
    }

    /// Waits until `cond` holds for the JSON lines so far, at most `timeout`.
    #[track_caller]
    pub fn wait_for(&self, timeout: Duration, cond: impl Fn(&[Value]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(&self.json()) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig`. `nsenter` without `--fork` execs, so the child is
    /// `sluicectl` itself.
    pub fn signal(&self, sig: Signal) -> Result<()> {
        let Some(c) = &self.child else {
            return Err(err!("the child is gone"));
        };
        let pid = i32::try_from(c.id()).map_err(|_| err!("pid {}", c.id()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)?;
        Ok(())
    }

    /// Waits at most `timeout` for it to end; kills it and fails after that.
    pub fn wait(mut self, timeout: Duration) -> Result<ChildEnd> {
        let start = Instant::now();
        let Some(mut child) = self.child.take() else {
            return Err(err!("the child is gone"));
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if start.elapsed() > timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.join_readers();
                    return Err(err!(
                        "`{}` did not end within {timeout:?} (killed)\nstdout: {:?}\nstderr: {}",
                        self.what,
                        self.lines(),
                        self.stderr()
                    ));
                }
                Ok(None) => thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err!("waiting for `{}`: {e}", self.what));
                }
            }
        };
        let took = start.elapsed();
        self.join_readers();
        Ok(ChildEnd {
            status: status.code(),
            took,
            lines: self.lines(),
            stderr: self.stderr(),
        })
    }

    /// SIGINT (Ctrl-C), then [`Self::wait`].
    pub fn stop(self, timeout: Duration) -> Result<ChildEnd> {
        self.stop_with(Signal::SIGINT, timeout)
    }

    /// [`Self::signal`], then [`Self::wait`].
    pub fn stop_with(self, sig: Signal, timeout: Duration) -> Result<ChildEnd> {
        self.signal(sig)?;
        self.wait(timeout)
    }

    fn join_readers(&mut self) {
        // The pipes close when the process is gone: the readers end.
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for CtlChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.join_readers();
    }
}

// --- the lease and the ring, as the kernel holds them -------------------------

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`, which the
/// lease is compared with.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

/// `union bpf_attr` for `BPF_MAP_LOOKUP_ELEM`.
#[repr(C, align(8))]
struct LookupAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `sl_monitor[0]`: the `bpf_ktime_get_ns` until which the programs write
/// events (0: no monitor ever ran).
pub fn lease_until(node: &Node) -> Result<u64> {
    let pin = node.pin_root().join("maps").join("sl_monitor");
    let fd = look::bpf_obj_get(&pin)?;
    let key: u32 = 0;
    let mut value: u64 = 0;
    let mut attr = LookupAttr {
        map_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        _pad: 0,
        key: std::ptr::from_ref(&key) as u64,
        value: std::ptr::from_mut(&mut value) as u64,
        flags: 0,
    };
    // SAFETY: `attr` is a live prefix of `union bpf_attr`; key and value point
    // to live values of the map's key (4) and value (8) sizes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_ELEM,
            std::ptr::from_mut(&mut attr),
            std::mem::size_of::<LookupAttr>(),
        )
    };
    if r < 0 {
        return Err(err!(
            "BPF_MAP_LOOKUP_ELEM {}: {}",
            pin.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(value)
}

/// Waits until a monitor's lease is held (`held`) or has run out, at most
/// `timeout`.
pub fn wait_lease(node: &Node, held: bool, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let until = lease_until(node)?;
        let now = monotonic_ns();
        if (until > now) == held {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(err!(
                "the lease is still {} after {timeout:?} (until {until}, now {now})",
                if held { "not held" } else { "held" }
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// How far the programs have written into `sl_events` (the ring's producer
/// position, bytes since its creation), read from its mmapped producer page.
pub fn ring_written(node: &Node) -> Result<u64> {
    let pin = node.pin_root().join("maps").join("sl_events");
    let fd = look::bpf_obj_get(&pin)?;
    // SAFETY: plain system call.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .map_err(|_| err!("sysconf(_SC_PAGESIZE)"))?;
    // The producer page is the second page of a ring buffer map; user space
    // may map it read-only.
    // SAFETY: a fresh read-only shared mapping of one page of the map's fd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            libc::off_t::try_from(page).unwrap_or(4096),
        )
    };
    if p == libc::MAP_FAILED {
        return Err(err!(
            "mmap of {}'s producer page: {}",
            pin.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the page is mapped and starts with the 8-byte producer position
    // (`struct bpf_ringbuf`'s producer_pos), written by the kernel.
    let pos = unsafe { std::ptr::read_volatile(p.cast::<u64>()) };
    // SAFETY: the mapping made above, of `page` bytes.
    unsafe { libc::munmap(p, page) };
    Ok(pos)
}

// --- traffic ------------------------------------------------------------------------

/// Sends `count` UDP datagrams of `size` bytes from `from` (bound in the
/// namespace at `netns`, so the source port is known) to `to`, as fast as the
/// socket takes them (ENOBUFS: tried again, bounded by 10 s). Returns how many
/// were sent.
pub fn udp_burst(
    netns: &Path,
    from: SocketAddr,
    to: SocketAddr,
    count: usize,
    size: usize,
) -> Result<usize> {
    let s = udp_socket(netns, from)?;
    let buf = vec![0xa5u8; size];
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    while sent < count && Instant::now() < deadline {
        match s.send_to(&buf, to) {
            Ok(_) => sent += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => thread::yield_now(),
            // An ICMP error of an earlier datagram reported on this one.
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {}
            Err(e) => return Err(err!("UDP {from} -> {to}: {e}")),
        }
    }
    Ok(sent)
}

// --- privileges, bpffs --------------------------------------------------------------

/// `sluicectl args...` in the node namespace as uid/gid 65534 (nobody) with no
/// supplementary groups and no capabilities (`setpriv`).
pub fn sluicectl_as_nobody(node: &Node, args: &[&str]) -> Result<Output> {
    let bin = crate::sluicectl_bin()?;
    let bin = bin.display().to_string();
    let mut all = vec![
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        bin.as_str(),
    ];
    all.extend_from_slice(args);
    exec::run(
        Some(&node.netns_path()),
        Path::new("setpriv"),
        &all,
        &[],
        b"",
    )
}

/// A directory of the test's own under `/sys/fs/bpf` (`slt<pid>b<n>`), removed
/// with everything pinned in it when dropped, also while a failed test unwinds.
pub struct BpffsDir {
    path: PathBuf,
}

impl BpffsDir {
    pub fn new() -> Result<Self> {
        let path = Path::new("/sys/fs/bpf").join(unique_name('b'));
        // One of this name can only be left over by a dead process whose pid
        // this one reuses.
        if path.exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
        std::fs::create_dir(&path).map_err(|e| err!("creating {}: {e}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn display(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for BpffsDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("cleanup: removing {}: {e}", self.path.display()),
        }
    }
}

/// Makes `<root>/maps/sl_meta` as the datapath pins it (an array of one
/// `DatapathMeta`: layout version u32, pad u32, object hash u64, load time
/// u64) holding `layout_version`, with `bpftool`.
pub fn fake_meta(root: &Path, layout_version: u32) -> Result<()> {
    let maps = root.join("maps");
    std::fs::create_dir_all(&maps).map_err(|e| err!("creating {}: {e}", maps.display()))?;
    let pin = maps.join("sl_meta").display().to_string();
    exec::tool(
        None,
        "bpftool",
        &[
            "map", "create", &pin, "type", "array", "key", "4", "value", "24", "entries", "1",
            "name", "sl_meta",
        ],
    )?;
    let mut value: Vec<String> = Vec::new();
    value.extend(layout_version.to_le_bytes().iter().map(u8::to_string));
    value.extend([0u8; 4].iter().map(u8::to_string));
    value.extend(0x5eed_u64.to_le_bytes().iter().map(u8::to_string));
    value.extend(1_700_000_000_u64.to_le_bytes().iter().map(u8::to_string));
    let mut args: Vec<&str> = vec![
        "map", "update", "pinned", &pin, "key", "0", "0", "0", "0", "value",
    ];
    args.extend(value.iter().map(String::as_str));
    exec::tool(None, "bpftool", &args).map(drop)
}

/// Where the plugin pins a network's datapath without `pinRoot`.
pub const DEFAULT_PIN_BASE: &str = "/sys/fs/bpf/sluice";

/// Default pin roots (`/sys/fs/bpf/sluice/<name>`) of test networks whose
/// directory names start with `prefix`: removed when dropped, also while a
/// failed test unwinds, and `/sys/fs/bpf/sluice` with them when it did not
/// exist before (and nothing else is in it).
pub struct DefaultPinRoots {
    prefix: String,
    base_made: bool,
}

impl DefaultPinRoots {
    pub fn new(prefix: &str) -> Self {
        let s = Self {
            prefix: prefix.to_string(),
            base_made: !Path::new(DEFAULT_PIN_BASE).exists(),
        };
        // Ones of this prefix can only be left over by a dead process whose
        // pid this one reuses.
        s.remove();
        s
    }

    /// The pin roots of the prefix, sorted.
    pub fn list(&self) -> Vec<String> {
        look::files(Path::new(DEFAULT_PIN_BASE))
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f.starts_with(&self.prefix))
            .collect()
    }

    fn remove(&self) {
        for f in self.list() {
            let p = Path::new(DEFAULT_PIN_BASE).join(f);
            if let Err(e) = std::fs::remove_dir_all(&p) {
                eprintln!("cleanup: removing {}: {e}", p.display());
            }
        }
    }
}

impl Drop for DefaultPinRoots {
    fn drop(&mut self) {
        self.remove();
        if self.base_made {
            // Fails, as it should, when something else is pinned there.
            let _ = std::fs::remove_dir(DEFAULT_PIN_BASE);
        }
    }
}
