//! `sluicectl` (issue 7) against a live datapath: every subcommand on a node
//! with masquerade, hostPorts and bandwidth limits, wired to an external host
//! that has no route to the pods ([`CtlWorld`]). `--json` output is parsed and
//! checked against what the test set up and what the kernel holds; write
//! operations (`ports add|del`, `nat flush`, `bandwidth set`, `datapath
//! reload|detach-all`) are checked in real traffic; `monitor` runs as a child
//! process while the test makes drops and new flows, its lease and ring buffer
//! read from the kernel; `services` on nodes with `serviceCIDRs`, a DNAT in the
//! node namespace standing in for kube-proxy and real TCP through a ClusterIP;
//! errors (no datapath, another map layout, bad input, no privileges) exit 1
//! naming the problem.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
#![expect(
    clippy::cast_possible_truncation,
    reason = "test packets and ports: values fit"
)]
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    path::Path,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use sluice_tests::{
    bandwidth::udp_blast,
    ctl::{
        assert_refused, fake_meta, lease_until, monotonic_ns, ring_written, sluicectl_as_nobody,
        udp_burst, wait_lease, BpffsDir, CtlChild, CtlPod, CtlWorld, DefaultPinRoots,
        DEFAULT_PIN_BASE, REASONS,
    },
    exec,
    fixtures::{add, del, wait_links_gone, EXT_IP, NODE_IP, UPLINK},
    hostport::mapping,
    kernel, look,
    masq::{tcp_connect, tcp_echo_on, udp_echo_on, udp_socket, EchoServer},
    sluice_bin, sluicectl_bin,
    traffic::tcp_echo,
    NETWORK,
};

/// Egress limit of the pods that must drop: 1 Mbit/s with a 100 kbit (12.5 KB)
/// burst, so that a burst of [`BURST`] datagrams of [`SIZE`] bytes loses most.
const RATE: u64 = 1_000_000;
const BUCKET: u64 = 100_000;
/// The depth the datapath gives [`BUCKET`] at [`RATE`]: the least any bucket
/// gets (128 KiB, in bits).
const DEPTH: u64 = 128 * 1024 * 8;
/// Datagrams of a burst, and their payload size.
const BURST: usize = 200;
const SIZE: usize = 1000;
/// A frame of one of those datagrams (Ethernet + IPv4 + UDP + payload).
const FRAME: u64 = 14 + 20 + 8 + SIZE as u64;
/// Bytes of each `udp_blast` of the bandwidth test: far more than 1 Mbit/s
/// carries while it is sent, however slowly the machine sends.
const BLAST: usize = 2 << 20;
/// Bytes one event takes in the ring (8-byte record header + `Event`).
const EVENT_RECORD: u64 = 8 + 80;
/// Longest wait for a `--count` monitor to end once its events were made.
const MONITOR_END: Duration = Duration::from_secs(10);
/// The pods' echo server port (hostPort targets).
const CPORT: u16 = 8080;

fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), port)
}

fn ext_ip() -> Ipv4Addr {
    EXT_IP.parse().unwrap()
}

fn node_ip() -> Ipv4Addr {
    NODE_IP.parse().unwrap()
}

fn egress_limited() -> Value {
    json!({"bandwidth": {"egressRate": RATE, "egressBurst": BUCKET}})
}

fn ingress_limited() -> Value {
    json!({"bandwidth": {"ingressRate": RATE, "ingressBurst": BUCKET}})
}

/// A UDP socket on the external host at `port`, so that bursts to it draw no
/// ICMP errors (kept open by the caller).
fn ext_sink(w: &CtlWorld, port: u16) -> UdpSocket {
    udp_socket(&w.ext.netns_path(), sa(ext_ip(), port)).unwrap()
}

/// An echo server (TCP and UDP) on the external host.
fn ext_server(w: &CtlWorld) -> EchoServer {
    EchoServer::start(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap()
}

/// [`BURST`] datagrams from `p`'s `sport` to the external host's `dport`.
#[track_caller]
fn burst_to_ext(p: &CtlPod, sport: u16, dport: u16) {
    let sent = udp_burst(&p.pod.path, p.sock(sport), sa(ext_ip(), dport), BURST, SIZE).unwrap();
    assert_eq!(sent, BURST, "datagrams sent from {}:{sport}", p.ip);
}

/// One datagram from `p`'s `sport` to the external host's `dport`, so that the
/// masqueraded flow exists before a monitor starts (its `nat-new` event is not
/// among the events a test waits for); waits until `nat list` shows it.
#[track_caller]
fn open_flow(w: &CtlWorld, p: &CtlPod, sport: u16, dport: u16) {
    let sent = udp_burst(&p.pod.path, p.sock(sport), sa(ext_ip(), dport), 1, SIZE).unwrap();
    assert_eq!(sent, 1);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let flows = w.ctl_json(&["nat", "list", "--json", "--pod", &p.ip_string()]);
        let found = flows
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["proto"] == "udp" && f["podPort"] == sport && f["dstPort"] == dport);
        if found {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no flow {}:{sport} -> {dport}: {flows:#}",
            p.ip
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A UDP echo from `p`'s `sport` through the external echo server: a new
/// masqueraded flow. Returns the NAT address and port the server saw.
#[track_caller]
fn udp_flow(p: &CtlPod, sport: u16, server: &EchoServer) -> SocketAddr {
    let before = server.peers().udp.len();
    let u = udp_socket(&p.pod.path, p.sock(sport)).unwrap();
    udp_echo_on(&u, server.addr, b"sluicectl", 3, Duration::from_secs(2)).unwrap();
    server.peers().udp[before]
}

/// Waits until the node counters stop moving (every packet made so far went
/// through the programs, its event written), at most 3 s.
fn settle(w: &CtlWorld) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = w.ctl_json(&["counters", "--json", "--node"]);
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        let now = w.ctl_json(&["counters", "--json", "--node"]);
        if now == last {
            return;
        }
        last = now;
    }
}

/// The node counter `name` of `counters --json` output.
#[track_caller]
fn node_counter(c: &Value, name: &str) -> u64 {
    c["node"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no node counter {name} in {c:#}"))
}

/// The endpoint row of `p` in `counters --json` output.
#[track_caller]
fn ep_row<'a>(c: &'a Value, p: &CtlPod) -> &'a Value {
    c["endpoints"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["containerId"] == p.cid.as_str()))
        .unwrap_or_else(|| panic!("no endpoint of {} in {c:#}", p.cid))
}

/// Per-endpoint drops of `reason` (0 when the reason is not listed).
fn ep_drops(row: &Value, reason: &str) -> u64 {
    row["drops"][reason].as_u64().unwrap_or(0)
}

/// The keys of a JSON object, sorted.
#[track_caller]
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not a JSON object: {v:#}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut s: Vec<String> = v.iter().map(ToString::to_string).collect();
    s.sort();
    s
}

/// Asserts `ev` is a monitor event of `p`'s UDP datagram from `sport` to the
/// external host's `dport` dropped for `drop_bw_egress`.
#[track_caller]
fn assert_egress_drop(ev: &Value, w: &CtlWorld, p: &CtlPod, sport: u16, dport: u16) {
    let want = json!({
        "type": "drop",
        "reason": "drop_bw_egress",
        "ifindex": w.host_ifindex(p),
        "containerId": p.cid,
        "ifname": "eth0",
        "family": 4,
        "proto": "udp",
        "src": p.ip_string(),
        "sport": sport,
        "dst": EXT_IP,
        "dport": dport,
        "natAddress": null,
        "natPort": 0,
        "len": FRAME,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&ev[k], v, "{k} of {ev:#}");
    }
    assert_event_times(ev);
}

/// `timeUnix` is about now, `monotonicNs` is in the past.
#[track_caller]
fn assert_event_times(ev: &Value) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let t = ev["timeUnix"]
        .as_f64()
        .unwrap_or_else(|| panic!("timeUnix: {ev:#}"));
    assert!((now - t).abs() < 120.0, "timeUnix {t} vs now {now}: {ev:#}");
    let m = ev["monotonicNs"]
        .as_u64()
        .unwrap_or_else(|| panic!("monotonicNs: {ev:#}"));
    assert!(m > 0 && m <= monotonic_ns(), "monotonicNs {m}: {ev:#}");
}

/// Every key of a monitor event (`--json`), sorted.
const EVENT_KEYS: [&str; 16] = [
    "containerId",
    "dport",
    "dst",
    "family",
    "ifindex",
    "ifname",
    "len",
    "monotonicNs",
    "natAddress",
    "natPort",
    "proto",
    "reason",
    "sport",
    "src",
    "timeUnix",
    "type",
];

// --- 1. status -------------------------------------------------------------------

#[test]
fn status_json_describes_the_live_datapath() {
    let w = CtlWorld::new("10.98.1.0/24", &json!({})).unwrap();
    let a = w.add(
        "a",
        "ctl-status-a",
        &json!({"portMappings": [
            mapping(18080, CPORT, "tcp", ""),
            mapping(18080, CPORT, "udp", ""),
        ]}),
    );
    let b = w.add("b", "ctl-status-b", &json!({}));
    let server = ext_server(&w);
    udp_flow(&b, 40001, &server);
    let root = w.node.pin_root();

    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(
        keys(&st),
        sorted(&[
            "pinRoot",
            "layoutVersion",
            "objectHash",
            "loadedUnix",
            "uplink",
            "podMtu",
            "programs",
            "links",
            "podInterfaces",
            "endpoints",
            "masquerade",
            "natSweep",
            "hostPort",
            "bandwidth",
            "services",
            "counters"
        ]),
        "{st:#}"
    );
    assert_eq!(st["pinRoot"], root.display().to_string(), "{st:#}");
    // No node agent runs: the in-kernel sweeper sweeps (lazy expiry where the
    // kernel has none).
    assert_eq!(
        st["natSweep"],
        json!({
            "by": if kernel::has("sweeper") { "kernel" } else { "lazy" },
            "agentLeaseSeconds": 0.0,
            "agentExpired": 0,
        }),
        "{st:#}"
    );
    // No Service range in this config: pods' traffic to ClusterIPs is
    // forwarded like any other.
    let svc = &st["services"];
    assert_eq!(svc["ranges"], json!([]), "{svc:#}");
    assert!(
        svc["handling"]
            .as_str()
            .is_some_and(|h| h.starts_with("no Service ranges")),
        "{svc:#}"
    );
    assert!(svc["kernelFlows"].is_u64(), "{svc:#}");
    assert!(svc["kernelFlowsCapacity"].is_u64(), "{svc:#}");
    // No pod of this test has a limit.
    assert_eq!(
        st["bandwidth"],
        json!({"pods": 0, "egressEdt": 0, "egressPolicer": 0}),
        "{st:#}"
    );
    assert_eq!(st["layoutVersion"], 1, "{st:#}");
    // The object hash is the one `sluice datapath version` reports as pinned.
    let hash = st["objectHash"].as_str().unwrap_or_default();
    assert!(
        hash.len() == 16 && hash.bytes().all(|c| c.is_ascii_hexdigit()),
        "objectHash {hash:?}"
    );
    let v = w
        .node
        .run(
            &sluice_bin().unwrap(),
            &[
                "datapath",
                "version",
                "--pin-root",
                &root.display().to_string(),
            ],
        )
        .unwrap();
    assert!(v.success(), "{v}");
    let v: Value = serde_json::from_str(&v.stdout).unwrap();
    assert_eq!(v["pinned"]["objectHash"], hash, "{v:#}");
    let loaded = st["loadedUnix"].as_u64().unwrap_or(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(loaded <= now && now - loaded < 600, "loadedUnix {loaded}");

    // The uplink: the node's up0, no XDP on a veth with xdp "auto".
    let up = &st["uplink"];
    assert_eq!(
        up["ifindex"],
        look::ifindex(w.node.name(), UPLINK).unwrap(),
        "{up:#}"
    );
    assert_eq!(
        up["mac"],
        look::mac(w.node.name(), UPLINK).unwrap(),
        "{up:#}"
    );
    assert_eq!(up["xdp"], "off", "{up:#}");
    // The pods' MTU: what their eth0 has.
    let eth0 = look::link(&a.pod.name, "eth0").unwrap().unwrap();
    assert_eq!(st["podMtu"], eth0["mtu"], "{st:#}");

    // Programs: every pinned one, with the id the kernel gives it.
    let pinned_progs = look::files(&root.join("progs")).unwrap();
    let progs = st["programs"].as_array().unwrap();
    let names: Vec<&str> = progs.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, pinned_progs, "{st:#}");
    for want in ["from_pod", "to_pod"] {
        assert!(names.contains(&want), "no {want} program: {names:?}");
    }
    for p in progs {
        let name = p["name"].as_str().unwrap();
        let id = look::pinned_prog_id(&root.join("progs").join(name)).unwrap();
        assert_eq!(p["id"], id, "id of program {name}");
    }
    // Links: every pin under links/.
    let links = look::files(&root.join("links")).unwrap();
    assert!(!links.is_empty());
    assert_eq!(st["links"], json!(links), "{st:#}");

    // Pods: both host veths, both addresses.
    let mut veths = vec![a.added.host_veth.clone(), b.added.host_veth.clone()];
    veths.sort();
    assert_eq!(st["podInterfaces"], json!(veths), "{st:#}");
    assert_eq!(st["endpoints"], 2, "{st:#}");

    // Masquerade: on, as the node's uplink address; the flow made above.
    let m = &st["masquerade"];
    assert_eq!(m["enabled"], true, "{m:#}");
    assert_eq!(m["address"], NODE_IP, "{m:#}");
    let flows = w.ctl_json(&["nat", "list", "--json"]);
    assert_eq!(flows.as_array().map(Vec::len), Some(1), "{flows:#}");
    assert_eq!(m["flows"], 1, "{m:#}");
    assert!(m["previousAddress"].is_null(), "{m:#}");
    // NAT ports: from 1024 up, outside the node's ip_local_port_range.
    let range = look::sysctl(&w.node.netns_path(), "net/ipv4/ip_local_port_range").unwrap();
    let (lo, hi) = range.split_once(char::is_whitespace).unwrap();
    let (lo, hi): (u32, u32) = (lo.trim().parse().unwrap(), hi.trim().parse().unwrap());
    assert_eq!(
        m["ports"],
        json!([format!("1024-{}", lo - 1), format!("{}-65535", hi + 1)]),
        "{m:#}"
    );
    let t = &m["timeouts"];
    assert_eq!(
        keys(t),
        sorted(&["tcpSyn", "tcpEstablished", "tcpClosing", "udp", "icmp"]),
        "{m:#}"
    );
    for (k, v) in t.as_object().unwrap() {
        assert!(v.as_u64().is_some_and(|n| n > 0), "timeouts.{k}: {m:#}");
    }

    // hostPort: a's two mappings, the node's address, the socket hooks.
    let hp = &st["hostPort"];
    assert_eq!(hp["mappings"], 2, "{hp:#}");
    // The uplink's address and the pods' gateway (on the host veths).
    let gw = a.added.gateway4().unwrap().to_string();
    let mut addrs: Vec<&str> = hp["nodeAddresses"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    addrs.sort_unstable();
    let mut want = vec![NODE_IP, gw.as_str()];
    want.sort_unstable();
    assert_eq!(addrs, want, "{hp:#}");
    // No node agent here: the ADD read them.
    assert_eq!(hp["nodeAddressesBy"], "add", "{hp:#}");
    assert_eq!(hp["nodeAddressesAgentLeaseSeconds"], 0.0, "{hp:#}");
    let hooks = hp["socketHooks"].as_array().unwrap();
    assert!(!hooks.is_empty(), "{hp:#}");
    for h in hooks {
        let h = h.as_str().unwrap();
        assert!(
            h.starts_with("cgroup-") && links.iter().any(|l| l == h),
            "socket hook {h} is not a pinned cgroup link: {links:?}"
        );
    }

    // Counters: the ones not at zero, by name.
    let c = st["counters"].as_object().unwrap();
    assert!(!c.is_empty(), "{st:#}");
    for (k, v) in c {
        assert!(REASONS.contains(&k.as_str()), "unknown counter {k}");
        assert!(v.as_u64().is_some_and(|n| n > 0), "{k}: {v}");
    }
    assert_eq!(c.get("masq_new_flow"), Some(&json!(1)), "{st:#}");

    // The text form says the same.
    let out = w.ctl(&["status"]);
    assert!(out.success(), "{out}");
    for want in [
        format!("pin root:   {}", root.display()),
        format!("object {hash}, map layout v1"),
        "pods:       2 interfaces, 2 addresses".to_string(),
        format!("masquerade: on, as {NODE_IP}"),
        "hostPort:   2 mappings".to_string(),
        "program:    from_pod (id".to_string(),
        "services:   no Service ranges".to_string(),
    ] {
        assert!(out.stdout.contains(&want), "no {want:?} in: {out}");
    }

    // After a DEL: one pod, no mapping, no flow of it.
    w.del(&a);
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(st["endpoints"], 1, "{st:#}");
    assert_eq!(st["podInterfaces"], json!([b.added.host_veth]), "{st:#}");
    assert_eq!(st["hostPort"]["mappings"], 0, "{st:#}");
    w.del(&b);
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(st["endpoints"], 0, "{st:#}");
    assert_eq!(st["podInterfaces"], json!([]), "{st:#}");
    w.node.assert_clean(NETWORK);
}

// --- 2. endpoints -------------------------------------------------------------------

#[test]
fn endpoints_json_lists_every_pod_address_and_its_counters_rise() {
    let w = CtlWorld::new("10.98.2.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-ep-a-0001", &json!({}));
    let b = w.add("b", "ctl-ep-b-0002", &json!({}));
    let all = w.ctl_json(&["endpoints", "--json"]);
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 2, "{all:#?}");
    for p in [&a, &b] {
        let e = all
            .iter()
            .find(|e| e["ip"] == p.ip_string())
            .unwrap_or_else(|| panic!("{} not listed: {all:#?}", p.ip));
        assert_eq!(
            keys(e),
            sorted(&[
                "ip",
                "ifindex",
                "hostIfname",
                "containerId",
                "ifname",
                "podMac",
                "hostMac",
                "limited",
                "slot",
                "fromPodPackets",
                "fromPodBytes",
                "toPodPackets",
                "toPodBytes"
            ]),
            "{e:#}"
        );
        assert!(e["slot"].is_u64(), "a new pod has a counter slot: {e:#}");
        assert_eq!(e["ifindex"], w.host_ifindex(p), "{e:#}");
        assert_eq!(e["hostIfname"], p.added.host_veth, "{e:#}");
        assert_eq!(e["containerId"], p.cid, "{e:#}");
        assert_eq!(e["ifname"], "eth0", "{e:#}");
        assert_eq!(e["limited"], false, "no bandwidth limits: {e:#}");
        assert_eq!(e["podMac"], p.added.pod_mac.to_lowercase(), "{e:#}");
        assert_eq!(
            e["hostMac"],
            look::mac(w.node.name(), &p.added.host_veth).unwrap(),
            "{e:#}"
        );
    }

    // Filters.
    let ips = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["endpoints", "--json"];
        all.extend_from_slice(args);
        let v = w.ctl_json(&all);
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["ip"].as_str().unwrap().to_string())
            .collect()
    };
    let (ia, ib) = (a.ip_string(), b.ip_string());
    assert_eq!(ips(&["--container", "ctl-ep-a"]), vec![ia.clone()]);
    assert_eq!(ips(&["--container", &b.cid]), vec![ib.clone()]);
    assert_eq!(ips(&["--container", "ctl-ep"]).len(), 2);
    assert!(ips(&["--container", "nobody"]).is_empty());
    assert_eq!(ips(&["--ip", &ia]), vec![ia.clone()]);
    assert!(ips(&["--ip", "10.98.2.250"]).is_empty());
    assert!(ips(&["--ip", &ia, "--container", "ctl-ep-b"]).is_empty());

    // Counters rise with traffic: a's TCP echo to b.
    let row = |p: &CtlPod| -> Value {
        w.ctl_json(&["endpoints", "--json", "--ip", &p.ip_string()])[0].clone()
    };
    let n = |e: &Value, k: &str| e[k].as_u64().unwrap();
    let (a0, b0) = (row(&a), row(&b));
    let bytes: u64 = 256 << 10;
    tcp_echo(&b.pod, IpAddr::V4(b.ip), &a.pod, bytes as usize).unwrap();
    let (a1, b1) = (row(&a), row(&b));
    for (e0, e1, what) in [(&a0, &a1, "a"), (&b0, &b1, "b")] {
        for k in ["fromPodPackets", "toPodPackets"] {
            assert!(n(e1, k) > n(e0, k), "{what} {k}: {e0:#} -> {e1:#}");
        }
        for k in ["fromPodBytes", "toPodBytes"] {
            assert!(
                n(e1, k) - n(e0, k) >= bytes,
                "{what} {k} rose less than the {bytes} echoed: {e0:#} -> {e1:#}"
            );
        }
    }

    // The table.
    let out = w.ctl(&["endpoints"]);
    assert!(out.success(), "{out}");
    let header = out.stdout.lines().next().unwrap_or_default();
    for col in ["IP", "HOST-IF", "IFINDEX", "CONTAINER", "IFNAME"] {
        assert!(header.contains(col), "no {col} column: {out}");
    }
    assert!(
        out.stdout.contains(&ia) && out.stdout.contains(&a.added.host_veth),
        "{out}"
    );
    w.del(&a);
    w.del(&b);
    assert_eq!(w.ctl_json(&["endpoints", "--json"]), json!([]));
    w.node.assert_clean(NETWORK);
}

// --- 3. counters -------------------------------------------------------------------

#[test]
fn counters_json_counts_drops_per_endpoint_and_watch_streams() {
    let w = CtlWorld::new("10.98.3.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-cnt-a", &egress_limited());
    let b = w.add("b", "ctl-cnt-b", &json!({}));
    let _sink = ext_sink(&w, 7001);

    let c0 = w.ctl_json(&["counters", "--json"]);
    assert_eq!(keys(&c0), sorted(&["node", "endpoints"]), "{c0:#}");
    assert_eq!(keys(&c0["node"]), sorted(&REASONS), "{c0:#}");
    for (k, v) in c0["node"].as_object().unwrap() {
        assert!(v.is_u64(), "node.{k}: {v}");
    }
    let eps = c0["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2, "{c0:#}");
    for p in [&a, &b] {
        let e = ep_row(&c0, p);
        assert_eq!(
            keys(e),
            sorted(&[
                "ifindex",
                "hostIfname",
                "containerId",
                "ifname",
                "ips",
                "sent",
                "received",
                "drops"
            ]),
            "{e:#}"
        );
        assert_eq!(e["ifindex"], w.host_ifindex(p), "{e:#}");
        assert_eq!(e["hostIfname"], p.added.host_veth, "{e:#}");
        assert_eq!(e["ifname"], "eth0", "{e:#}");
        assert_eq!(e["ips"], json!([p.ip_string()]), "{e:#}");
        for dir in ["sent", "received"] {
            assert_eq!(keys(&e[dir]), sorted(&["packets", "bytes"]), "{e:#}");
            assert!(e[dir]["packets"].is_u64() && e[dir]["bytes"].is_u64());
        }
        assert!(e["drops"].is_object(), "{e:#}");
        assert_eq!(ep_drops(e, "drop_bw_egress"), 0, "{e:#}");
    }

    // Both pods send the same burst over a's limit: only a drops.
    burst_to_ext(&a, 40001, 7001);
    burst_to_ext(&b, 40002, 7001);
    settle(&w);
    let c1 = w.ctl_json(&["counters", "--json"]);
    let (ea, eb) = (ep_row(&c1, &a), ep_row(&c1, &b));
    let dropped = ep_drops(ea, "drop_bw_egress");
    assert!(
        dropped > 0 && dropped <= BURST as u64,
        "a's drop_bw_egress after {BURST} datagrams over its limit: {ea:#}"
    );
    assert_eq!(ep_drops(eb, "drop_bw_egress"), 0, "b has no limit: {eb:#}");
    for (k, v) in eb["drops"].as_object().unwrap() {
        assert_eq!(v, 0, "b dropped for {k}: {eb:#}");
    }
    // The node-wide counter saw exactly a's drops.
    assert_eq!(
        node_counter(&c1, "drop_bw_egress") - node_counter(&c0, "drop_bw_egress"),
        dropped,
        "{c1:#}"
    );
    // What b sent is counted (its datagrams, at least).
    let sent = |c: &Value, p: &CtlPod, k: &str| ep_row(c, p)["sent"][k].as_u64().unwrap();
    assert!(sent(&c1, &b, "packets") - sent(&c0, &b, "packets") >= BURST as u64);
    assert!(sent(&c1, &b, "bytes") - sent(&c0, &b, "bytes") >= (BURST * SIZE) as u64);

    // --pod by address and by container id prefix: that endpoint only.
    for (sel, p) in [(a.ip_string(), &a), ("ctl-cnt-b".to_string(), &b)] {
        let c = w.ctl_json(&["counters", "--json", "--pod", &sel]);
        let eps = c["endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 1, "--pod {sel}: {c:#}");
        assert_eq!(eps[0]["containerId"], p.cid, "--pod {sel}: {c:#}");
        assert_eq!(keys(&c["node"]), sorted(&REASONS));
    }
    // --node: only the node's counters.
    let c = w.ctl_json(&["counters", "--json", "--node"]);
    assert_eq!(keys(&c), vec!["node".to_string()], "{c:#}");
    assert_eq!(keys(&c["node"]), sorted(&REASONS));

    // --watch: one JSON object per line, --count of them, exit 0.
    let out = w.ctl(&["counters", "--json", "--watch", "1", "--count", "2"]);
    assert!(out.success(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        assert_eq!(keys(&v), sorted(&["node", "endpoints"]), "{v:#}");
    }
    // ... and Ctrl-C ends it with exit 0.
    let watch = CtlChild::spawn(&w.node, &["counters", "--json", "--watch", "1"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while watch.lines().is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let end = watch.stop(Duration::from_secs(3)).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert!(!end.json().is_empty());

    // --count needs --watch; --node and --pod exclude each other.
    let out = w.ctl(&["counters", "--json", "--count", "2"]);
    assert_refused(&out, &["--watch"]);
    let out = w.ctl(&["counters", "--node", "--pod", "ctl-cnt-a"]);
    assert_refused(&out, &["--node", "--pod"]);

    // The tables.
    let out = w.ctl(&["counters"]);
    assert!(out.success(), "{out}");
    for want in ["NODE REASON", "drop_bw_egress", "DROPS", &a.added.host_veth] {
        assert!(out.stdout.contains(want), "no {want:?} in: {out}");
    }
    w.del(&a);
    w.del(&b);
    w.node.assert_clean(NETWORK);
}

// --- 4. monitor -------------------------------------------------------------------

#[test]
fn monitor_shows_bandwidth_drops_with_pod_and_flow() {
    let w = CtlWorld::new("10.98.4.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-mon-drop-a", &egress_limited());
    let _sink = ext_sink(&w, 7001);
    open_flow(&w, &a, 40001, 7001);
    open_flow(&w, &a, 40002, 7001);

    let m = CtlChild::monitor(&w.node, &["--json", "--count", "5"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    burst_to_ext(&a, 40001, 7001);
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    let events = end.json();
    assert_eq!(events.len(), 5, "{end:#?}");
    for ev in &events {
        assert_eq!(keys(ev), sorted(&EVENT_KEYS), "{ev:#}");
        assert_egress_drop(ev, &w, &a, 40001, 7001);
    }
    assert!(end.stderr.contains("5 events shown"), "{end:#?}");

    // The text form: one line per drop, with the reason, the pod and the flow.
    let m = CtlChild::monitor(&w.node, &["--count", "2"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    burst_to_ext(&a, 40002, 7001);
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert_eq!(end.lines.len(), 2, "{end:#?}");
    let flow = format!("udp {}:40002 -> {EXT_IP}:7001", a.ip);
    for l in &end.lines {
        assert!(
            l.contains("drop ")
                && l.contains("drop_bw_egress")
                && l.contains("pod ctl-mon-drop/eth0")
                && l.contains(&flow)
                && l.contains(&format!("len {FRAME}")),
            "text line {l:?}"
        );
    }
    w.del(&a);
}

#[test]
fn monitor_shows_new_masquerade_flows_with_the_nat_address() {
    let w = CtlWorld::new("10.98.5.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-mon-nat-a", &json!({}));
    let server = ext_server(&w);

    let m = CtlChild::monitor(&w.node, &["--json", "--count", "2"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let seen_udp = udp_flow(&a, 41001, &server);
    let t = tcp_connect(&a.pod.path, Some(a.sock(41002)), server.addr).unwrap();
    tcp_echo_on(&t, 4096, 1).unwrap();
    let seen_tcp = server.peers().tcp[0];
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    let events = end.json();
    assert_eq!(events.len(), 2, "{end:#?}");
    let flows = w.ctl_json(&["nat", "list", "--json"]);
    for (proto, sport, seen) in [("udp", 41001, seen_udp), ("tcp", 41002, seen_tcp)] {
        let ev = events
            .iter()
            .find(|e| e["proto"] == proto)
            .unwrap_or_else(|| panic!("no {proto} event: {events:#?}"));
        let want = json!({
            "type": "nat-new",
            "reason": "masq_new_flow",
            "ifindex": w.host_ifindex(&a),
            "containerId": a.cid,
            "ifname": "eth0",
            "family": 4,
            "src": a.ip_string(),
            "sport": sport,
            "dst": EXT_IP,
            "dport": server.addr.port(),
            "natAddress": NODE_IP,
        });
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&ev[k], v, "{k} of {ev:#}");
        }
        // The NAT port: not 0, what the server saw, what `nat list` shows.
        let port = ev["natPort"].as_u64().unwrap_or(0);
        assert_ne!(port, 0, "{ev:#}");
        assert_eq!(
            seen,
            sa(node_ip(), port as u16),
            "{proto}: server saw {seen}"
        );
        let listed = flows
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["proto"] == proto && f["podPort"] == sport)
            .unwrap_or_else(|| panic!("no {proto} flow listed: {flows:#}"));
        assert_eq!(listed["natPort"], port, "{listed:#}");
        assert_event_times(ev);
    }
    drop(t);
    w.del(&a);
}

#[test]
fn monitor_shows_new_host_port_flows_to_the_pod() {
    let w = CtlWorld::new("10.98.6.0/24", &json!({})).unwrap();
    let a = w.add(
        "a",
        "ctl-mon-hp-a",
        &json!({"portMappings": [mapping(18080, CPORT, "tcp", "")]}),
    );
    let server = EchoServer::start(&a.pod.path, a.sock(CPORT)).unwrap();

    let m = CtlChild::monitor(&w.node, &["--json", "--count", "1"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let s = tcp_connect(&w.ext.netns_path(), None, sa(node_ip(), 18080)).unwrap();
    tcp_echo_on(&s, 4096, 2).unwrap();
    let client = s.local_addr().unwrap();
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert_eq!(server.peers().tcp, vec![client]);
    let events = end.json();
    assert_eq!(events.len(), 1, "{end:#?}");
    let ev = &events[0];
    let want = json!({
        "type": "hostport-new",
        "reason": "hostport_dnat",
        "family": 4,
        "proto": "tcp",
        "src": EXT_IP,
        "sport": client.port(),
        "dst": NODE_IP,
        "dport": 18080,
        "natAddress": a.ip_string(),
        "natPort": CPORT,
        "containerId": a.cid,
        "ifname": "eth0",
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&ev[k], v, "{k} of {ev:#}");
    }
    assert_ne!(ev["ifindex"], 0, "the target pod's host veth: {ev:#}");
    assert_event_times(ev);
    drop(s);
    w.del(&a);
}

/// One monitor run of the filter test: `filter` (plus `--json --count 1`),
/// `other` made first (events the filter must hold back), then `wanted`; the
/// one event shown must satisfy `check`, and the ring must have received more
/// than that one event (the others were written while the monitor ran).
#[track_caller]
fn filtered(
    w: &CtlWorld,
    filter: &[&str],
    other: &dyn Fn(),
    wanted: &dyn Fn(),
    check: &dyn Fn(&Value) -> bool,
) {
    let mut args = vec!["--json", "--count", "1"];
    args.extend_from_slice(filter);
    let m = CtlChild::monitor(&w.node, &args).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let ring0 = ring_written(&w.node).unwrap();
    other();
    settle(w);
    let ring1 = ring_written(&w.node).unwrap();
    assert!(
        ring1 - ring0 >= EVENT_RECORD,
        "{filter:?}: the events to hold back were not written to the ring ({ring0} -> {ring1})"
    );
    wanted();
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{filter:?}: {end:#?}");
    let events = end.json();
    assert_eq!(events.len(), 1, "{filter:?}: {end:#?}");
    assert!(
        check(&events[0]),
        "{filter:?} let through {:#}\nstderr: {}",
        events[0],
        end.stderr
    );
}

#[test]
fn monitor_filters_pass_only_matching_events() {
    let w = CtlWorld::new("10.98.7.0/24", &json!({})).unwrap();
    // a: egress limited; b: no limits, a hostPort; c: ingress limited.
    let a = w.add("a", "ctl-filt-a", &egress_limited());
    let b = w.add(
        "b",
        "ctl-filt-b",
        &json!({"portMappings": [mapping(18081, CPORT, "tcp", "")]}),
    );
    let c = w.add("c", "ctl-filt-c", &ingress_limited());
    let (_s1, _s2) = (ext_sink(&w, 7001), ext_sink(&w, 7002));
    let server = ext_server(&w);
    let b_server = EchoServer::start(&b.pod.path, b.sock(CPORT)).unwrap();
    let (ia, ib, ic) = (a.ip_string(), b.ip_string(), c.ip_string());
    let (ia, ib, ic) = (ia.as_str(), ib.as_str(), ic.as_str());
    let next_port = std::cell::Cell::new(42100u16);
    let port = || {
        next_port.set(next_port.get() + 1);
        next_port.get()
    };

    // Generators. a's drops come from flows made before any monitor runs:
    // drops only, no nat-new.
    open_flow(&w, &a, 42000, 7001);
    open_flow(&w, &a, 42000, 7002);
    let egress_drops = |dport: u16| burst_to_ext(&a, 42000, dport);
    let ingress_drops = || {
        let sent = udp_burst(&b.pod.path, b.sock(port()), c.sock(9000), BURST, SIZE).unwrap();
        assert_eq!(sent, BURST);
    };
    let nat_udp = || {
        udp_flow(&b, port(), &server);
    };
    let nat_tcp = || {
        let t = tcp_connect(&b.pod.path, Some(b.sock(port())), server.addr).unwrap();
        tcp_echo_on(&t, 1024, 3).unwrap();
    };
    let hostport = || {
        let s = tcp_connect(&w.ext.netns_path(), None, sa(node_ip(), 18081)).unwrap();
        tcp_echo_on(&s, 1024, 4).unwrap();
    };

    // --type
    filtered(
        &w,
        &["--type", "nat"],
        &|| egress_drops(7001),
        &nat_udp,
        &|e| e["type"] == "nat-new" && e["src"] == ib,
    );
    filtered(
        &w,
        &["--type", "drop"],
        &nat_udp,
        &|| egress_drops(7001),
        &|e| e["type"] == "drop" && e["src"] == ia,
    );
    filtered(
        &w,
        &["--type", "hostport"],
        &|| {
            nat_udp();
            egress_drops(7001);
        },
        &hostport,
        &|e| e["type"] == "hostport-new" && e["natAddress"] == ib,
    );
    // --pod: by address, by container id prefix.
    filtered(&w, &["--pod", ib], &|| egress_drops(7001), &nat_udp, &|e| {
        e["type"] == "nat-new" && e["src"] == ib
    });
    filtered(
        &w,
        &["--pod", "ctl-filt-a"],
        &nat_udp,
        &|| egress_drops(7001),
        &|e| e["type"] == "drop" && e["containerId"] == a.cid.as_str(),
    );
    // A hostPort flow has no pod ifindex: --pod finds it by its NAT address.
    filtered(
        &w,
        &["--pod", "ctl-filt-b"],
        &|| egress_drops(7001),
        &hostport,
        &|e| e["type"] == "hostport-new" && e["natAddress"] == ib,
    );
    // --port: either side.
    filtered(
        &w,
        &["--port", "7002"],
        &|| egress_drops(7001),
        &|| egress_drops(7002),
        &|e| e["type"] == "drop" && e["dport"] == 7002,
    );
    // --proto
    filtered(
        &w,
        &["--proto", "tcp"],
        &|| {
            egress_drops(7001);
            nat_udp();
        },
        &nat_tcp,
        &|e| e["type"] == "nat-new" && e["proto"] == "tcp" && e["src"] == ib,
    );
    // --reason: only drops of that reason.
    filtered(
        &w,
        &["--reason", "drop_bw_ingress"],
        &|| {
            egress_drops(7001);
            nat_udp();
        },
        &ingress_drops,
        &|e| {
            e["type"] == "drop"
                && e["reason"] == "drop_bw_ingress"
                && e["dst"] == ic
                && e["containerId"] == c.cid.as_str()
        },
    );
    // --ip: source, destination or NAT address.
    filtered(
        &w,
        &["--ip", ic],
        &|| egress_drops(7001),
        &ingress_drops,
        &|e| e["type"] == "drop" && e["dst"] == ic,
    );
    assert!(!b_server.peers().tcp.is_empty());
    w.del(&a);
    w.del(&b);
    w.del(&c);
}

/// Whether a debug line names `drop_bw_egress` and `p`'s address.
fn has_debug_drop(events: &[Value], p: &CtlPod) -> bool {
    debug_drop_from(events, p, "")
}

/// Whether a debug line names `drop_bw_egress` and `p`'s address and
/// `:port` (any with "").
fn debug_drop_from(events: &[Value], p: &CtlPod, port: &str) -> bool {
    let from = format!("{}:{port}", p.ip);
    events.iter().any(|e| {
        e["type"] == "debug"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("reason=drop_bw_egress") && m.contains(&from))
    })
}

#[test]
fn monitor_prints_debug_lines_only_when_the_config_asks() {
    // "debug": true: debug lines next to the events.
    let w = CtlWorld::new("10.98.8.0/24", &json!({"debug": true})).unwrap();
    let a = w.add("a", "ctl-dbg-a", &egress_limited());
    let b = w.add("b", "ctl-dbg-b", &json!({}));
    let c = w.add("c", "ctl-dbg-c", &ingress_limited());
    let _sink = ext_sink(&w, 7001);
    let m = CtlChild::monitor(&w.node, &["--json"]).unwrap();
    assert!(m.stderr().contains("debug lines on"), "{}", m.stderr());
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    burst_to_ext(&a, 40001, 7001);
    // Drops of another program (to_pod: c's ingress limit) too.
    let sent = udp_burst(&b.pod.path, b.sock(40003), c.sock(9000), BURST, SIZE).unwrap();
    assert_eq!(sent, BURST);
    let ingress_line = |evs: &[Value]| {
        evs.iter().any(|e| {
            e["type"] == "debug"
                && e["message"].as_str().is_some_and(|m| {
                    m.contains("reason=drop_bw_ingress")
                        && m.contains(&format!("{}:40003 -> {}:9000", b.ip, c.ip))
                })
        })
    };
    let got = m.wait_for(Duration::from_secs(10), |evs| {
        has_debug_drop(evs, &a) && ingress_line(evs)
    });
    let end = m.stop(Duration::from_secs(3)).unwrap();
    assert!(got, "no debug lines of both kinds of drops: {end:#?}");
    assert_eq!(end.status, Some(0), "{end:#?}");
    let events = end.json();
    for e in events.iter().filter(|e| e["type"] == "debug") {
        assert_eq!(keys(e), sorted(&["type", "message"]), "{e:#}");
        let msg = e["message"].as_str().unwrap();
        assert!(!msg.contains("reason=37"), "reason not named: {msg}");
    }
    assert!(
        events.iter().any(|e| e["type"] == "drop"),
        "no drop events next to the debug lines: {end:#?}"
    );
    // --type drop leaves the debug lines out.
    let m = CtlChild::monitor(&w.node, &["--json", "--type", "drop", "--count", "3"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    burst_to_ext(&a, 40002, 7001);
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    let events = end.json();
    assert_eq!(events.len(), 3, "{end:#?}");
    assert!(events.iter().all(|e| e["type"] == "drop"), "{end:#?}");
    w.del(&a);
    w.del(&b);
    w.del(&c);
    drop(w);

    // "debug": false: none, while drop events show.
    let w = CtlWorld::new("10.98.9.0/24", &json!({"debug": false})).unwrap();
    let a = w.add("a", "ctl-nodbg-a", &egress_limited());
    let _sink = ext_sink(&w, 7001);
    let m = CtlChild::monitor(&w.node, &["--json"]).unwrap();
    assert!(m.stderr().contains("debug lines off"), "{}", m.stderr());
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    burst_to_ext(&a, 40001, 7001);
    let got = m.wait_for(Duration::from_secs(10), |evs| {
        evs.iter().filter(|e| e["type"] == "drop").count() >= 3
    });
    settle(&w);
    let end = m.stop(Duration::from_secs(3)).unwrap();
    assert!(got, "no drop events: {end:#?}");
    let events = end.json();
    assert!(
        !events.iter().any(|e| e["type"] == "debug"),
        "debug lines without \"debug\": true: {end:#?}"
    );
    w.del(&a);
}

/// A monitor shows what happens while it runs: the events a previous lease
/// left in the ring are drained, and so must be the debug lines written before
/// it started (they carry no time to tell them apart).
#[test]
fn monitor_does_not_print_debug_lines_from_before_it_started() {
    let w = CtlWorld::new("10.98.23.0/24", &json!({"debug": true})).unwrap();
    let a = w.add("a", "ctl-dbgold-a", &egress_limited());
    let _sink = ext_sink(&w, 7001);
    // Drops while no monitor runs.
    burst_to_ext(&a, 40001, 7001);
    settle(&w);
    let m = CtlChild::monitor(&w.node, &["--json"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    burst_to_ext(&a, 40002, 7001);
    let got = m.wait_for(Duration::from_secs(10), |evs| {
        debug_drop_from(evs, &a, "40002")
    });
    let end = m.stop(Duration::from_secs(3)).unwrap();
    assert!(got, "no debug line of the new drops: {end:#?}");
    let old = end
        .json()
        .iter()
        .filter(|e| e["type"] == "debug" && e.to_string().contains(":40001"))
        .count();
    assert_eq!(
        old, 0,
        "{old} debug lines of drops made before the monitor started"
    );
    w.del(&a);
}

#[test]
fn monitor_ends_promptly_on_ctrl_c_with_a_summary() {
    let w = CtlWorld::new("10.98.10.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-int-a", &json!({}));
    let server = ext_server(&w);
    let m = CtlChild::monitor(&w.node, &["--json"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    udp_flow(&a, 43001, &server);
    udp_flow(&a, 43002, &server);
    assert!(
        m.wait_for(Duration::from_secs(10), |e| e.len() >= 2),
        "{:?} {}",
        m.lines(),
        m.stderr()
    );
    let end = m.stop(Duration::from_secs(5)).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert!(
        end.took < Duration::from_millis(2500),
        "SIGINT took {:?} to end the monitor",
        end.took
    );
    assert_eq!(end.json().len(), 2, "{end:#?}");
    assert!(end.stderr.contains("2 events shown"), "{end:#?}");
    // With nothing to show.
    let m = CtlChild::monitor(&w.node, &["--json"]).unwrap();
    let end = m.stop(Duration::from_secs(5)).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert!(end.took < Duration::from_millis(2500), "{end:#?}");
    assert!(end.lines.is_empty(), "{end:#?}");
    assert!(end.stderr.contains("0 events shown"), "{end:#?}");
    // SIGTERM ends it the same way.
    let m = CtlChild::monitor(&w.node, &["--json"]).unwrap();
    let end = m
        .stop_with(Signal::SIGTERM, Duration::from_secs(5))
        .unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert!(end.took < Duration::from_millis(2500), "{end:#?}");
    assert!(end.stderr.contains("0 events shown"), "{end:#?}");
    // --duration ends it by itself.
    let m = CtlChild::monitor(&w.node, &["--json", "--duration", "1"]).unwrap();
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    assert!(end.stderr.contains("0 events shown"), "{end:#?}");
    w.del(&a);
}

#[test]
fn without_a_monitor_no_events_are_written_and_stale_ones_are_not_shown() {
    let w = CtlWorld::new("10.98.11.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-idle-a", &egress_limited());
    let b = w.add("b", "ctl-idle-b", &json!({}));
    let _sink = ext_sink(&w, 7001);
    let server = ext_server(&w);
    // Before any monitor: drops write nothing.
    assert_eq!(lease_until(&w.node).unwrap(), 0);
    let ring0 = ring_written(&w.node).unwrap();
    burst_to_ext(&a, 40001, 7001);
    settle(&w);
    assert_eq!(
        ring_written(&w.node).unwrap(),
        ring0,
        "events without a monitor"
    );

    // A monitor ends after one event; its lease outlives it a little: drops
    // made now are written, and left in the ring.
    let m = CtlChild::monitor(&w.node, &["--json", "--count", "1"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    udp_flow(&b, 44001, &server);
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    let left = lease_until(&w.node).unwrap().saturating_sub(monotonic_ns());
    assert!(left > 500_000_000, "the lease has only {left} ns left");
    let ring1 = ring_written(&w.node).unwrap();
    burst_to_ext(&a, 40002, 7001);
    settle(&w);
    let ring2 = ring_written(&w.node).unwrap();
    assert!(
        ring2 - ring1 >= EVENT_RECORD,
        "drops within the lease were not written ({ring1} -> {ring2})"
    );

    // Once the lease ran out (3 s after the last renewal), drops write nothing.
    wait_lease(&w.node, false, Duration::from_secs(5)).unwrap();
    let c0 = w.ctl_json(&["counters", "--json"]);
    let ring3 = ring_written(&w.node).unwrap();
    burst_to_ext(&a, 40003, 7001);
    settle(&w);
    let c1 = w.ctl_json(&["counters", "--json"]);
    assert!(
        ep_drops(ep_row(&c1, &a), "drop_bw_egress") > ep_drops(ep_row(&c0, &a), "drop_bw_egress"),
        "no drops made: {c1:#}"
    );
    assert_eq!(
        ring_written(&w.node).unwrap(),
        ring3,
        "events written after the lease ran out"
    );

    // A new monitor shows none of the old drops: its first event is the flow
    // made after it started.
    let m = CtlChild::monitor(&w.node, &["--json", "--count", "1"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    udp_flow(&b, 44002, &server);
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    let events = end.json();
    assert_eq!(events.len(), 1, "{end:#?}");
    assert_eq!(events[0]["type"], "nat-new", "a stale event: {end:#?}");
    assert_eq!(events[0]["sport"], 44002, "{end:#?}");
    let c = w.ctl_json(&["counters", "--json", "--node"]);
    assert_eq!(node_counter(&c, "events_lost"), 0, "{c:#}");
    w.del(&a);
    w.del(&b);
}

// --- 5. datapath -------------------------------------------------------------------

#[test]
fn datapath_version_and_reload_keep_traffic_flowing() {
    let w = CtlWorld::new("10.98.12.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-dp-a", &json!({}));
    let b = w.add("b", "ctl-dp-b", &json!({}));
    let sluice = sluice_bin().unwrap().display().to_string();
    let hash = w.ctl_json(&["status", "--json"])["objectHash"]
        .as_str()
        .unwrap()
        .to_string();

    let out = w.ctl(&["datapath", "version", "--sluice", &sluice]);
    assert!(out.success(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!("pinned:   {hash} (map layout v1)").as_str(),
            format!("embedded: {hash}").as_str(),
            "the pinned programs are this sluice's",
        ],
        "{out}"
    );

    // A connection open across the reload, and one made after it.
    let server = EchoServer::start(&b.pod.path, b.sock(CPORT)).unwrap();
    let open = tcp_connect(&a.pod.path, None, b.sock(CPORT)).unwrap();
    tcp_echo_on(&open, 64 << 10, 1).unwrap();
    let c0 = w.node.counters().unwrap();
    let out = w.ctl(&["datapath", "reload", "--sluice", &sluice]);
    assert!(out.success(), "{out}");
    assert_eq!(
        out.stdout.trim(),
        format!(
            "reloaded {}: object {hash} -> {hash}",
            w.node.pin_root().display()
        ),
        "{out}"
    );
    tcp_echo_on(&open, 64 << 10, 2).expect("the connection open across the reload");
    let new = tcp_connect(&a.pod.path, None, b.sock(CPORT)).expect("a new connection");
    tcp_echo_on(&new, 64 << 10, 3).expect("a new connection");
    let c1 = w.node.counters().unwrap();
    c1.assert_not_reset(&c0);
    assert!(
        c1.since(&c0).get("from_pod_to_local_pod") > 0,
        "the programs do not see the traffic after the reload: {}",
        c1.since(&c0)
    );
    // The pods' programs are the pinned ones.
    let root = w.node.pin_root();
    let (from_pod, to_pod) = (
        look::pinned_prog_id(&root.join("progs").join("from_pod")).unwrap(),
        look::pinned_prog_id(&root.join("progs").join("to_pod")).unwrap(),
    );
    for p in [&a, &b] {
        let netns = w.node.netns_path();
        let ing = look::tc_bpf_filters(&netns, &p.added.host_veth, true).unwrap();
        let eg = look::tc_bpf_filters(&netns, &p.added.host_veth, false).unwrap();
        assert_eq!(ing, vec![("from_pod".to_string(), from_pod)], "{}", p.cid);
        assert_eq!(eg, vec![("to_pod".to_string(), to_pod)], "{}", p.cid);
    }
    assert_eq!(server.peers().tcp.len(), 2, "{:?}", server.peers());
    drop((open, new));
    w.del(&a);
    w.del(&b);
    w.node.assert_clean(NETWORK);
}

/// The pinned link ids under `<root>/links`.
fn pinned_link_ids(root: &Path) -> Vec<u32> {
    look::files(&root.join("links"))
        .unwrap()
        .iter()
        .map(|f| {
            let l = look::bpf_link_pinned(&root.join("links").join(f)).unwrap();
            l["id"].as_u64().unwrap() as u32
        })
        .collect()
}

/// Programs `bpftool net` shows on the node's interfaces (tc and XDP), by
/// interface name.
fn net_programs(w: &CtlWorld) -> Vec<String> {
    let out = exec::tool(Some(&w.node.netns_path()), "bpftool", &["net", "-j"]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut found = Vec::new();
    for section in v.as_array().unwrap() {
        for kind in ["xdp", "tc"] {
            for e in section[kind].as_array().into_iter().flatten() {
                found.push(format!(
                    "{kind} {} {}",
                    e["devname"].as_str().unwrap_or("?"),
                    e["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    found
}

#[test]
fn datapath_detach_all_asks_first_then_leaves_pods_to_kernel_routing() {
    let w = CtlWorld::new("10.98.13.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-det-a", &json!({}));
    let b = w.add(
        "b",
        "ctl-det-b",
        &json!({"portMappings": [mapping(18080, CPORT, "tcp", "")]}),
    );
    let sluice = sluice_bin().unwrap().display().to_string();
    let root = w.node.pin_root().to_path_buf();
    let netns = w.node.netns_path();
    let links0 = look::files(&root.join("links")).unwrap();
    let ids = pinned_link_ids(&root);
    let net0 = net_programs(&w);
    for p in [&a, &b] {
        assert!(
            net0.iter()
                .any(|n| n == &format!("tc {} from_pod", p.added.host_veth)),
            "{net0:?}"
        );
    }
    // The uplink's tc programs: pinned tcx links, or (no tcx) cls_bpf filters.
    let uplink_tc = format!("tc {UPLINK} uplink_in");
    assert!(
        if kernel::tcx() {
            links0.iter().any(|l| l.starts_with("uplink"))
        } else {
            net0.contains(&uplink_tc)
        } && links0.iter().any(|l| l.starts_with("cgroup-")),
        "{links0:?} {net0:?}"
    );

    // Without --yes: says what it would do, changes nothing.
    let out = w.ctl(&["datapath", "detach-all", "--sluice", &sluice]);
    assert!(out.success(), "{out}");
    assert!(
        out.stdout
            .contains("would detach the programs of 2 pod interfaces")
            && out.stdout.contains(&a.added.host_veth)
            && out.stdout.contains(&b.added.host_veth)
            && out
                .stdout
                .contains(&format!("{} pinned links", links0.len()))
            && out.stdout.contains("--yes"),
        "{out}"
    );
    assert_eq!(look::files(&root.join("links")).unwrap(), links0);
    assert_eq!(net_programs(&w), net0);
    let c0 = w.node.counters().unwrap();
    tcp_echo(&b.pod, IpAddr::V4(b.ip), &a.pod, 64 << 10).unwrap();
    assert!(
        w.node
            .counters()
            .unwrap()
            .since(&c0)
            .get("from_pod_to_local_pod")
            > 0
    );

    // Run where the host veths are not (the host's namespace): refused,
    // nothing detached.
    let out = exec::run(
        None,
        &sluicectl_bin().unwrap(),
        &[
            "--pin-root",
            &root.display().to_string(),
            "datapath",
            "detach-all",
            "--yes",
            "--sluice",
            &sluice,
        ],
        &[],
        b"",
    )
    .unwrap();
    assert_refused(&out, &["detach-all failed", "run it in the node's"]);
    assert_eq!(look::files(&root.join("links")).unwrap(), links0);
    assert_eq!(net_programs(&w), net0);

    // With --yes: every program off its hook.
    let out = w.ctl(&["datapath", "detach-all", "--yes", "--sluice", &sluice]);
    assert!(out.success(), "{out}");
    for want in [
        format!("detached from {}:", root.display()),
        format!("pod interface {}", a.added.host_veth),
        format!("pod interface {}", b.added.host_veth),
        "maps and programs stay pinned".to_string(),
    ] {
        assert!(out.stdout.contains(&want), "no {want:?} in: {out}");
    }
    for l in &links0 {
        assert!(
            out.stdout.contains(&format!("link {l}")),
            "link {l} not reported: {out}"
        );
    }
    assert_eq!(
        look::files(&root.join("links")).unwrap(),
        Vec::<String>::new()
    );
    wait_links_gone(&ids, Duration::from_secs(5)).unwrap();
    let net = net_programs(&w);
    assert!(net.is_empty(), "programs still attached: {net:?}");
    for p in [&a, &b] {
        for ingress in [true, false] {
            let f = look::tc_bpf_filters(&netns, &p.added.host_veth, ingress).unwrap();
            assert!(f.is_empty(), "{}: {f:?}", p.added.host_veth);
        }
    }
    let cg = look::cgroup_sock_programs(w.cgroup.path()).unwrap();
    assert!(cg.is_empty(), "socket hooks still on the cgroup: {cg:?}");
    // Maps and programs stay: sluicectl still reads them.
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(st["links"], json!([]), "{st:#}");
    assert_eq!(st["hostPort"]["socketHooks"], json!([]), "{st:#}");
    assert_eq!(st["endpoints"], 2, "{st:#}");
    assert!(!look::files(&root.join("progs")).unwrap().is_empty());

    // Pods keep kernel routing; the datapath sees nothing of it.
    let c0 = w.ctl_json(&["counters", "--json"]);
    tcp_echo(&b.pod, IpAddr::V4(b.ip), &a.pod, 64 << 10).expect("pod to pod after detach-all");
    tcp_echo(&a.pod, IpAddr::V4(a.ip), &b.pod, 64 << 10).expect("pod to pod after detach-all");
    let c1 = w.ctl_json(&["counters", "--json"]);
    assert_eq!(c1, c0, "the datapath counted traffic after detach-all");

    // The next ADD attaches the uplink (and its own pod) again.
    let c = w.add("c", "ctl-det-c", &json!({}));
    let links = look::files(&root.join("links")).unwrap();
    let uplink: Vec<&String> = links0.iter().filter(|l| l.starts_with("uplink")).collect();
    for l in &uplink {
        assert!(links.contains(l), "{l} not attached again: {links:?}");
    }
    let net = net_programs(&w);
    assert!(
        net.iter()
            .any(|n| n == &format!("tc {} from_pod", c.added.host_veth)),
        "{net:?}"
    );
    assert!(kernel::tcx() || net.contains(&uplink_tc), "{net:?}");
    assert!(
        !net.iter().any(|n| n.contains(&a.added.host_veth)),
        "a was attached again: {net:?}"
    );
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(
        st["uplink"]["ifindex"],
        look::ifindex(w.node.name(), UPLINK).unwrap(),
        "{st:#}"
    );
    w.del(&a);
    w.del(&b);
    w.del(&c);
    w.node.assert_clean(NETWORK);
}

// --- 6. nat -------------------------------------------------------------------

#[test]
fn nat_list_filters_and_flush_is_reflected_in_traffic() {
    let w = CtlWorld::new("10.98.14.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-nat-a", &json!({}));
    let b = w.add("b", "ctl-nat-b", &json!({}));
    let server = ext_server(&w);
    let ua = udp_socket(&a.pod.path, a.sock(45001)).unwrap();
    udp_echo_on(&ua, server.addr, b"one", 3, Duration::from_secs(2)).unwrap();
    let seen_ua = server.peers().udp[0];
    let ta = tcp_connect(&a.pod.path, Some(a.sock(45002)), server.addr).unwrap();
    tcp_echo_on(&ta, 4096, 1).unwrap();
    let seen_ta = server.peers().tcp[0];
    let seen_ub = udp_flow(&b, 45003, &server);

    let flows = w.ctl_json(&["nat", "list", "--json"]);
    let flows = flows.as_array().unwrap();
    assert_eq!(flows.len(), 3, "{flows:#?}");
    for (p, proto, port, seen, state) in [
        (&a, "udp", 45001, seen_ua, "udp"),
        (&a, "tcp", 45002, seen_ta, "established"),
        (&b, "udp", 45003, seen_ub, "udp"),
    ] {
        let f = flows
            .iter()
            .find(|f| f["proto"] == proto && f["podPort"] == port)
            .unwrap_or_else(|| panic!("no {proto} flow from {port}: {flows:#?}"));
        assert_eq!(
            keys(f),
            sorted(&[
                "proto",
                "podIp",
                "podPort",
                "natIp",
                "natPort",
                "origin",
                "dstIp",
                "dstPort",
                "state",
                "idleSeconds",
                "hostIfindex"
            ]),
            "{f:#}"
        );
        let want = json!({
            "podIp": p.ip_string(),
            "natIp": NODE_IP,
            "natPort": seen.port(),
            "origin": "pod",
            "dstIp": EXT_IP,
            "dstPort": server.addr.port(),
            "state": state,
            "hostIfindex": w.host_ifindex(p),
        });
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&f[k], v, "{k} of {f:#}");
        }
        assert!(f["idleSeconds"].as_u64().is_some_and(|s| s < 60), "{f:#}");
    }
    // Filters.
    let count = |args: &[&str]| -> usize {
        let mut all = vec!["nat", "list", "--json"];
        all.extend_from_slice(args);
        w.ctl_json(&all).as_array().unwrap().len()
    };
    let (ia, ib) = (a.ip_string(), b.ip_string());
    assert_eq!(count(&["--pod", &ia]), 2);
    assert_eq!(count(&["--pod", "ctl-nat-b"]), 1);
    assert_eq!(count(&["--pod", "ctl-nat"]), 3);
    assert_eq!(count(&["--proto", "udp"]), 2);
    assert_eq!(count(&["--proto", "tcp"]), 1);
    assert_eq!(count(&["--proto", "icmp"]), 0);
    assert_eq!(count(&["--dst", EXT_IP]), 3);
    assert_eq!(count(&["--dst", "192.168.50.99"]), 0);
    assert_eq!(count(&["--pod", &ia, "--proto", "udp"]), 1);
    assert_eq!(count(&["--pod", &ib, "--proto", "tcp"]), 0);
    let out = w.ctl(&["nat", "list"]);
    assert!(out.success(), "{out}");
    for want in [
        "PROTO",
        "DESTINATION",
        &format!("{ia}:45001"),
        &seen_ua.to_string(),
    ] {
        assert!(out.stdout.contains(want), "no {want:?} in: {out}");
    }

    // flush --pod: a's flows go, b's stay.
    let out = w.ctl(&["nat", "flush", "--pod", &ia]);
    assert!(out.success(), "{out}");
    assert_eq!(
        out.stdout.trim(),
        format!("deleted 2 masqueraded flows of {ia}")
    );
    assert_eq!(count(&["--pod", &ia]), 0);
    assert_eq!(count(&["--pod", &ib]), 1);
    // a's UDP socket starts a new flow with its next datagram; the open TCP
    // connection has no flow any more: its segments are dropped.
    let c0 = w.node.counters().unwrap();
    udp_echo_on(&ua, server.addr, b"two", 3, Duration::from_secs(2)).unwrap();
    let again = w.ctl_json(&["nat", "list", "--json", "--pod", &ia]);
    assert_eq!(again.as_array().map(Vec::len), Some(1), "{again:#}");
    assert_eq!(again[0]["podPort"], 45001, "{again:#}");
    assert_eq!(
        w.node.counters().unwrap().since(&c0).get("masq_new_flow"),
        1
    );
    std::io::Write::write_all(&mut &ta, b"after the flush").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while w
        .node
        .counters()
        .unwrap()
        .since(&c0)
        .get("drop_masq_no_flow")
        == 0
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        w.node
            .counters()
            .unwrap()
            .since(&c0)
            .get("drop_masq_no_flow")
            > 0,
        "the flushed TCP flow's segment was not dropped: {}",
        w.node.counters().unwrap().since(&c0)
    );

    // flush --all.
    let out = w.ctl(&["nat", "flush", "--all"]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "deleted 2 masqueraded flows");
    assert_eq!(count(&[]), 0);
    let out = w.ctl(&["nat", "flush", "--all"]);
    assert_eq!(out.stdout.trim(), "deleted 0 masqueraded flows", "{out}");
    drop(ta);
    w.del(&a);
    w.del(&b);
}

/// `nat flush`'s help: UDP opens a new flow with its next packet, its NAT port
/// chosen again by the flow's hash (so usually the same): the datagram after a
/// flush must arrive, the flow must be back in `nat list`, and the server must
/// still see one source.
#[test]
fn nat_flush_recreates_a_udp_flow_from_its_next_datagram() {
    let w = CtlWorld::new("10.98.15.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-natport-a", &json!({}));
    let server = ext_server(&w);
    let u = udp_socket(&a.pod.path, a.sock(45101)).unwrap();
    udp_echo_on(&u, server.addr, b"one", 3, Duration::from_secs(2)).unwrap();
    let out = w.ctl(&["nat", "flush", "--all"]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "deleted 1 masqueraded flows");
    udp_echo_on(&u, server.addr, b"two", 3, Duration::from_secs(2)).unwrap();
    let sources = server.peers().udp;
    assert_eq!(sources.len(), 2, "{sources:?}");
    assert_eq!(
        sources[0].ip(),
        sources[1].ip(),
        "both datagrams leave with the masquerade address: {sources:?}"
    );
    let flows = w.ctl_json(&["nat", "list", "--json", "--pod", &a.cid]);
    assert_eq!(
        flows.as_array().map(Vec::len),
        Some(1),
        "the flow is back after the flush: {flows:#}"
    );
    assert_eq!(flows[0]["natPort"], sources[1].port(), "{flows:#}");
    w.del(&a);
}

// --- 7. ports -------------------------------------------------------------------

/// Asserts that a TCP connection from the external host to `to` is refused.
#[track_caller]
fn assert_ext_tcp_refused(w: &CtlWorld, to: SocketAddr) {
    match tcp_connect(&w.ext.netns_path(), None, to) {
        Ok(s) => panic!("TCP to {to} was accepted by {:?}", s.peer_addr()),
        Err(e) => assert!(e.0.contains("refused"), "TCP to {to}: {e}"),
    }
}

#[test]
fn ports_add_and_del_are_reflected_in_external_traffic() {
    let w = CtlWorld::new("10.98.16.0/24", &json!({})).unwrap();
    let a = w.add(
        "a",
        "ctl-ports-a",
        &json!({"portMappings": [mapping(18080, CPORT, "tcp", "")]}),
    );
    let server = EchoServer::start(&a.pod.path, a.sock(CPORT)).unwrap();
    let ia = a.ip_string();
    let list = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["ports", "list", "--json"];
        all.extend_from_slice(args);
        w.ctl_json(&all).as_array().unwrap().clone()
    };
    let l = list(&[]);
    assert_eq!(l.len(), 1, "{l:#?}");
    assert_eq!(l[0]["origin"], "cni");
    assert_eq!(l[0]["containerId"], a.cid.as_str());
    assert_ext_tcp_refused(&w, sa(node_ip(), 7000));

    // add: the external host reaches the pod on the new port.
    let out = w.ctl(&[
        "ports",
        "add",
        "--host-port",
        "7000",
        "--pod",
        &ia,
        "--container-port",
        "8080",
    ]);
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), format!("added *:7000/tcp -> {ia}:8080"));
    let l = list(&["--port", "7000"]);
    assert_eq!(l.len(), 1, "{l:#?}");
    let want = json!({
        "hostIp": "0.0.0.0", "hostPort": 7000, "protocol": "tcp", "podIp": ia,
        "containerPort": CPORT, "containerId": a.cid, "ifname": "eth0", "origin": "operator",
    });
    assert_eq!(l[0], want);
    let s = tcp_connect(&w.ext.netns_path(), None, sa(node_ip(), 7000)).unwrap();
    tcp_echo_on(&s, 64 << 10, 5).unwrap();
    let client = s.local_addr().unwrap();
    drop(s);
    assert_eq!(server.peers().tcp, vec![client], "the pod's server saw");
    // UDP by container id prefix.
    let out = w.ctl(&[
        "ports",
        "add",
        "--host-port",
        "7001",
        "--pod",
        "ctl-ports",
        "--container-port",
        "8080",
        "--proto",
        "udp",
    ]);
    assert!(out.success(), "{out}");
    let u = udp_socket(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    udp_echo_on(&u, sa(node_ip(), 7001), b"hp", 3, Duration::from_secs(2)).unwrap();
    assert_eq!(list(&["--proto", "udp"]).len(), 1);
    assert_eq!(list(&["--pod", &ia]).len(), 3);

    // Taken ports: refused naming the port and the owner, nothing changed.
    let before = list(&[]);
    let out = w.ctl(&[
        "ports",
        "add",
        "--host-port",
        "18080",
        "--pod",
        &ia,
        "--container-port",
        "9090",
    ]);
    assert_refused(&out, &["18080", &a.cid, "taken"]);
    let out = w.ctl(&[
        "ports",
        "add",
        "--host-port",
        "7000",
        "--pod",
        &ia,
        "--container-port",
        "9090",
    ]);
    assert_refused(&out, &["7000", "operator", &a.cid]);
    assert_eq!(list(&[]), before);

    // del: the port stops answering.
    let out = w.ctl(&["ports", "del", "--host-port", "7000"]);
    assert!(out.success(), "{out}");
    assert_eq!(
        out.stdout.trim(),
        format!("deleted *:7000/tcp -> {ia}:8080")
    );
    assert_ext_tcp_refused(&w, sa(node_ip(), 7000));
    let out = w.ctl(&["ports", "del", "--host-port", "7001", "--proto", "udp"]);
    assert!(out.success(), "{out}");
    assert!(
        udp_echo_on(
            &u,
            sa(node_ip(), 7001),
            b"hp",
            2,
            Duration::from_millis(500)
        )
        .is_err(),
        "UDP still answered on a deleted port"
    );
    let out = w.ctl(&["ports", "del", "--host-port", "7000"]);
    assert_refused(&out, &["no mapping", "7000"]);
    assert_eq!(list(&[]).len(), 1);
    // The CNI mapping still works.
    let s = tcp_connect(&w.ext.netns_path(), None, sa(node_ip(), 18080)).unwrap();
    tcp_echo_on(&s, 4096, 6).unwrap();
    drop(s);
    // An operator mapping is in no attachment record: the pod's DEL still
    // takes it, with the CNI one.
    let out = w.ctl(&[
        "ports",
        "add",
        "--host-port",
        "7002",
        "--pod",
        &ia,
        "--container-port",
        "8080",
    ]);
    assert!(out.success(), "{out}");
    assert_eq!(list(&[]).len(), 2);
    w.del(&a);
    assert!(list(&[]).is_empty(), "{:#?}", list(&[]));
    assert_ext_tcp_refused(&w, sa(node_ip(), 7002));
    w.node.assert_clean(NETWORK);
}

// --- 8. bandwidth -------------------------------------------------------------------

#[test]
fn bandwidth_set_changes_a_running_pods_rate_and_clear_removes_it() {
    let w = CtlWorld::new("10.98.17.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-bw-a", &json!({}));
    let b = w.add("b", "ctl-bw-b", &ingress_limited());
    let ia = a.ip_string();
    let ext = w.ext.netns_path();
    let pods_listed = || -> Vec<String> {
        let v = w.ctl_json(&["bandwidth", "list", "--json"]);
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerId"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(pods_listed(), vec![b.cid.clone()]);
    let g = w.ctl_json(&["bandwidth", "get", &ia, "--json"]);
    assert!(g["egress"].is_null() && g["ingress"].is_null(), "{g:#}");
    let g = w.ctl_json(&["bandwidth", "get", "ctl-bw-b", "--json"]);
    assert_eq!(g["ingress"]["rate"], RATE, "{g:#}");
    assert_eq!(g["ingress"]["burst"], BUCKET, "{g:#}");

    let drops = || {
        ep_drops(
            ep_row(&w.ctl_json(&["counters", "--json"]), &a),
            "drop_bw_egress",
        )
    };
    let blast = |port: u16| udp_blast(&a.pod.path, &ext, sa(ext_ip(), port), BLAST, SIZE).unwrap();
    // Unlimited: no drops.
    let free = blast(7001);
    assert_eq!(drops(), 0);
    assert!(free.received_bytes > 0);

    // A live limit: drops begin, far less gets through.
    let out = w.ctl(&[
        "bandwidth",
        "set",
        &ia,
        "--egress-rate",
        &RATE.to_string(),
        "--egress-burst",
        &BUCKET.to_string(),
    ]);
    assert!(out.success(), "{out}");
    assert_eq!(
        out.stdout.trim(),
        format!("egress: {RATE} bit/s, burst {BUCKET} bit, depth {DEPTH} bit (was none)")
    );
    let g = w.ctl_json(&["bandwidth", "get", &ia, "--json"]);
    assert_eq!(g["egress"]["rate"], RATE, "{g:#}");
    assert_eq!(g["egress"]["burst"], BUCKET, "{g:#}");
    assert!(g["ingress"].is_null(), "{g:#}");
    let mut listed = pods_listed();
    listed.sort();
    assert_eq!(listed, vec![a.cid.clone(), b.cid.clone()]);
    let limited = blast(7002);
    settle(&w);
    let dropped = drops();
    println!("unlimited {free:?}\nlimited {limited:?}, {dropped} dropped");
    assert!(dropped > 0, "no drop_bw_egress after the live limit");
    assert!(
        limited.received_bytes * 3 < free.received_bytes,
        "limited {limited:?} is not far below unlimited {free:?}"
    );
    let g = w.ctl_json(&["bandwidth", "get", &ia, "--json"]);
    assert_eq!(g["egress"]["dropped"], dropped, "{g:#}");

    // --clear-egress: the limit goes, drops stop.
    let out = w.ctl(&["bandwidth", "set", "ctl-bw-a", "--clear-egress"]);
    assert!(out.success(), "{out}");
    assert_eq!(
        out.stdout.trim(),
        format!("egress: none (was {RATE} bit/s, burst {BUCKET} bit, depth {DEPTH} bit)")
    );
    assert_eq!(pods_listed(), vec![b.cid.clone()]);
    let g = w.ctl_json(&["bandwidth", "get", &ia, "--json"]);
    assert!(g["egress"].is_null(), "{g:#}");
    let again = blast(7003);
    settle(&w);
    assert_eq!(drops(), dropped, "drops after --clear-egress");
    assert!(
        limited.received_bytes * 3 < again.received_bytes,
        "after --clear-egress {again:?} vs limited {limited:?}"
    );
    let out = w.ctl(&["bandwidth", "list"]);
    assert!(
        out.success() && out.stdout.contains(&b.ip_string()),
        "{out}"
    );
    w.del(&a);
    w.del(&b);
    w.node.assert_clean(NETWORK);
}

// --- 9. completions -------------------------------------------------------------------

#[test]
fn completions_print_scripts_for_bash_zsh_and_fish() {
    let bin = sluicectl_bin().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = exec::run(None, &bin, &["completions", shell], &[], b"").unwrap();
        assert!(out.success(), "{out}");
        assert!(out.stdout.len() > 1000, "{shell}: a short script: {out}");
        for word in ["monitor", "detach-all", "services", "sluicectl"] {
            assert!(out.stdout.contains(word), "{shell}: no {word}");
        }
        assert!(out.stderr.is_empty(), "{out}");
    }
    let out = exec::run(None, &bin, &["completions", "tcsh"], &[], b"").unwrap();
    assert_refused(&out, &["tcsh"]);
}

// --- 10. errors -------------------------------------------------------------------

// --- target: --network, SLUICE_NETWORK, --pin-root ------------------------------

#[test]
fn a_network_name_finds_its_default_pin_root() {
    // A name with a dot: its directory is the name with `_` and a hash.
    let pid = std::process::id();
    let net = format!("slt{pid}.ctl");
    let pins = DefaultPinRoots::new(&format!("slt{pid}_ctl-"));
    let w = CtlWorld::new("10.98.22.0/24", &json!({})).unwrap();
    let mut conf = w.conf.clone();
    conf.as_object_mut().unwrap().remove("pinRoot");
    conf["name"] = json!(net);
    let pod = w.node.pod("a").unwrap();
    let added = add(&w.node, &conf, "ctl-net-a", &pod);
    let made = pins.list();
    assert_eq!(made.len(), 1, "pin roots made: {made:?}");
    let root = format!("{DEFAULT_PIN_BASE}/{}", made[0]);
    let bin = sluicectl_bin().unwrap();
    let netns = w.node.netns_path();
    let run = |args: &[&str], env: &[(String, String)]| -> Value {
        let out = exec::run(Some(&netns), &bin, args, env, b"").unwrap();
        assert!(out.success(), "{out}");
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let st = run(&["--network", &net, "status", "--json"], &[]);
    assert_eq!(st["pinRoot"], root, "{st:#}");
    assert_eq!(st["endpoints"], 1, "{st:#}");
    let eps = run(&["-n", &net, "endpoints", "--json"], &[]);
    assert_eq!(eps[0]["ip"], added.ip().to_string(), "{eps:#}");
    let st = run(
        &["status", "--json"],
        &[("SLUICE_NETWORK".to_string(), net.clone())],
    );
    assert_eq!(st["pinRoot"], root, "{st:#}");
    // --pin-root wins over --network.
    let st = run(
        &[
            "--network",
            "nosuchnet",
            "--pin-root",
            &root,
            "status",
            "--json",
        ],
        &[],
    );
    assert_eq!(st["pinRoot"], root, "{st:#}");
    // Neither: the one network under /sys/fs/bpf/sluice, or a refusal naming
    // them when there are several (other datapaths of this machine).
    let networks: Vec<String> = look::files(Path::new(DEFAULT_PIN_BASE))
        .unwrap()
        .into_iter()
        .filter(|f| Path::new(DEFAULT_PIN_BASE).join(f).join("maps").is_dir())
        .collect();
    let out = exec::run(Some(&netns), &bin, &["status", "--json"], &[], b"").unwrap();
    if networks.len() == 1 {
        assert!(out.success(), "{out}");
        let st: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(st["pinRoot"], root, "{st:#}");
    } else {
        assert_refused(&out, &["several networks", "--network", &made[0]]);
    }
    del(&w.node, &conf, "ctl-net-a", &pod);
    w.node.assert_clean(&net);
}

/// Read-only subcommands, each of which needs a datapath.
const READERS: [&[&str]; 11] = [
    &["status"],
    &["status", "--json"],
    &["endpoints", "--json"],
    &["counters", "--json"],
    &["monitor", "--json", "--duration", "1"],
    &["nat", "list"],
    &["ports", "list"],
    &["bandwidth", "list"],
    &["services", "list"],
    &["services", "flows", "--json"],
    &["datapath", "version"],
];

fn with_root<'a>(root: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--pin-root", root];
    all.extend_from_slice(args);
    all
}

#[test]
fn without_a_datapath_every_subcommand_says_so() {
    let bin = sluicectl_bin().unwrap();
    // A pin root that exists but holds nothing.
    let empty = BpffsDir::new().unwrap();
    let root = empty.display();
    for args in READERS {
        let out = exec::run(None, &bin, &with_root(&root, args), &[], b"").unwrap();
        assert_refused(&out, &["no datapath pinned", &root]);
    }
    // A network that does not exist (default pin root /sys/fs/bpf/sluice/<name>).
    let net = format!("sltnonet{}", std::process::id());
    for args in [&["status"][..], &["monitor"][..]] {
        let mut all = vec!["--network", net.as_str()];
        all.extend_from_slice(args);
        let out = exec::run(None, &bin, &all, &[], b"").unwrap();
        assert_refused(&out, &["no datapath", &format!("/sys/fs/bpf/sluice/{net}")]);
    }
    // The same through the environment.
    let out = exec::run(
        None,
        &bin,
        &["endpoints"],
        &[("SLUICE_NETWORK".to_string(), net.clone())],
        b"",
    )
    .unwrap();
    assert_refused(&out, &["no datapath", &net]);
    // A write command changes nothing on an empty pin root.
    let out = exec::run(
        None,
        &bin,
        &with_root(
            &root,
            &[
                "ports",
                "add",
                "--host-port",
                "7000",
                "--pod",
                "x",
                "--container-port",
                "80",
            ],
        ),
        &[],
        b"",
    )
    .unwrap();
    assert_refused(&out, &["no datapath pinned", &root]);
    assert!(look::files(empty.path()).unwrap().is_empty());
}

#[test]
fn another_map_layout_is_refused_naming_both_versions() {
    let bin = sluicectl_bin().unwrap();
    let dir = BpffsDir::new().unwrap();
    fake_meta(dir.path(), 99).unwrap();
    let root = dir.display();
    for args in READERS {
        let out = exec::run(None, &bin, &with_root(&root, args), &[], b"").unwrap();
        assert_refused(&out, &["layout v99", "reads v1", &root]);
    }
    let out = exec::run(
        None,
        &bin,
        &with_root(&root, &["bandwidth", "set", "x", "--egress-rate", "1000"]),
        &[],
        b"",
    )
    .unwrap();
    assert_refused(&out, &["layout v99", "reads v1"]);
    // Version 0: a first load that did not finish.
    let dir0 = BpffsDir::new().unwrap();
    fake_meta(dir0.path(), 0).unwrap();
    let out = exec::run(
        None,
        &bin,
        &with_root(&dir0.display(), &["status"]),
        &[],
        b"",
    )
    .unwrap();
    assert_refused(&out, &["not loaded", &dir0.display()]);
}

#[test]
fn bad_input_is_refused_naming_it_and_changes_nothing() {
    let w = CtlWorld::new("10.98.18.0/24", &json!({})).unwrap();
    let a = w.add(
        "a",
        "ctl-bad-a",
        &json!({"portMappings": [mapping(18080, CPORT, "tcp", "")]}),
    );
    let ia = a.ip_string();
    let ports0 = w.ctl_json(&["ports", "list", "--json"]);
    let bw0 = w.ctl_json(&["bandwidth", "list", "--json"]);
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // Out of range.
        (
            vec![
                "ports",
                "add",
                "--host-port",
                "0",
                "--pod",
                &ia,
                "--container-port",
                "80",
            ],
            vec!["invalid value '0'", "--host-port"],
        ),
        (
            vec![
                "ports",
                "add",
                "--host-port",
                "7000",
                "--pod",
                &ia,
                "--container-port",
                "0",
            ],
            vec!["invalid value '0'", "--container-port"],
        ),
        (
            vec!["monitor", "--count", "0"],
            vec!["invalid value '0'", "--count"],
        ),
        (
            vec!["counters", "--watch", "0"],
            vec!["invalid value '0'", "--watch"],
        ),
        // A pod matching nothing.
        (
            vec!["counters", "--pod", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec!["counters", "--pod", "10.98.18.250"],
            vec!["no pod", "\"10.98.18.250\""],
        ),
        (
            vec!["monitor", "--pod", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec!["monitor", "--pod", "10.98.18.250"],
            vec!["no pod", "\"10.98.18.250\""],
        ),
        (
            vec!["ports", "list", "--pod", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec![
                "ports",
                "add",
                "--host-port",
                "7000",
                "--pod",
                "nosuchpod",
                "--container-port",
                "80",
            ],
            vec!["--pod nosuchpod", "no pod"],
        ),
        (
            vec![
                "ports",
                "add",
                "--host-port",
                "7000",
                "--pod",
                "10.98.18.250",
                "--container-port",
                "80",
            ],
            vec!["--pod 10.98.18.250", "no pod"],
        ),
        (
            vec![
                "ports",
                "add",
                "--host-port",
                "7000",
                "--pod",
                "fd00::1",
                "--container-port",
                "80",
            ],
            vec!["--pod fd00::1", "no pod"],
        ),
        (
            vec!["nat", "list", "--pod", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec!["nat", "flush", "--pod", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec!["bandwidth", "get", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec![
                "bandwidth",
                "set",
                "10.98.18.250",
                "--egress-rate",
                "1000000",
            ],
            vec!["no pod", "\"10.98.18.250\""],
        ),
        // Unknown names.
        (
            vec!["monitor", "--reason", "nonsense"],
            vec!["\"nonsense\" is not a drop reason"],
        ),
        // A counter that is not a drop: no monitor event could ever match it.
        (
            vec!["monitor", "--reason", "masq_new_flow"],
            vec!["\"masq_new_flow\" is not a drop reason"],
        ),
        (
            vec!["monitor", "--type", "nonsense"],
            vec!["invalid value 'nonsense'", "--type"],
        ),
        (
            vec!["monitor", "--proto", "gre"],
            vec!["invalid value 'gre'", "--proto"],
        ),
        (
            vec!["nat", "list", "--proto", "sctp"],
            vec!["invalid value 'sctp'", "--proto"],
        ),
        (
            vec!["services", "flows", "--pod", "nosuchpod"],
            vec!["no pod", "\"nosuchpod\""],
        ),
        (
            vec!["services", "flows", "--pod", "10.98.18.250"],
            vec!["no pod", "\"10.98.18.250\""],
        ),
        (
            vec!["services", "flows", "--proto", "icmp"],
            vec!["invalid value 'icmp'", "--proto"],
        ),
        (
            vec!["nosuchcommand"],
            vec!["unrecognized subcommand 'nosuchcommand'"],
        ),
        // Bad addresses.
        (
            vec!["endpoints", "--ip", "10.98.18.300"],
            vec!["invalid value '10.98.18.300'", "--ip"],
        ),
        (
            vec!["monitor", "--ip", "nope"],
            vec!["invalid value 'nope'", "--ip"],
        ),
        (
            vec!["nat", "list", "--dst", "1.2.3"],
            vec!["invalid value '1.2.3'", "--dst"],
        ),
        (
            vec![
                "ports",
                "add",
                "--host-port",
                "7000",
                "--pod",
                &ia,
                "--container-port",
                "80",
                "--host-ip",
                "300.1.1.1",
            ],
            vec!["invalid value '300.1.1.1'", "--host-ip"],
        ),
    ];
    for (args, words) in &cases {
        let out = w.ctl(args);
        assert_refused(&out, words);
    }
    assert_eq!(w.ctl_json(&["ports", "list", "--json"]), ports0);
    assert_eq!(w.ctl_json(&["bandwidth", "list", "--json"]), bw0);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// Subcommands run as nobody in [`without_privileges_reads_and_writes_are_refused`].
fn unprivileged_cases(ia: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["status"],
        vec!["endpoints", "--json"],
        vec!["monitor", "--json", "--duration", "1"],
        vec![
            "ports",
            "add",
            "--host-port",
            "7000",
            "--pod",
            ia,
            "--container-port",
            "80",
        ],
        vec!["bandwidth", "set", ia, "--egress-rate", "1000000"],
        vec!["nat", "flush", "--all"],
    ]
}

#[test]
fn without_privileges_reads_and_writes_are_refused() {
    let w = CtlWorld::new("10.98.19.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-priv-a", &json!({}));
    let server = ext_server(&w);
    udp_flow(&a, 46001, &server);
    let root = w.node.pin_root().display().to_string();
    let ia = a.ip_string();
    let ports0 = w.ctl_json(&["ports", "list", "--json"]);
    for args in unprivileged_cases(&ia) {
        let out = sluicectl_as_nobody(&w.node, &with_root(&root, &args)).unwrap();
        assert_eq!(out.status, Some(1), "{out}");
        assert!(
            !out.stderr.trim().is_empty() && out.stdout.is_empty(),
            "{out}"
        );
    }
    // Nothing was written.
    assert_eq!(w.ctl_json(&["ports", "list", "--json"]), ports0);
    let g = w.ctl_json(&["bandwidth", "get", &ia, "--json"]);
    assert!(g["egress"].is_null(), "{g:#}");
    let flows = w.ctl_json(&["nat", "list", "--json"]);
    assert_eq!(flows.as_array().map(Vec::len), Some(1), "{flows:#}");
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// The refusal must say why: root (`CAP_BPF`) is needed, not that there is no
/// datapath.
#[test]
fn without_privileges_the_refusal_says_root_is_needed() {
    let w = CtlWorld::new("10.98.20.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-priv2-a", &json!({}));
    let root = w.node.pin_root().display().to_string();
    let ia = a.ip_string();
    for args in unprivileged_cases(&ia) {
        let out = sluicectl_as_nobody(&w.node, &with_root(&root, &args)).unwrap();
        assert_eq!(out.status, Some(1), "{out}");
        let err = out.stderr.to_lowercase();
        assert!(
            (err.contains("needs root") || err.contains("cap_bpf")) && !err.contains("no datapath"),
            "the refusal should say that root (CAP_BPF) is needed: {out}"
        );
    }
    w.del(&a);
}

/// `--pod` with an address no pod has: every other subcommand refuses it
/// ("no pod with address or container id ..."), as it refuses a container id
/// matching nothing.
#[test]
fn nat_refuses_a_pod_address_no_pod_has() {
    let w = CtlWorld::new("10.98.21.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-natpod-a", &json!({}));
    for args in [
        &["nat", "list", "--pod", "10.98.21.250"][..],
        &["nat", "flush", "--pod", "10.98.21.250"][..],
    ] {
        let out = w.ctl(args);
        assert_refused(&out, &["no pod", "10.98.21.250"]);
    }
    w.del(&a);
}

// --- 11. services (kube-proxy) ---------------------------------------------------

/// The Service range of the services tests' configs (outside their pod
/// subnets, 10.98.x.0/24), and a ClusterIP in it.
const SVC_RANGE: &str = "10.96.0.0/16";
const CLUSTER_IP: &str = "10.96.0.10";
/// The port of [`CLUSTER_IP`], translated (DNAT) to the pod's [`CPORT`].
const SVC_PORT: u16 = 80;
/// `natMaxFlows` of the services tests: the kernel flow table's capacity.
const KFLOWS_MAX: u64 = 4096;

fn cluster_ip() -> Ipv4Addr {
    CLUSTER_IP.parse().unwrap()
}

/// The value of sample `series` (its name and labels as printed) in the
/// exposition `text`, as printed.
#[track_caller]
fn metric<'a>(text: &'a str, series: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

/// [`metric`] of a counter or a count.
#[track_caller]
fn metric_u64(text: &str, series: &str) -> u64 {
    let v = metric(text, series);
    v.parse()
        .unwrap_or_else(|e| panic!("{series} {v:?} is no count ({e})"))
}

/// `sluicectl metrics` of `w`'s node (its own state directory for the labels).
#[track_caller]
fn metrics_text(w: &CtlWorld) -> String {
    let state = w.node.state_dir().join(NETWORK).display().to_string();
    let out = w.ctl(&["metrics", "--state-dir", &state]);
    assert!(out.success(), "{out}");
    out.stdout
}

/// kube-proxy's iptables mode in a few words: a DNAT rule in the node
/// namespace's `PREROUTING` from [`CLUSTER_IP`]:[`SVC_PORT`] to `to`'s [`CPORT`].
fn dnat_service(w: &CtlWorld, to: &CtlPod) {
    let dest = format!("{}:{CPORT}", to.ip);
    let cluster = format!("{CLUSTER_IP}/32");
    let port = SVC_PORT.to_string();
    exec::tool(
        Some(&w.node.netns_path()),
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            &cluster,
            "-p",
            "tcp",
            "--dport",
            &port,
            "-j",
            "DNAT",
            "--to-destination",
            &dest,
        ],
    )
    .unwrap();
}

/// The one element of a JSON array.
#[track_caller]
fn only(v: &Value) -> &Value {
    match v.as_array().map(Vec::as_slice) {
        Some([one]) => one,
        _ => panic!("expected exactly one element: {v:#}"),
    }
}

#[test]
fn services_show_a_cluster_ip_connection_handed_to_the_nodes_stack() {
    let w = CtlWorld::new(
        "10.98.23.0/24",
        &json!({"serviceCIDRs": [SVC_RANGE], "natMaxFlows": KFLOWS_MAX}),
    )
    .unwrap();
    let a = w.add("a", "ctl-svc-a", &json!({}));
    let b = w.add("b", "ctl-svc-b", &json!({}));

    // Before any Service traffic: the config's range, no flow yet.
    let l = w.ctl_json(&["services", "list", "--json"]);
    assert_eq!(
        keys(&l),
        sorted(&["handling", "ranges", "kernelFlows", "kernelFlowsCapacity"]),
        "{l:#}"
    );
    assert_eq!(
        l["ranges"],
        json!([{"cidr": SVC_RANGE, "family": "ipv4", "owner": "config"}]),
        "{l:#}"
    );
    assert_eq!(l["kernelFlows"], 0, "{l:#}");
    assert_eq!(l["kernelFlowsCapacity"], KFLOWS_MAX, "{l:#}");
    assert_eq!(
        l["handling"],
        format!(
            "handed to the node's stack (kube-proxy) for 1 Service range ({SVC_RANGE}); flows it translates stay on its path"
        ),
        "{l:#}"
    );
    assert_eq!(w.ctl_json(&["services", "flows", "--json"]), json!([]));

    // A Service: the ClusterIP DNATed to b by the node's netfilter, a real
    // TCP connection from a to it, echoed by b.
    dnat_service(&w, &b);
    let server = EchoServer::start(&b.pod.path, b.sock(CPORT)).unwrap();
    let sport = 47001;
    let conn = tcp_connect(&a.pod.path, Some(a.sock(sport)), sa(cluster_ip(), SVC_PORT)).unwrap();
    tcp_echo_on(&conn, 64 << 10, 11).unwrap();
    // b saw a itself: the stack translated the destination only.
    assert_eq!(server.peers().tcp, vec![a.sock(sport)]);
    settle(&w);

    // The flow of b, the Service's endpoint: delivered into it by the stack.
    let fb = w.ctl_json(&["services", "flows", "--json", "--pod", &b.ip_string()]);
    let f = only(&fb);
    assert_eq!(
        keys(f),
        sorted(&[
            "proto",
            "podIp",
            "podPort",
            "peerIp",
            "peerPort",
            "origin",
            "hostIfindex",
            "hostIfname",
            "containerId",
            "ifname",
            "ageSeconds",
        ]),
        "{f:#}"
    );
    let want = json!({
        "proto": "tcp",
        "podIp": b.ip_string(),
        "podPort": CPORT,
        "peerIp": a.ip_string(),
        "peerPort": sport,
        "origin": "delivered",
        "hostIfindex": w.host_ifindex(&b),
        "hostIfname": b.added.host_veth,
        "containerId": b.cid,
        "ifname": "eth0",
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&f[k], v, "{k} of {f:#}");
    }
    assert!(
        f["ageSeconds"].as_u64().is_some_and(|s| s < 60),
        "ageSeconds: {f:#}"
    );
    // By container id prefix, and by protocol.
    assert_eq!(
        w.ctl_json(&["services", "flows", "--json", "--pod", "ctl-svc-b"]),
        fb
    );
    let tcp = w.ctl_json(&["services", "flows", "--json", "--proto", "tcp"]);
    assert!(tcp.as_array().unwrap().contains(f), "{tcp:#}");
    assert_eq!(
        w.ctl_json(&["services", "flows", "--json", "--proto", "udp"]),
        json!([])
    );
    // a's side: its socket, handed to the stack for the ClusterIP (a
    // client, no peer), and the replies the stack translated back delivered
    // into a, from the ClusterIP.
    let fa = w.ctl_json(&["services", "flows", "--json", "--pod", "ctl-svc-a"]);
    let fa = fa.as_array().unwrap();
    assert_eq!(fa.len(), 2, "{fa:#?}");
    let client = fa.iter().find(|f| f["origin"] == "client").unwrap();
    assert_eq!(client["podIp"], a.ip_string(), "{client:#}");
    assert_eq!(client["podPort"], sport, "{client:#}");
    assert_eq!(client["peerIp"], Value::Null, "{client:#}");
    assert_eq!(client["peerPort"], Value::Null, "{client:#}");
    let f = fa.iter().find(|f| f["origin"] == "delivered").unwrap();
    assert_eq!(f["podIp"], a.ip_string(), "{f:#}");
    assert_eq!(f["podPort"], sport, "{f:#}");
    assert_eq!(f["peerIp"], CLUSTER_IP, "{f:#}");
    assert_eq!(f["peerPort"], SVC_PORT, "{f:#}");
    assert_eq!(f["hostIfname"], a.added.host_veth, "{f:#}");
    assert_eq!(f["containerId"], a.cid, "{f:#}");
    let all = w.ctl_json(&["services", "flows", "--json"]);
    assert_eq!(all.as_array().map(Vec::len), Some(3), "{all:#}");

    // The list and status say the same.
    let l = w.ctl_json(&["services", "list", "--json"]);
    assert_eq!(l["kernelFlows"], 3, "{l:#}");
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(st["services"], l, "{st:#}");
    // The datapath's counters of it.
    let c = w.ctl_json(&["counters", "--json", "--node"]);
    for reason in [
        "from_pod_to_service",
        "from_pod_kernel_flow",
        "kernel_flow_new",
    ] {
        assert!(node_counter(&c, reason) > 0, "{reason}: {c:#}");
    }
    assert_eq!(node_counter(&c, "kernel_flow_new"), 2, "{c:#}");
    assert_eq!(node_counter(&c, "kernel_flow_client"), 1, "{c:#}");

    // The text forms.
    let out = w.ctl(&["services", "list"]);
    assert!(out.success(), "{out}");
    for want in [
        "RANGE".to_string(),
        format!("{SVC_RANGE}  config"),
        "Service traffic: handed to the node's stack (kube-proxy) for these ranges".to_string(),
        format!("kernel flows: 3 of {KFLOWS_MAX}"),
    ] {
        assert!(out.stdout.contains(&want), "no {want:?} in: {out}");
    }
    let out = w.ctl(&["services", "flows", "--pod", &b.ip_string()]);
    assert!(out.success(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for h in [
        "PROTO",
        "POD",
        "PEER",
        "ORIGIN",
        "HOST-IF",
        "CONTAINER",
        "AGE",
    ] {
        assert!(lines[0].contains(h), "no {h} in the header: {out}");
    }
    for cell in [
        "tcp".to_string(),
        format!("{}:{CPORT}", b.ip),
        format!("{}:{sport}", a.ip),
        "delivered".to_string(),
        b.added.host_veth.clone(),
        "ctl-svc-b/eth0".to_string(),
    ] {
        assert!(lines[1].contains(&cell), "no {cell:?} in: {out}");
    }
    let out = w.ctl(&["status"]);
    assert!(out.success(), "{out}");
    let want = format!(
        "services:   handed to the node's stack (kube-proxy) for 1 Service range ({SVC_RANGE}); flows it translates stay on its path; kernel flows 3 of {KFLOWS_MAX}"
    );
    assert!(out.stdout.contains(&want), "no {want:?} in: {out}");

    // Metrics: the gauges, and the new reasons among the packet counters.
    let m = metrics_text(&w);
    assert_eq!(metric(&m, "sluice_service_ranges{owner=\"config\"}"), "1");
    assert_eq!(metric(&m, "sluice_service_ranges{owner=\"agent\"}"), "0");
    assert_eq!(metric_u64(&m, "sluice_kernel_flows"), 3);
    assert_eq!(metric_u64(&m, "sluice_kernel_flows_max"), KFLOWS_MAX);
    assert!(m.contains("# TYPE sluice_kernel_flows gauge\n"), "{m}");
    let pressure: f64 = metric(&m, "sluice_bpf_map_pressure{map_name=\"sl_kflows\"}")
        .parse()
        .unwrap();
    assert!((pressure - 3.0 / KFLOWS_MAX as f64).abs() < 1e-9, "{m}");
    for reason in [
        "from_pod_to_service",
        "from_pod_kernel_flow",
        "kernel_flow_new",
    ] {
        let series = format!("sluice_datapath_packets_total{{reason=\"{reason}\"}}");
        assert!(metric_u64(&m, &series) > 0, "{series}: {m}");
    }
    // The reason no packet of this test had is there too, at zero.
    assert!(
        m.contains("sluice_datapath_packets_total{reason=\"uplink_kernel_flow\"} "),
        "{m}"
    );

    drop(conn);
    w.del(&a);
    w.del(&b);
    w.node.assert_clean(NETWORK);
}

#[test]
fn services_without_ranges_say_kube_proxy_will_not_see_pod_traffic() {
    let w = CtlWorld::new("10.98.24.0/24", &json!({})).unwrap();
    let a = w.add("a", "ctl-nosvc-a", &json!({}));
    let l = w.ctl_json(&["services", "list", "--json"]);
    assert_eq!(l["ranges"], json!([]), "{l:#}");
    let h = l["handling"].as_str().unwrap();
    for want in [
        "no Service ranges",
        "pods' traffic to ClusterIPs is forwarded like any other",
        "kube-proxy's iptables/nftables rules will not see it",
        "serviceCIDRs",
        "node agent",
    ] {
        assert!(h.contains(want), "no {want:?} in {h:?}");
    }
    assert!(l["kernelFlowsCapacity"].as_u64().is_some_and(|n| n > 0));
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(st["services"]["ranges"], json!([]), "{st:#}");
    assert_eq!(st["services"]["handling"], l["handling"], "{st:#}");
    let out = w.ctl(&["services", "list"]);
    assert!(out.success(), "{out}");
    assert!(!out.stdout.contains("RANGE"), "an empty table: {out}");
    assert!(
        out.stdout.contains(&format!("Service traffic: {h}")),
        "{out}"
    );
    let m = metrics_text(&w);
    assert_eq!(metric(&m, "sluice_service_ranges{owner=\"config\"}"), "0");
    assert_eq!(metric(&m, "sluice_service_ranges{owner=\"agent\"}"), "0");
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// A datapath pinned by a Sluice without Service handling (no `sl_svc`,
/// `sl_kflows`, ...: their pins are taken away here): every reader still
/// works and says Service traffic is not handled.
#[test]
fn services_on_a_datapath_without_service_maps_say_it_is_not_handled() {
    let w = CtlWorld::new("10.98.25.0/24", &json!({"serviceCIDRs": [SVC_RANGE]})).unwrap();
    let a = w.add("a", "ctl-oldsvc-a", &json!({}));
    let maps = w.node.pin_root().join("maps");
    for m in [
        "sl_svc",
        "sl_svc6",
        "sl_svc_config",
        "sl_kflows",
        "sl_kflow_frag",
    ] {
        std::fs::remove_file(maps.join(m)).unwrap_or_else(|e| panic!("unpinning {m}: {e}"));
    }
    let l = w.ctl_json(&["services", "list", "--json"]);
    assert_eq!(l["ranges"], json!([]), "{l:#}");
    assert_eq!(l["kernelFlows"], 0, "{l:#}");
    assert_eq!(l["kernelFlowsCapacity"], Value::Null, "{l:#}");
    let h = l["handling"].as_str().unwrap();
    assert!(
        h.starts_with("not handled")
            && h.contains("kube-proxy's iptables/nftables rules will not see it"),
        "{h}"
    );
    assert_eq!(w.ctl_json(&["services", "flows", "--json"]), json!([]));
    let st = w.ctl_json(&["status", "--json"]);
    assert_eq!(st["services"], l, "{st:#}");
    assert_eq!(st["endpoints"], 1, "{st:#}");
    let out = w.ctl(&["status"]);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("services:   not handled"), "{out}");
    // No Service families, as for any map an older datapath lacks.
    let m = metrics_text(&w);
    assert!(!m.contains("sluice_service_ranges"), "{m}");
    assert!(!m.contains("sluice_kernel_flows"), "{m}");
    assert!(m.contains("sluice_nat_flows{family=\"ipv4\"}"), "{m}");
    w.del(&a);
    w.node.assert_clean(NETWORK);
}
