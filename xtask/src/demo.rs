//! `cargo xtask demo`: Sluice's main job, live, on namespaces. A node with an
//! uplink to an "external" host, two pods attached through the real CNI protocol,
//! traffic between them, to the outside (masqueraded) and in through a hostPort,
//! all through the eBPF datapath, the pinned maps shown with `sluicectl`, then
//! CHECK and DEL. Everything is removed at the
//! end, also on error.
use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sluice_testbed::{exec::Background, netns::wait_listening};

use crate::{build, cmd, ebpf, setup, testbed::Testbed, ws::Workspace};

const PREFIX: &str = "sldemo";
const POD_CIDR: &str = "10.88.0.0/24";
/// The pods' IPv6 range (dual stack), and the uplink's IPv6 addresses.
const POD_CIDR6: &str = "fd00:88::/64";
const NODE_IP6: &str = "fd00:177::1";
const EXT_IP6: &str = "fd00:177::2";

pub(crate) fn run(ws: &Workspace) -> Result<()> {
    setup::run_for(setup::Purpose::Demo)?;
    let object = ebpf::build(ws)?;
    // Debug binaries (the quicker build from cold): the traffic goes through
    // the eBPF programs, whatever the profile of the userspace that attaches
    // them. Only the plugin and sluicectl: the node agent (kube-rs) is most
    // of a cold build and the demo runs no cluster.
    let [sluice, sluicectl] = build::build_named(ws, &object, false, ["sluice", "sluicectl"])?;
    let bins = Bins { sluice, sluicectl };
    let mut tb = Testbed::new(PREFIX)?;
    let result = demo(&mut tb, &bins);
    drop(tb);
    step("cleanup: namespaces, pins and scratch files removed");
    result
}

fn step(s: &str) {
    println!("\n=== {s}");
}

/// What the demo runs.
struct Bins {
    sluice: PathBuf,
    sluicectl: PathBuf,
}

fn demo(tb: &mut Testbed, bins: &Bins) -> Result<()> {
    step("testbed: node (uplink up0) <-> external host; two pod namespaces");
    let (node, ext, up) = tb.node_with_uplink("demo", 77, Some(POD_CIDR))?;
    // Dual stack: the uplink gets IPv6 too (the external host has no route to
    // the pods' IPv6 range: only masquerade brings replies back).
    let addr6 = |ip: &str| format!("{ip}/64");
    tb.ns(node)
        .ip(&["addr", "add", &addr6(NODE_IP6), "dev", &up.node_if, "nodad"])?;
    tb.ns(ext)
        .ip(&["addr", "add", &addr6(EXT_IP6), "dev", &up.ext_if, "nodad"])?;
    tb.ns(node)
        .ip(&["-6", "route", "add", "default", "via", EXT_IP6])?;
    let web = tb.netns("web")?;
    let db = tb.netns("db")?;

    let pin_root = tb.pin_root("demo");
    // The hostPort socket hooks go on a cgroup of this demo, not the node's root.
    let cgroup = crate::bench::hostport::Cgroup::new("demo")?;
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": "demo",
        "type": "sluice",
        "pinRoot": pin_root,
        "ipMasq": true,
        "capabilities": {"portMappings": true},
        "hostPortCgroup": cgroup.path,
        "stateDir": tb.dir.join("state"),
        "ipam": {
            "type": "sluice",
            "ranges": [[{"subnet": POD_CIDR}], [{"subnet": POD_CIDR6}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dataDir": tb.dir.join("ipam"),
        },
    });
    println!("network config:\n{}", serde_json::to_string_pretty(&conf)?);
    let cni = |command: &str, conf: &Value, id: &str, pod: Option<usize>| {
        tb.cni(node, &bins.sluice, command, conf, id, pod)
    };

    step("ADD: the runtime executes sluice for each pod");
    let mut results = Vec::new();
    // db publishes its port 5201 on the node's port 8080 (runtimeConfig, as a
    // runtime passes it for `capabilities.portMappings`).
    let pod_conf = |id: &str| {
        let mut c = conf.clone();
        if id == "db" {
            c["runtimeConfig"] = json!({"portMappings": [
                {"hostPort": 8080, "containerPort": 5201, "protocol": "tcp"}
            ]});
        }
        c
    };
    for (pod, id) in [(web, "web"), (db, "db")] {
        let started = std::time::Instant::now();
        let r = cni("ADD", &pod_conf(id), id, Some(pod))?;
        println!(
            "{id}: {} and {} in {:.1} ms",
            r["ips"][0]["address"].as_str().unwrap_or("?"),
            r["ips"][1]["address"].as_str().unwrap_or("?"),
            started.elapsed().as_secs_f64() * 1e3
        );
        results.push(r);
    }
    let ip_of = |r: &Value| -> Result<String> {
        let a = r["ips"][0]["address"]
            .as_str()
            .context("ADD result without ips")?;
        Ok(a.split('/').next().unwrap_or(a).to_string())
    };
    let (web_ip, db_ip) = (ip_of(&results[0])?, ip_of(&results[1])?);
    println!(
        "result of web's ADD:\n{}",
        serde_json::to_string_pretty(&results[0])?
    );

    let ctl = |args: &[&str]| -> Result<()> {
        let mut c = Command::new(&bins.sluicectl);
        c.arg("--pin-root").arg(&pin_root).args(args);
        println!("$ sluicectl {}", args.join(" "));
        print!("{}", cmd::stdout(&mut c)?);
        Ok(())
    };
    step("the datapath after the ADDs");
    ctl(&["status"])?;
    ctl(&["endpoints"])?;
    println!("$ bpftool net show   (in the node namespace: the attachments outlive the plugin)");
    print!(
        "{}",
        cmd::stdout(tb.ns(node).command("bpftool").args(["net", "show"]))?
    );

    step(&format!(
        "traffic: web ({web_ip}) -> db ({db_ip}), TCP for 2 s (iperf3)"
    ));
    iperf(tb, web, db, &db_ip)?;
    let (node_ip, ext_ip) = (up.node_ip.as_str(), up.ext_ip.as_str());
    step(&format!("traffic: web -> external host {ext_ip}, TCP for 2 s, masqueraded (ipMasq: it leaves with the node's address {node_ip} and a NAT port; no iptables, no conntrack)"));
    iperf(tb, web, ext, ext_ip)?;
    step(&format!("traffic: web -> external host {EXT_IP6} over IPv6, TCP for 2 s, masqueraded (it leaves with the node's IPv6 address {NODE_IP6})"));
    iperf(tb, web, ext, EXT_IP6)?;
    step("traffic: external host -> db, TCP for 2 s (the external host routes the pod range to the node: an inbound flow, answered from db's own address)");
    iperf(tb, ext, db, &db_ip)?;
    step(&format!("traffic: external host -> node {node_ip}:8080, db's hostPort (DNAT to db:5201 in eBPF, no iptables), TCP for 2 s"));
    iperf_port(tb, ext, db, node_ip, 8080)?;
    step(&format!("traffic: external host -> node [{NODE_IP6}]:8080 over IPv6, the same hostPort (a mapping without hostIP is published on both families), TCP for 2 s"));
    iperf_port(tb, ext, db, NODE_IP6, 8080)?;
    ctl(&["ports", "list"])?;
    step("the NAT flows: web's connections (iperf3 control and data, IPv4 and IPv6) as masqueraded flows, db's as inbound");
    ctl(&["nat", "list"])?;

    step("bandwidth: limit web's egress to 200 Mbit/s live (token bucket in eBPF, no qdisc, no ifb), measure, lift it");
    ctl(&["bandwidth", "set", "web", "--egress-rate", "200000000"])?;
    // A monitor runs meanwhile: the new masqueraded flows, then the policer's drops.
    let monitor = Command::new(&bins.sluicectl)
        .arg("--pin-root")
        .arg(&pin_root)
        .args(["monitor", "--count", "8", "--duration", "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting sluicectl monitor")?;
    // Its first lease reaches the programs within a few ms; a second is plenty.
    std::thread::sleep(Duration::from_secs(1));
    iperf(tb, web, ext, ext_ip)?;
    let out = monitor
        .wait_with_output()
        .context("waiting for sluicectl monitor")?;
    println!("$ sluicectl monitor --count 8   (running during that iperf3)");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    ctl(&["bandwidth", "list"])?;
    ctl(&["counters", "--pod", &web_ip])?;
    ctl(&["bandwidth", "set", "web", "--clear-egress"])?;

    step("the counters moved: pod-to-pod went straight from one veth into the other (bpf_redirect_peer), pod-to-external out of the uplink by FIB lookup, external-to-pod in through the uplink's XDP/tc programs");
    ctl(&["endpoints"])?;
    ctl(&["counters"])?;

    step("the same for Prometheus: sluicectl metrics (--listen ADDR serves /metrics)");
    let mut c = Command::new(&bins.sluicectl);
    c.arg("--pin-root").arg(&pin_root).arg("metrics");
    let text = cmd::stdout(&mut c)?;
    println!(
        "$ sluicectl metrics | grep -E '^sluice_(forward|endpoints |nat_flows|bpf_map_pressure|hostport)'"
    );
    let shown = [
        "sluice_forward_",
        "sluice_endpoints ",
        "sluice_nat_flows",
        "sluice_bpf_map_pressure",
        "sluice_hostport_mappings",
    ];
    for l in text
        .lines()
        .filter(|l| shown.iter().any(|p| l.starts_with(p)))
    {
        println!("{l}");
    }

    step("CHECK, then DEL (twice: DEL is idempotent)");
    for ((pod, id), r) in [(web, "web"), (db, "db")].into_iter().zip(&results) {
        let mut with_prev = pod_conf(id);
        with_prev["prevResult"] = r.clone();
        cni("CHECK", &with_prev, id, Some(pod))?;
        println!("CHECK {id}: ok");
    }
    for (pod, id) in [(web, "web"), (db, "db")] {
        cni("DEL", &pod_conf(id), id, Some(pod))?;
        cni("DEL", &pod_conf(id), id, None)?;
        println!("DEL {id}: ok");
    }
    ctl(&["endpoints"])?;
    Ok(())
}

/// One iperf3 run from `client` to a one-shot server in `server` at `addr`.
fn iperf(tb: &Testbed, client: usize, server: usize, addr: &str) -> Result<()> {
    iperf_port(tb, client, server, addr, 5201)
}

/// The same to `addr`:`port` (the server listens on 5201; `port` may be a
/// hostPort that leads there).
fn iperf_port(tb: &Testbed, client: usize, server: usize, addr: &str, port: u16) -> Result<()> {
    let mut s = tb.ns(server).command("iperf3");
    s.args(["-s", "-1", "-p", "5201"]);
    let _server = Background::spawn(s)?;
    wait_listening(&tb.ns(server).path(), 5201, Duration::from_secs(5))?;
    let out = cmd::stdout(tb.ns(client).command("timeout").args([
        "20",
        "iperf3",
        "-c",
        addr,
        "-p",
        &port.to_string(),
        "-t",
        "2",
        "-J",
    ]))?;
    let v: Value = serde_json::from_str(&out).context("parsing iperf3 -J output")?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 reported no throughput")?;
    println!("{:.2} Gbit/s", bps / 1e9);
    Ok(())
}
