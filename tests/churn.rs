//! Churn (issue 8): 1,008 ADD/DEL cycles on one node — 63 batches of 16 pods
//! `ADDed` in parallel, some traffic, then 16 parallel DELs — with every map
//! family in use: masquerade (a UDP echo from every pod and a TCP connection
//! from one to an external host that has no route to the pods), hostPort
//! mappings (TCP and UDP, reached from the external host) and bandwidth limits
//! (one pod limited so hard that a burst drops, which fills `sl_ep_drops`);
//! every other batch attaches with tcx, so pinned pod links come and go too.
//!
//! What it checks:
//! - every batch, before its DELs, that every per-pod map family really holds
//!   entries of the batch (so "zero" after the DELs means something);
//! - every batch, after its DELs, and at the end: nothing of any pod is left —
//!   no interface in the node namespace besides `lo` and the uplink, no file
//!   under the state directory, no reservation (nor temporary file) in the IPAM
//!   directory, no pinned pod link (and the kernel freed the tcx links), no
//!   entry in `sl_endpoints`, `sl_ep_info`, `sl_ep_stats`, `sl_ep_drops`,
//!   `sl_ports`, `sl_hp_ct`, `sl_bw`, `sl_nat_fwd` or `sl_nat_rev`
//!   (`bpftool map dump`), and `sluicectl`'s lists agree; the node's routes are
//!   the ones it had before the first pod;
//! - the latency of every ADD and DEL (wall time of the plugin process as the
//!   runtime sees it, with 15 others running on 2 vCPUs) does not grow: the
//!   median of the last 200 cycles is at most [`GROWTH_BOUND`] times the median
//!   of the first 200. Percentiles of the first and last 200 cycles and per
//!   batch are printed, and written to `SLUICE_CHURN_REPORT` when set.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_tests::{
    ctl::{udp_burst, CtlWorld},
    fixtures::{wait_links_gone, EXT_IP, NODE_IP},
    hostport::mapping,
    leaks::{map_entries, Inventory},
    look,
    masq::{ipv4_of, tcp_connect, tcp_echo_on, udp_echo_on, udp_socket, EchoServer},
    schema::{check_add_result, Added},
    traffic::tcp_echo,
    Node, Pod, NETWORK,
};

/// Batches of parallel ADDs, and pods per batch: 63 * 16 = 1,008 cycles.
const BATCHES: usize = 63;
const BATCH: usize = 16;
/// Cycles whose latencies are compared: the first and the last this many.
const WINDOW: usize = 200;
/// The median ADD (DEL) latency of the last [`WINDOW`] cycles may be at most this
/// many times the median of the first [`WINDOW`]. A growth check, not a speed
/// claim: a structural leak (a map, a directory or a list of interfaces that
/// every invocation walks and that grows by a pod per cycle) makes late cycles
/// walk ~1,000 entries where early ones walked ~16, far beyond 3x; noise from a
/// shared 2-vCPU machine (other tests, the kernel freeing namespaces) moves a
/// median of 200 samples much less. The median, not the maximum: single
/// outliers (a page-cache miss, a lock wait) are not growth.
const GROWTH_BOUND: f64 = 3.0;

const SUBNET: &str = "10.99.32.0/24";
/// The pods' echo server port (hostPort target).
const CPORT: u16 = 8080;
/// hostPorts of pod 0 (TCP and UDP, used from outside) and pod 1 (mapped only).
/// The same every batch: a mapping a DEL left behind would make the next
/// batch's ADD fail with a conflict.
const HP_TCP: u16 = 31080;
const HP_UDP: u16 = 31081;
const HP_SPARE: u16 = 31082;
/// A UDP port of the external host nothing answers on but a socket holds open
/// (no ICMP errors): where the limited pod's burst goes.
const SINK_PORT: u16 = 9999;
/// Datagrams of the limited pod's burst, and their size: far more than its
/// bucket holds (its depth: at least 128 KiB, whatever the burst), so many are
/// dropped (`drop_bw_egress`, in `sl_ep_drops`).
const BURST: usize = 400;
const BURST_SIZE: usize = 1000;
/// The external echo server is replaced before its built-in lifetime (240 s).
const EXT_SERVER_AGE: Duration = Duration::from_secs(150);

/// Odd batches attach their pods with tcx (pinned links), even ones with
/// `cls_bpf` filters (the default).
fn is_tcx(batch: usize) -> bool {
    batch % 2 == 1
}

/// What pod `i` of a batch gets in `runtimeConfig`.
fn runtime_of(i: usize) -> Value {
    match i {
        0 => json!({"portMappings": [
            mapping(HP_TCP, CPORT, "tcp", ""),
            mapping(HP_UDP, CPORT, "udp", ""),
        ]}),
        1 => json!({"portMappings": [mapping(HP_SPARE, CPORT, "tcp", "")]}),
        // Generous limits both ways: the pod's traffic is not slowed.
        2 | 3 => json!({"bandwidth": {
            "egressRate": 1_000_000_000u64, "egressBurst": 100_000_000u64,
            "ingressRate": 1_000_000_000u64, "ingressBurst": 100_000_000u64,
        }}),
        // 1 Mbit/s with a 100 kbit burst (a 128 KiB bucket): the burst drops.
        4 => json!({"bandwidth": {"egressRate": 1_000_000u64, "egressBurst": 100_000u64}}),
        _ => json!({}),
    }
}

/// Pods of a batch with a bandwidth limit, and their hostPort mappings.
const LIMITED: usize = 3;
const MAPPINGS: usize = 3;

/// One pod of a batch, `ADDed`.
struct Attached {
    pod: Pod,
    cid: String,
    conf: Value,
    added: Added,
    ip: Ipv4Addr,
    add_time: Duration,
}

/// ADD and DEL latency of one cycle.
#[derive(Clone, Copy)]
struct Sample {
    add: Duration,
    del: Duration,
}

fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), port)
}

fn ext_ip() -> Ipv4Addr {
    EXT_IP.parse().unwrap()
}

fn node_ip() -> Ipv4Addr {
    NODE_IP.parse().unwrap()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`-th percentile (nearest rank) of `v`, which must not be empty.
fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rank between 0 and len"
    )]
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// `p50 p90 p99 max` in milliseconds.
fn summary(v: &[Duration]) -> String {
    format!(
        "{:>8.1} {:>8.1} {:>8.1} {:>8.1}",
        ms(percentile(v, 50.0)),
        ms(percentile(v, 90.0)),
        ms(percentile(v, 99.0)),
        ms(percentile(v, 100.0)),
    )
}

/// ADDs `cid` as pod `i` of batch `b` (odd batches attach with tcx), timing
/// the plugin process alone.
fn add_one(w: &CtlWorld, b: usize, i: usize, cid: String, pod: Pod) -> Attached {
    let mut conf = w.conf_with(&runtime_of(i));
    if is_tcx(b) {
        conf["podAttach"] = json!("tcx");
    }
    let start = Instant::now();
    let out = w
        .node
        .cni("ADD", &conf, &cid, "eth0", Some(&pod), &[])
        .unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
    let add_time = start.elapsed();
    let version = conf["cniVersion"].as_str().unwrap().to_string();
    let added = check_add_result(&out.result(), &version, "eth0", &pod);
    let ip = ipv4_of(added.ip()).unwrap();
    Attached {
        pod,
        cid,
        conf,
        added,
        ip,
        add_time,
    }
}

/// DELs `p` (with the config of its ADD, as a runtime does) and returns how long
/// the plugin took.
fn del_one(node: &Node, p: &Attached) -> Duration {
    let start = Instant::now();
    let out = node
        .cni("DEL", &p.conf, &p.cid, "eth0", Some(&p.pod), &[])
        .unwrap_or_else(|e| panic!("DEL {}: {e}", p.cid));
    let took = start.elapsed();
    out.ok_silent();
    took
}

/// Traffic through every map family: pod-to-pod TCP, a masqueraded UDP echo
/// from every pod and a TCP echo from one, hostPort TCP and UDP from outside to
/// pod 0, and the limited pod's burst.
fn traffic(w: &CtlWorld, ext: &EchoServer, pods: &[Attached]) {
    tcp_echo(&pods[5].pod, IpAddr::V4(pods[5].ip), &pods[6].pod, 16 << 10).unwrap();
    for p in pods {
        let u = udp_socket(&p.pod.path, sa(p.ip, 0)).unwrap();
        udp_echo_on(&u, ext.addr, b"churn", 3, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("UDP echo from {} to outside: {e}", p.cid));
    }
    let s = tcp_connect(&pods[7].pod.path, None, ext.addr).unwrap();
    tcp_echo_on(&s, 4096, 7).unwrap();
    drop(s);

    let server = EchoServer::start(&pods[0].pod.path, sa(pods[0].ip, CPORT)).unwrap();
    let s = tcp_connect(&w.ext.netns_path(), None, sa(node_ip(), HP_TCP)).unwrap();
    tcp_echo_on(&s, 4096, 1).unwrap();
    drop(s);
    let u = udp_socket(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    udp_echo_on(
        &u,
        sa(node_ip(), HP_UDP),
        b"churn hostPort",
        3,
        Duration::from_secs(2),
    )
    .unwrap();
    drop(server);

    let limited = &pods[4];
    let sent = udp_burst(
        &limited.pod.path,
        sa(limited.ip, 0),
        sa(ext_ip(), SINK_PORT),
        BURST,
        BURST_SIZE,
    )
    .unwrap();
    assert_eq!(sent, BURST);
}

/// Entries of a map of the node, by name.
fn entries(node: &Node, map: &str) -> usize {
    map_entries(node, map)
        .unwrap_or_else(|e| panic!("{e}"))
        .len()
}

/// Every per-pod map family holds entries of the batch: the zeros checked after
/// its DELs are not zeros of maps never used.
fn assert_exercised(node: &Node, b: usize, pods: &[Attached]) {
    let n = pods.len();
    let mut veths = node.host_veths().unwrap();
    veths.sort();
    let mut want: Vec<String> = pods.iter().map(|p| p.added.host_veth.clone()).collect();
    want.sort();
    assert_eq!(veths, want, "batch {b}: host veths");
    let at_least = [
        ("sl_endpoints", n),
        ("sl_ep_info", n),
        ("sl_ep_stats", n),
        ("sl_ep_drops", 1),
        ("sl_ports", MAPPINGS),
        ("sl_hp_ct", 1),
        ("sl_bw", LIMITED),
        // A UDP flow from every pod and one TCP flow.
        ("sl_nat_fwd", n + 1),
        ("sl_nat_rev", n + 1),
    ];
    for (map, want) in at_least {
        let got = entries(node, map);
        assert!(
            got >= want,
            "batch {b}: {map} holds {got} entries, at least {want} expected"
        );
    }
    // (Without tcx, Linux < 6.6, `podAttach: tcx` falls back to cls_bpf filters.)
    if is_tcx(b) && sluice_tests::kernel::tcx() {
        let pins = node.link_pins().unwrap();
        assert_eq!(
            pins.len(),
            2 * n,
            "batch {b} (tcx): an ingress and an egress link per pod: {pins:?}"
        );
    }
}

/// Nothing of any pod is left on the node: see the module documentation.
#[track_caller]
fn assert_nothing_left(node: &Node, baseline_links: &[String], routes: &[Value], when: &str) {
    let inv = Inventory::take(node, NETWORK, baseline_links).unwrap();
    assert!(inv.is_empty(), "{when}: left behind: {inv:#?}");
    assert_eq!(
        node_routes(node),
        routes,
        "{when}: the node's routes are not the ones it had before the first pod"
    );
}

/// IPv4 and IPv6 routes of the node namespace (all tables) but the kernel's own
/// (those of the node's addresses: the uplink's IPv6 link-local address comes
/// when the kernel gets to it; a leaked interface's would be caught as a link).
fn node_routes(node: &Node) -> Vec<Value> {
    let mut r = look::ip_json(node.name(), &["-4", "route", "show", "table", "all"]).unwrap();
    r.extend(look::ip_json(node.name(), &["-6", "route", "show", "table", "all"]).unwrap());
    r.retain(|r| r["protocol"] != "kernel");
    r
}

/// `sluicectl`'s own view agrees: no endpoint, flow, mapping or limit.
fn assert_sluicectl_empty(node: &Node) {
    for args in [
        &["endpoints", "--json"][..],
        &["nat", "list", "--json"],
        &["ports", "list", "--json"],
        &["bandwidth", "list", "--json"],
    ] {
        let v = node.sluicectl_json(args).unwrap();
        assert_eq!(v, json!([]), "sluicectl {}: {v:#}", args.join(" "));
    }
}

/// The latency report: first and last [`WINDOW`] cycles, then per batch.
fn report(samples: &[Sample], total: Duration, traffic_time: Duration) -> String {
    let adds: Vec<Duration> = samples.iter().map(|s| s.add).collect();
    let dels: Vec<Duration> = samples.iter().map(|s| s.del).collect();
    let n = samples.len();
    let mut r = String::new();
    let _ = writeln!(
        r,
        "churn: {n} ADD/DEL cycles ({BATCHES} batches of {BATCH} parallel ADDs, then \
         {BATCH} parallel DELs) in {:.1} s ({:.1} s of it traffic and checks outside \
         the plugin)",
        total.as_secs_f64(),
        traffic_time.as_secs_f64()
    );
    let _ = writeln!(
        r,
        "latency of one plugin process ({}; ms, nearest-rank percentiles), {} CPUs:",
        sluice_tests::sluice_bin().map_or_else(|e| e.to_string(), |p| p.display().to_string()),
        thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        r,
        "{:<22} {:>8} {:>8} {:>8} {:>8}",
        "", "p50", "p90", "p99", "max"
    );
    for (what, v) in [("ADD", &adds), ("DEL", &dels)] {
        let _ = writeln!(
            r,
            "{:<22} {}",
            format!("{what} cycles 1-{WINDOW}"),
            summary(&v[..WINDOW])
        );
        let _ = writeln!(
            r,
            "{:<22} {}",
            format!("{what} cycles {}-{n}", n - WINDOW + 1),
            summary(&v[n - WINDOW..])
        );
        let _ = writeln!(r, "{:<22} {}", format!("{what} all {n}"), summary(v));
    }
    let _ = writeln!(
        r,
        "growth check (median of the last {WINDOW} cycles / median of the first {WINDOW}, \
         bound {GROWTH_BOUND}x):"
    );
    for (what, first, last) in growth(samples) {
        let _ = writeln!(
            r,
            "  {what:<8} {:>8.1} -> {:>8.1} ms  ({:.2}x)",
            ms(first),
            ms(last),
            last.as_secs_f64() / first.as_secs_f64()
        );
    }
    let _ = writeln!(
        r,
        "per batch (ms):  ADD p50      p90      max  |  DEL p50      p90      max   attach"
    );
    for (b, chunk) in samples.chunks(BATCH).enumerate() {
        let a: Vec<Duration> = chunk.iter().map(|s| s.add).collect();
        let d: Vec<Duration> = chunk.iter().map(|s| s.del).collect();
        let _ = writeln!(
            r,
            "batch {b:>2}:    {:>8.1} {:>8.1} {:>8.1}  | {:>8.1} {:>8.1} {:>8.1}   {}",
            ms(percentile(&a, 50.0)),
            ms(percentile(&a, 90.0)),
            ms(percentile(&a, 100.0)),
            ms(percentile(&d, 50.0)),
            ms(percentile(&d, 90.0)),
            ms(percentile(&d, 100.0)),
            if is_tcx(b) { "tcx" } else { "tc" }
        );
    }
    r
}

#[test]
fn a_thousand_add_del_cycles_leave_nothing_and_do_not_slow_down() {
    let started = Instant::now();
    let w = CtlWorld::new(SUBNET, &json!({})).unwrap();
    let node = &w.node;
    let baseline_links = look::link_names(node.name()).unwrap();
    let sink = udp_socket(&w.ext.netns_path(), sa(ext_ip(), SINK_PORT)).unwrap();

    // The first ADD of a node loads the datapath: not one of the measured cycles.
    // It maps hostPorts, so the socket hooks are attached here too.
    let warm = add_one(&w, 0, 0, "churn-warm".into(), node.pod("warm").unwrap());
    del_one(node, &warm);
    node.delete_pod(&warm.pod).unwrap();
    let routes = node_routes(node);
    assert_nothing_left(node, &baseline_links, &routes, "after the warm-up");

    let mut ext = EchoServer::start(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    let mut ext_started = Instant::now();
    let mut samples: Vec<Sample> = Vec::with_capacity(BATCHES * BATCH);
    let mut outside = Duration::ZERO;
    for b in 0..BATCHES {
        if ext_started.elapsed() > EXT_SERVER_AGE {
            ext = EchoServer::start(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
            ext_started = Instant::now();
        }
        let t0 = Instant::now();
        let pods: Vec<Pod> = thread::scope(|s| {
            let hs: Vec<_> = (0..BATCH)
                .map(|i| s.spawn(move || node.pod(&format!("b{b}p{i}")).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut t_plugin = Duration::ZERO;
        let t1 = Instant::now();
        let attached: Vec<Attached> = thread::scope(|s| {
            let hs: Vec<_> = pods
                .into_iter()
                .enumerate()
                .map(|(i, pod)| {
                    let w = &w;
                    s.spawn(move || add_one(w, b, i, format!("churn-{b:02}-{i:02}"), pod))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        t_plugin += t1.elapsed();

        traffic(&w, &ext, &attached);
        assert_exercised(node, b, &attached);
        let link_ids: Vec<u32> = node
            .link_pins()
            .unwrap()
            .iter()
            .map(|p| {
                look::pinned_link_ids(&node.pin_root().join("links").join(p))
                    .unwrap()
                    .0
            })
            .collect();

        let t2 = Instant::now();
        let dels: Vec<Duration> = thread::scope(|s| {
            let hs: Vec<_> = attached
                .iter()
                .map(|p| s.spawn(move || del_one(node, p)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        t_plugin += t2.elapsed();
        for (p, del) in attached.iter().zip(dels) {
            samples.push(Sample {
                add: p.add_time,
                del,
            });
        }
        for p in &attached {
            node.delete_pod(&p.pod).unwrap();
        }
        wait_links_gone(&link_ids, Duration::from_secs(10)).unwrap();
        assert_nothing_left(
            node,
            &baseline_links,
            &routes,
            &format!("after the DELs of batch {b}"),
        );
        outside += t0.elapsed().checked_sub(t_plugin).unwrap();
    }
    drop(ext);
    drop(sink);

    assert_nothing_left(node, &baseline_links, &routes, "after the run");
    assert_sluicectl_empty(node);

    let text = report(&samples, started.elapsed(), outside);
    println!("{text}");
    if let Some(path) = std::env::var_os("SLUICE_CHURN_REPORT").filter(|p| !p.is_empty()) {
        std::fs::write(&path, &text)
            .unwrap_or_else(|e| panic!("writing SLUICE_CHURN_REPORT {path:?}: {e}"));
    }

    for (what, first, last) in growth(&samples) {
        assert!(
            last.as_secs_f64() <= GROWTH_BOUND * first.as_secs_f64(),
            "{what} latency grew: median {:.1} ms in the last {WINDOW} cycles, \
             {:.1} ms in the first {WINDOW} (bound {GROWTH_BOUND}x)\n{text}",
            ms(last),
            ms(first)
        );
    }
}

/// (what, median of the first [`WINDOW`] cycles, median of the last) for ADD
/// and DEL: over all cycles of each window, and over those of each attach mode
/// (tcx pods take several times longer than tc ones, so the median of a window
/// mixing both sits in the tail of the faster mode; per mode it is a plain
/// median).
fn growth(samples: &[Sample]) -> Vec<(String, Duration, Duration)> {
    let n = samples.len();
    let (first, last) = (0..WINDOW, n - WINDOW..n);
    let mut out = Vec::new();
    for (what, get) in [
        ("ADD", (|s: &Sample| s.add) as fn(&Sample) -> Duration),
        ("DEL", |s: &Sample| s.del),
    ] {
        for (mode, keep) in [
            ("", (|_: usize| true) as fn(usize) -> bool),
            (" tc", |c: usize| !is_tcx(c / BATCH)),
            (" tcx", |c: usize| is_tcx(c / BATCH)),
        ] {
            let pick = |r: std::ops::Range<usize>| -> Vec<Duration> {
                r.filter(|c| keep(*c)).map(|c| get(&samples[c])).collect()
            };
            out.push((
                format!("{what}{mode}"),
                percentile(&pick(first.clone()), 50.0),
                percentile(&pick(last.clone()), 50.0),
            ));
        }
    }
    out
}
