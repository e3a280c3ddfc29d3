//! `cargo xtask bench`: Sluice, the reference plugins (bridge + host-local) and
//! the limit (a bare veth pair) on the same namespace testbed, in one run,
//! interleaved round by round, printed as ratios and written to
//! docs/benchmarks.md. Absolute numbers drift 30% between runs on these VMs;
//! the ratios within one run are what to compare. Masquerade is measured on two
//! more setups (both plugins with `ipMasq: true`) in the same run, IPv6
//! masquerade on two more (the same, dual-stack, measured on IPv6), Services on
//! two more (`clusterip`: both plugins with kube-proxy's iptables-mode rules for
//! one Service in the node namespace, pod -> ClusterIP), port mapping
//! on six more (both plugins with 1, 1,000 and 10,000 mappings on the node),
//! bandwidth limits on two more (bridge + the reference `bandwidth` plugin, and
//! Sluice, each a node with one pod per limit), and the control plane on four
//! more (`filling`: both plugins, without and with a hostPort per pod, as a
//! node fills up to 1,000 pods and empties again), and NetworkPolicy on four
//! more (`policy`: Sluice with policy off, and with `sluice-node policy` and
//! 0, 100 and 1,000 rules selecting the server pod).
//! `--only <table>` runs one table's setups and figures alone. `cargo xtask
//! profile` runs the per-packet figures on the same testbed under `perf`.
mod agent_apply;
mod conflist;
mod connloop;
mod filling;
pub(crate) mod hostport;
mod measure;
mod policy;
mod profile;
mod progstats;
mod report;
mod services;
mod topology;

use anyhow::{bail, Context, Result};

use crate::{
    build::{self, Binaries},
    cli::{BenchArgs, BenchTable},
    ebpf, setup,
    testbed::Testbed,
    ws::Workspace,
};

use report::{
    Figure, Report, BW_CPU_RATE, BW_UDP_RATE, LIMIT, REFERENCE, REFERENCE_BW, REFERENCE_CI,
    REFERENCE_HP, REFERENCE_MASQ, REFERENCE_MASQ6, SLUICE, SLUICE_BW, SLUICE_CI, SLUICE_HP,
    SLUICE_MASQ, SLUICE_MASQ6, SLUICE_NETKIT,
};
use topology::{
    bw_pod, BwSetup, Family, HpSetup, Setup, BW_BURSTS_MS, BW_DEFAULT_BURST, BW_RATES, CLUSTER_IP,
    HP_CONTAINER_PORT, HP_HOST_PORT, HP_SIZES, HP_TIMED_PODS_REFERENCE, HP_TIMED_PODS_SLUICE,
};

pub(crate) fn conn_loop(args: &crate::cli::ConnLoopArgs) -> Result<()> {
    connloop::run(args)
}

/// `cargo xtask profile` (release binaries, as the bench).
pub(crate) fn profile(ws: &Workspace, args: &crate::cli::ProfileArgs) -> Result<()> {
    let bins = release_bins(ws, args.prebuilt)?;
    profile::run(ws, &bins, args)
}

/// The release binaries: from the environment with `--prebuilt` (how a
/// guest runs them), else set up and built here.
fn release_bins(ws: &Workspace, prebuilt: bool) -> Result<Binaries> {
    if prebuilt {
        return self::prebuilt();
    }
    setup::run_for(setup::Purpose::Bench)?;
    let object = ebpf::build(ws)?;
    build::build_bins(ws, &object, true)
}

pub(crate) fn run(ws: &Workspace, args: &BenchArgs) -> Result<()> {
    let bins = release_bins(ws, args.prebuilt)?;
    let want = |t| args.only.is_none_or(|o| o == t);
    // Made before the testbed, so removed after it (the hooks go with the pins).
    let cgroups = if want(BenchTable::Hostport) {
        (0..HP_SIZES.len())
            .map(|i| hostport::Cgroup::new(&format!("shp{i}")))
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let svc_cgroups = if want(BenchTable::Services) {
        services::cgroups()?
    } else {
        Vec::new()
    };
    let apiserver = if want(BenchTable::Services) || want(BenchTable::Policy) {
        apiserver_bin(ws, args.prebuilt)?
    } else {
        std::path::PathBuf::new()
    };
    let fill_cgroup = if want(BenchTable::Filling) {
        Some(hostport::Cgroup::new("sfl")?)
    } else {
        None
    };
    // The reference bandwidth plugin makes an ifb device (in the node
    // namespace): the host's own are listed to check that none was added.
    let ifbs_before = if want(BenchTable::Bandwidth) {
        Some(host_ifbs()?)
    } else {
        None
    };
    let mut tb = Testbed::new("slbench")?;
    let mut report = Report::new(args.only);
    // The filling table first, while the machine holds nothing else: a node
    // with 1,000 pods, not one beside the other tables' nodes (10,000
    // hostPort mappings and the reference's iptables rules among them).
    if let Some(cg) = &fill_cgroup {
        let fill = filling::setups(&mut tb, &bins, cg)?;
        filling::run(&mut tb, &fill, &mut report)?;
    }
    // Each with its index in the report; netkit pods where the kernel has them.
    let routing = if want(BenchTable::Routing) {
        let mut v = vec![
            (LIMIT, topology::limit(&mut tb)?),
            (REFERENCE, topology::reference(&mut tb)?),
            (SLUICE, topology::sluice(&mut tb, &bins)?),
        ];
        v.extend(topology::sluice_netkit(&mut tb, &bins)?.map(|s| (SLUICE_NETKIT, s)));
        v
    } else {
        Vec::new()
    };
    // Reference and Sluice for each family, each with its index in the report.
    let mut masq = Vec::new();
    for (table, family, reference, sluice) in [
        (
            BenchTable::Masquerade,
            Family::V4,
            REFERENCE_MASQ,
            SLUICE_MASQ,
        ),
        (
            BenchTable::Masquerade6,
            Family::V6,
            REFERENCE_MASQ6,
            SLUICE_MASQ6,
        ),
    ] {
        if want(table) {
            masq.push((reference, topology::reference_masq(&mut tb, family)?));
            masq.push((sluice, topology::sluice_masq(&mut tb, &bins, family)?));
        }
    }
    // Reference and Sluice with kube-proxy's rules, each with its index in the
    // report.
    let clusterip = if want(BenchTable::Clusterip) {
        vec![
            (REFERENCE_CI, topology::clusterip_reference(&mut tb)?),
            (SLUICE_CI, topology::clusterip_sluice(&mut tb, &bins)?),
        ]
    } else {
        Vec::new()
    };
    // Reference and Sluice for each number of mappings, each with its index in
    // the report.
    let mut hp = Vec::new();
    for (i, cg) in cgroups.iter().enumerate() {
        let r = topology::hostport_reference(&mut tb, i)?;
        hp.push((report::hp(REFERENCE_HP, i), r));
        let s = topology::hostport_sluice(&mut tb, &bins, &cg.path, i)?;
        hp.push((report::hp(SLUICE_HP, i), s));
    }
    let mut bw = if want(BenchTable::Bandwidth) {
        vec![
            (REFERENCE_BW, topology::bandwidth_reference(&mut tb)?),
            (SLUICE_BW, topology::bandwidth_sluice(&mut tb, &bins)?),
        ]
    } else {
        Vec::new()
    };
    let svc = if want(BenchTable::Services) {
        services::setups(
            &mut tb,
            &bins,
            (&apiserver, &svc_cgroups),
            &mut report.services,
        )?
    } else {
        Vec::new()
    };
    // Its agents and stand-in API servers run until it is dropped (before
    // the testbed).
    let mut pol = if want(BenchTable::Policy) {
        policy::setups(&mut tb, &bins, &apiserver, &mut report.policy)?
    } else {
        Vec::new()
    };
    if let Some(before) = &ifbs_before {
        check_ifbs(&tb, &bw, before)?;
    }
    if let Some((_, s)) = bw.iter().find(|(k, _)| *k == SLUICE_BW) {
        report.sluice_egress = Some(sluice_egress(&tb, &bins, s)?);
    }
    for round in 0..args.rounds {
        eprintln!("bench: round {} of {}", round + 1, args.rounds);
        if !routing.is_empty() {
            traffic_round(&tb, &routing, args.seconds, &mut report)?;
        }
        if !masq.is_empty() {
            masq_round(&tb, &masq, args.seconds, &mut report)?;
        }
        if !clusterip.is_empty() {
            clusterip_round(&tb, &clusterip, args.seconds, &mut report)?;
        }
        if !hp.is_empty() {
            hostport_round(&tb, &hp, args.seconds, &mut report)?;
        }
        if !bw.is_empty() {
            bandwidth_round(&tb, &bw, &mut report)?;
        }
        if !svc.is_empty() {
            services::round(&tb, &svc, &svc_cgroups, args.seconds, &mut report.services)?;
        }
        if !pol.is_empty() {
            policy::round(
                &tb,
                &bins,
                &mut pol,
                usize::try_from(round)?,
                args.seconds,
                &mut report.policy,
            )?;
        }
    }
    policy::finish(&mut pol)?;
    drop(pol);
    // What the floods did to Sluice's tables (issue 49's figure).
    for (i, setup) in &masq {
        if *i == SLUICE_MASQ || *i == SLUICE_MASQ6 {
            if let Some(e) = masq_pressure(&bins, setup)? {
                report.masq_pressure.push((*i, e));
            }
        }
    }
    if !routing.is_empty() {
        lifecycle(&tb, &routing, usize::try_from(args.pods)?, &mut report)?;
    }
    if !hp.is_empty() {
        hostport_add(&mut tb, &hp, &mut report)?;
    }
    for (_, s) in &mut bw {
        topology::bandwidth_del(&tb, s)?;
    }
    drop(tb);
    drop(svc_cgroups);
    drop(cgroups);
    drop(fill_cgroup);
    if let Some(before) = ifbs_before {
        let added: Vec<String> = host_ifbs()?
            .into_iter()
            .filter(|l| !before.contains(l))
            .collect();
        if !added.is_empty() {
            bail!("ifb devices left on the host: {}", added.join(", "));
        }
    }
    let text = report.render(args);
    print!("{text}");
    if let Some(dir) = &args.markdown_parts {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("results.md"), report.markdown_results("###"))?;
        std::fs::write(dir.join("method.md"), report.markdown_method(args, "###"))?;
    }
    if args.only.is_some() {
        println!("(one table only: docs/benchmarks.md left as it is)");
        return Ok(());
    }
    let path = ws.root.join("docs").join("benchmarks.md");
    std::fs::create_dir_all(path.parent().unwrap_or(&ws.root))?;
    std::fs::write(&path, report.markdown(args))?;
    println!("written to {}", path.display());
    Ok(())
}

/// One value of every traffic figure for every setup (each with its index in
/// the report), setups interleaved.
fn traffic_round(tb: &Testbed, setups: &[(usize, Setup)], secs: u32, r: &mut Report) -> Result<()> {
    let ns = |i| tb.ns(i);
    for &(i, ref s) in setups {
        r.add(
            Figure::PodPodGbps,
            i,
            measure::tcp_gbps(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?,
        );
    }
    for &(i, ref s) in setups {
        let (p50, p99) = measure::tcp_rtt_us(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?;
        r.add(Figure::PodPodRttP50, i, p50);
        r.add(Figure::PodPodRttP99, i, p99);
    }
    for &(i, ref s) in setups {
        r.add(
            Figure::PodPodUdpKpps,
            i,
            measure::udp_small_pps(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)? / 1e3,
        );
    }
    for &(i, ref s) in setups {
        r.add(
            Figure::PodPodConnsPerSec,
            i,
            measure::conns_per_sec(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?,
        );
    }
    for &(i, ref s) in setups {
        r.add(
            Figure::PodExtGbps,
            i,
            measure::tcp_gbps(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?,
        );
        let (p50, _) = measure::tcp_rtt_us(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?;
        r.add(Figure::PodExtRttP50, i, p50);
    }
    for &(i, ref s) in setups {
        r.add(
            Figure::ExtPodGbps,
            i,
            measure::tcp_gbps(ns(s.ext), ns(s.pod1), &s.pod1_ip, secs)?,
        );
        let (p50, _) = measure::tcp_rtt_us(ns(s.ext), ns(s.pod1), &s.pod1_ip, secs)?;
        r.add(Figure::ExtPodRttP50, i, p50);
    }
    Ok(())
}

/// The masquerade figures, pod -> external host, the ipMasq setups (reference,
/// Sluice; IPv4, then IPv6) in turn, each with its index in the report.
fn masq_round(tb: &Testbed, setups: &[(usize, Setup)], secs: u32, r: &mut Report) -> Result<()> {
    let ns = |i| tb.ns(i);
    for &(i, ref s) in setups {
        r.add(
            Figure::MasqGbps,
            i,
            measure::tcp_gbps(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?,
        );
    }
    for &(i, ref s) in setups {
        let (p50, p99) = measure::tcp_rtt_us(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?;
        r.add(Figure::MasqRttP50, i, p50);
        r.add(Figure::MasqRttP99, i, p99);
    }
    for &(i, ref s) in setups {
        r.add(
            Figure::MasqConnsPerSec,
            i,
            measure::conns_per_sec(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?,
        );
    }
    // Issue 49: the same while the setup's other pod floods new flows.
    for &(i, ref s) in setups {
        r.add(
            Figure::MasqConnsPerSecFlood,
            i,
            measure::conns_per_sec_flooded(ns(s.pod1), ns(s.pod2), ns(s.ext), &s.ext_ip, secs)?,
        );
    }
    Ok(())
}

/// The ClusterIP figures, pod -> the Service's ClusterIP (kube-proxy's DNAT
/// to the node's other pod, whose servers listen on its own address), the
/// setups (reference, Sluice) in turn, each with its index in the report.
fn clusterip_round(
    tb: &Testbed,
    setups: &[(usize, Setup)],
    secs: u32,
    r: &mut Report,
) -> Result<()> {
    let ns = |i| tb.ns(i);
    for &(i, ref s) in setups {
        let port = measure::SOCKPERF_PORT;
        let (p50, p99) = measure::tcp_rtt_us_via(
            ns(s.pod1),
            ns(s.pod2),
            (CLUSTER_IP, port),
            (&s.pod2_ip, port),
            secs,
        )
        .with_context(|| format!("{} RTT to {CLUSTER_IP}", report::name(i)))?;
        r.add(Figure::CiRttP50, i, p50);
        r.add(Figure::CiRttP99, i, p99);
    }
    for &(i, ref s) in setups {
        r.add(
            Figure::CiConnsPerSec,
            i,
            measure::conns_per_sec_via(ns(s.pod1), ns(s.pod2), (CLUSTER_IP, &s.pod2_ip), secs)
                .with_context(|| format!("{} connections to {CLUSTER_IP}", report::name(i)))?,
        );
    }
    Ok(())
}

/// ADD and DEL latency over `pods` pods, on a node whose datapath (or bridge) is
/// already up (its two pods stay attached), setups interleaved.
fn lifecycle(tb: &Testbed, setups: &[(usize, Setup)], pods: usize, r: &mut Report) -> Result<()> {
    for &(i, ref s) in setups {
        let Some(c) = &s.cni else { continue };
        let (adds, dels) = measure::add_del_ms(tb.ns(c.node), &c.plugin, &c.conf, pods)?;
        let (a50, a99) = measure::p50_p99(adds);
        let (d50, d99) = measure::p50_p99(dels);
        r.add(Figure::AddP50, i, a50);
        r.add(Figure::AddP99, i, a99);
        r.add(Figure::DelP50, i, d50);
        r.add(Figure::DelP99, i, d99);
    }
    Ok(())
}

/// The port-mapping figures, external host -> node address:hostPort, every node
/// (both plugins, every number of mappings) in turn.
fn hostport_round(tb: &Testbed, hp: &[(usize, HpSetup)], secs: u32, r: &mut Report) -> Result<()> {
    let ns = |i| tb.ns(i);
    for (k, s) in hp {
        let v = measure::tcp_gbps_via(
            ns(s.ext),
            ns(s.pod),
            (&s.node_ip, HP_HOST_PORT),
            HP_CONTAINER_PORT,
            secs,
        );
        r.add(Figure::HpGbps, *k, v.map_err(|e| e.context(s.tag.clone()))?);
    }
    for (k, s) in hp {
        let (p50, p99) = measure::tcp_rtt_us_via(
            ns(s.ext),
            ns(s.pod),
            (&s.node_ip, HP_HOST_PORT),
            (&s.pod_ip, HP_CONTAINER_PORT),
            secs,
        )
        .map_err(|e| e.context(s.tag.clone()))?;
        r.add(Figure::HpRttP50, *k, p50);
        r.add(Figure::HpRttP99, *k, p99);
    }
    Ok(())
}

/// ADD latency of a pod with one mapping on every port-mapping node: Sluice's
/// nodes first, then the reference's, each plugin's nodes in turn for every pod
/// (interleaved, the order rotated from pod to pod); then all of them `DELeted`.
/// Not plugin by plugin for every pod: a reference ADD on 10,000 mappings
/// leaves the kernel ~1 s of `nf_tables` work that lands on the next ADD (on 2
/// vCPUs it added ~15% to the Sluice ADD timed right after it). More pods for
/// Sluice (its ADD takes a few ms): on a VM shared with other work, the p50 of
/// six moves by ~10% between runs.
fn hostport_add(tb: &mut Testbed, hp: &[(usize, HpSetup)], r: &mut Report) -> Result<()> {
    let mut times = vec![Vec::new(); hp.len()];
    let mut attached = Vec::new();
    for (reference, pods) in [
        (false, HP_TIMED_PODS_SLUICE),
        (true, HP_TIMED_PODS_REFERENCE),
    ] {
        let nodes: Vec<usize> = (0..hp.len())
            .filter(|k| hp[*k].1.reference == reference)
            .collect();
        for i in 0..pods {
            for j in 0..nodes.len() {
                let k = nodes[(i + j) % nodes.len()];
                let s = &hp[k].1;
                let pod = tb.netns(&format!("{}-t{i}", s.tag))?;
                let host_port = 40_000 + u16::try_from(i)?;
                let (a, ms) = s.list.add(
                    &tb.ns(s.node).path(),
                    &format!("{}-t{i}", s.tag),
                    &tb.ns(pod).path(),
                    topology::port_mappings(&[(host_port, HP_CONTAINER_PORT)]),
                )?;
                times[k].push(ms);
                attached.push((k, a));
            }
        }
    }
    for (k, a) in &attached {
        let s = &hp[*k].1;
        s.list.del(&tb.ns(s.node).path(), a)?;
    }
    for ((index, _), t) in hp.iter().zip(times) {
        r.add(Figure::HpAddP50, *index, measure::p50_p99(t).0);
    }
    Ok(())
}

/// The tests' stand-in API server (the Services table's agent talks to
/// it): $`SLUICE_APISERVER_BIN` with `--prebuilt`, else built here.
fn apiserver_bin(ws: &Workspace, prebuilt: bool) -> Result<std::path::PathBuf> {
    const NAME: &str = "sluice-test-apiserver";
    if prebuilt {
        return std::env::var_os("SLUICE_APISERVER_BIN")
            .map(std::path::PathBuf::from)
            .context("--prebuilt: $SLUICE_APISERVER_BIN is not set");
    }
    let mut c = std::process::Command::new("cargo");
    c.args(["build", "--release", "-p", "sluice-tests", "--bin", NAME])
        .current_dir(&ws.root);
    crate::cmd::run(&mut c)?;
    let bin = ws.bin(true, NAME);
    if !bin.is_file() {
        bail!("cargo build did not produce {}", bin.display());
    }
    Ok(bin)
}

/// `sluice` and `sluicectl` as $`SLUICE_BIN` and $`SLUICECTL_BIN` name them.
fn prebuilt() -> Result<Binaries> {
    let var = |key: &str| -> Result<std::path::PathBuf> {
        let path = std::env::var_os(key)
            .map(std::path::PathBuf::from)
            .with_context(|| format!("--prebuilt: ${key} is not set"))?;
        if !path.is_file() {
            bail!("--prebuilt: ${key} is {}, not a file", path.display());
        }
        Ok(path)
    };
    Ok(Binaries {
        sluice: var("SLUICE_BIN")?,
        sluicectl: var("SLUICECTL_BIN")?,
        // The masquerade setups run the node agent's sweep when it is given.
        node: std::env::var_os("SLUICE_NODE_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_default(),
    })
}

/// What `sluicectl status` says of the Sluice bandwidth node's pods: how
/// many send through EDT and how many through the policer.
fn sluice_egress(tb: &Testbed, bins: &Binaries, s: &BwSetup) -> Result<String> {
    let mut c = std::process::Command::new(&bins.sluicectl);
    c.args(["--pin-root", &tb.pin_root(&s.tag).display().to_string()])
        .args(["status", "--json"]);
    let out = crate::cmd::stdout(&mut c)?;
    let status: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("sluicectl status: {out}"))?;
    let count = |key: &str| status["bandwidth"][key].as_u64().unwrap_or(0);
    let (edt, policer) = (count("egressEdt"), count("egressPolicer"));
    Ok(match (edt, policer) {
        (0, p) => format!("the policer for all {p} pods (no sch_fq in this kernel)"),
        (e, 0) => format!("EDT (sch_fq) for all {e} pods"),
        (e, p) => format!("EDT for {e} pods and the policer for {p} (mixed: see ADD's stderr)"),
    })
}

/// The evictions and drops of a Sluice masquerade node's tables so far
/// (`sluicectl status --json`), as the report prints them.
fn masq_pressure(bins: &Binaries, s: &Setup) -> Result<Option<String>> {
    let Some(pin_root) = s.cni.as_ref().and_then(|c| c.conf["pinRoot"].as_str()) else {
        return Ok(None);
    };
    let mut c = std::process::Command::new(&bins.sluicectl);
    c.args(["--pin-root", pin_root, "status", "--json"]);
    let out = crate::cmd::stdout(&mut c)?;
    let status: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("sluicectl status: {out}"))?;
    let p = &status["masquerade"]["pressure"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    Ok(Some(format!(
        "evictions: {} to the pod's share, {} unreplied, {} idle; drops: {} at the share, {} table full; \
         top pod held {} flows (share {})",
        n(&p["evictions"]["podShare"]),
        n(&p["evictions"]["unreplied"]),
        n(&p["evictions"]["idle"]),
        n(&p["drops"]["podShare"]),
        n(&p["drops"]["mapFull"]),
        n(&p["topPods"][0]["flows"]),
        n(&p["podMaxFlows"]),
    )))
}

/// Seconds of every bandwidth figure (whatever `--seconds` says: the limits'
/// first burst is 300 ms, so shorter runs would overstate the rates).
pub(crate) const BW_SECS: u32 = 4;

/// The bandwidth figures, reference then Sluice for each limit, burst and
/// direction: one TCP stream each, its rate and retransmissions (the CPU figure
/// from the `BW_CPU_RATE` ones at the default burst), the RTT through the
/// `BW_UDP_RATE` limit under load for each burst, then UDP at twice that limit.
fn bandwidth_round(tb: &Testbed, bw: &[(usize, BwSetup)], r: &mut Report) -> Result<()> {
    let ns = |i| tb.ns(i);
    for rate in 0..BW_RATES.len() {
        for burst in 0..BW_BURSTS_MS.len() {
            for ingress in [false, true] {
                for (k, s) in bw {
                    let (pod, pod_ip) = &s.pods[bw_pod(rate, burst)];
                    let t = if ingress {
                        measure::tcp_limited(ns(s.ext), ns(*pod), pod_ip, BW_SECS)
                    } else {
                        measure::tcp_limited(ns(*pod), ns(s.ext), &s.ext_ip, BW_SECS)
                    }
                    .map_err(|e| {
                        e.context(format!("{} TCP, limit {rate}, burst {burst}", s.tag))
                    })?;
                    let at = (rate, burst, ingress);
                    r.add(Figure::BwTcpMbps(at), *k, t.mbps);
                    r.add(Figure::BwTcpRetransmits(at), *k, t.retransmits);
                    if rate == BW_CPU_RATE && burst == BW_DEFAULT_BURST && t.gbit > 0.0 {
                        r.add(Figure::BwCpuPerGbit { ingress }, *k, t.cpu_secs / t.gbit);
                    }
                }
            }
        }
    }
    for burst in 0..BW_BURSTS_MS.len() {
        for ingress in [false, true] {
            for (k, s) in bw {
                let (pod, pod_ip) = &s.pods[bw_pod(BW_UDP_RATE, burst)];
                let (p50, p99) = if ingress {
                    measure::tcp_rtt_loaded_us(ns(s.ext), ns(*pod), pod_ip, BW_SECS)
                } else {
                    measure::tcp_rtt_loaded_us(ns(*pod), ns(s.ext), &s.ext_ip, BW_SECS)
                }
                .map_err(|e| e.context(format!("{} RTT under load, burst {burst}", s.tag)))?;
                let at = (BW_UDP_RATE, burst, ingress);
                r.add(Figure::BwLoadedRttP50(at), *k, p50);
                r.add(Figure::BwLoadedRttP99(at), *k, p99);
            }
        }
    }
    let udp_rate = 2 * BW_RATES[BW_UDP_RATE];
    for ingress in [false, true] {
        for (k, s) in bw {
            let (pod, pod_ip) = &s.pods[bw_pod(BW_UDP_RATE, BW_DEFAULT_BURST)];
            let v = if ingress {
                measure::udp_received_mbps(ns(s.ext), ns(*pod), pod_ip, udp_rate, BW_SECS)
            } else {
                measure::udp_received_mbps(ns(*pod), ns(s.ext), &s.ext_ip, udp_rate, BW_SECS)
            }
            .map_err(|e| e.context(format!("{} UDP", s.tag)))?;
            r.add(Figure::BwUdpMbps { ingress }, *k, v);
        }
    }
    Ok(())
}

/// Where the reference plugin's ifb devices are: one per pod (its egress
/// limit) in the reference node's namespace, none added on the host.
fn check_ifbs(tb: &Testbed, bw: &[(usize, BwSetup)], host_before: &[String]) -> Result<()> {
    let added: Vec<String> = host_ifbs()?
        .into_iter()
        .filter(|l| !host_before.contains(l))
        .collect();
    if !added.is_empty() {
        bail!("ifb devices added on the host: {}", added.join(", "));
    }
    for (k, s) in bw {
        let n = ifbs(Some(tb.ns(s.node)))?.len();
        let want = if *k == REFERENCE_BW { s.pods.len() } else { 0 };
        if n != want {
            bail!(
                "{} ifb devices in {} ({want} expected)",
                n,
                tb.ns(s.node).name()
            );
        }
    }
    Ok(())
}

/// The host's ifb devices, by name.
fn host_ifbs() -> Result<Vec<String>> {
    ifbs(None)
}

/// The ifb devices (`ip -o link show type ifb`) of a namespace, or the host's.
fn ifbs(ns: Option<&crate::testbed::Netns>) -> Result<Vec<String>> {
    let mut c = std::process::Command::new("ip");
    if let Some(ns) = ns {
        c.args(["-n", ns.name()]);
    }
    let out = crate::cmd::stdout(c.args(["-o", "link", "show", "type", "ifb"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .collect())
}
