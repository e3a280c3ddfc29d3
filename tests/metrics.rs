//! `sluicectl metrics`: the exposition passes `promtool check metrics`, and a
//! real Prometheus scraping `sluicectl metrics --listen` in the node namespace
//! sees pod traffic and a spoofed packet's drop, queried through its HTTP API.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use sluice_tests::{
    ctl::CtlChild,
    fixtures::{add, del},
    masq::wait_for,
    prometheus::{check_metrics, http_get, Prometheus},
    raw::{ethernet, parse_mac, send_frames, udp, Ipv4, ETH_P_IP},
    schema::{check_add_result, Added},
    traffic::tcp_echo,
    Node, NETWORK,
};

/// Where `sluicectl metrics --listen` serves, in the node namespace.
const METRICS_PORT: u16 = 9964;
/// Longest Prometheus may take to show what happened (it scrapes every second).
const SEEN: Duration = Duration::from_secs(40);

fn ip4(a: &Added) -> Ipv4Addr {
    match a.ip() {
        std::net::IpAddr::V4(v) => v,
        std::net::IpAddr::V6(v) => panic!("expected IPv4, got {v}"),
    }
}

/// A UDP datagram from pod `a` with `src` as its source, to pod `b`.
fn forged_frame(a: &Added, b: &Added, src: Ipv4Addr) -> Vec<u8> {
    let p = Ipv4::new(src, ip4(b), udp(40000, 9, b"forged"));
    ethernet(
        parse_mac(&a.host_mac).unwrap(),
        parse_mac(&a.pod_mac).unwrap(),
        ETH_P_IP,
        &p.build(),
    )
}

/// The `sluice_*` metric names the dashboard's queries use.
fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/grafana/sluice-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut names = std::collections::BTreeSet::new();
    for panel in v["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("sluice_") {
                let tail = &rest[i..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.insert(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
    }
    assert!(names.len() >= 8, "{names:?}");
    names
}

#[test]
fn the_exposition_is_clean_and_names_every_pod() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.95.1.0/24");
    // Pod a is named as containerd names it in CNI_ARGS; b is not named.
    let out = node
        .cni(
            "ADD",
            &conf,
            "metrics-a",
            "eth0",
            Some(&a),
            &[(
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=u1",
            )],
        )
        .unwrap();
    check_add_result(&out.result(), "1.0.0", "eth0", &a);
    let added_b = add(&node, &conf, "metrics-b", &b);
    tcp_echo(&b, added_b.ip(), &a, 64 << 10).unwrap();
    // The network's state directory: its records name the pods.
    let state = node.state_dir().join(NETWORK).display().to_string();
    let out = node.sluicectl(&["metrics", "--state-dir", &state]).unwrap();
    assert!(out.success(), "{out}");
    let problems = check_metrics(&out.stdout).unwrap();
    assert!(problems.is_empty(), "{problems}\n{}", out.stdout);
    for (cid, ns, pod) in [("metrics-a", "shop", "web-0"), ("metrics-b", "", "")] {
        for dir in ["egress", "ingress"] {
            let series = format!(
                "sluice_endpoint_bytes_total{{namespace=\"{ns}\",pod=\"{pod}\",container_id=\"{cid}\",interface=\"eth0\",direction=\"{dir}\"}} "
            );
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&series))
                .unwrap_or_else(|| panic!("no {series}in:\n{}", out.stdout));
            let v: u64 = line[series.len()..].parse().unwrap();
            assert!(v >= 64 << 10, "{line}");
        }
    }
    assert!(
        out.stdout.contains("sluice_endpoints 2\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("sluice_drop_count_total{reason=\"spoofed\",direction=\"egress\"} 0\n"),
        "{}",
        out.stdout
    );
    // Every metric the Grafana dashboard graphs is one sluicectl exposes.
    for name in dashboard_metrics() {
        assert!(
            out.stdout.contains(&format!("# TYPE {name} ")),
            "deploy/grafana/sluice-dashboard.json graphs {name}, which sluicectl metrics lacks"
        );
    }
    // At most --max-endpoints pods get series of their own.
    let one = node
        .sluicectl(&["metrics", "--max-endpoints", "1"])
        .unwrap();
    assert!(one.success(), "{one}");
    assert!(one.stdout.contains("sluice_endpoint_series_truncated 1\n"));
    let pods = one
        .stdout
        .lines()
        .filter(|l| l.starts_with("sluice_endpoint_packets_total{") && l.contains("egress"))
        .count();
    assert_eq!(pods, 1, "{}", one.stdout);
    del(&node, &conf, "metrics-a", &a);
    del(&node, &conf, "metrics-b", &b);
    node.assert_clean(NETWORK);
}

#[test]
fn prometheus_scrapes_traffic_and_a_spoofed_packets_drop() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.95.2.0/24");
    let added_a = add(&node, &conf, "prom-a", &a);
    let added_b = add(&node, &conf, "prom-b", &b);
    let listen = SocketAddr::from(([127, 0, 0, 1], METRICS_PORT)).to_string();
    let server = CtlChild::spawn(
        &node,
        &["metrics", "--listen", &listen, "--duration", "240"],
    )
    .unwrap();
    // Served: a plain GET answers with the exposition.
    assert!(
        wait_for(Duration::from_secs(10), || http_get(
            &node.netns_path(),
            METRICS_PORT,
            "/metrics"
        )
        .is_ok_and(|b| b.contains("sluice_datapath_info{"))),
        "sluicectl metrics --listen does not answer"
    );
    let prom = Prometheus::start(&node, &[&listen]).unwrap();
    let up = || prom.value("up{job=\"sluice\"}").ok().flatten() == Some(1.0);
    assert!(
        wait_for(SEEN, up),
        "Prometheus never scraped sluicectl: {}",
        prom.log()
    );

    // Traffic between the pods shows in the node-wide and per-pod series.
    tcp_echo(&b, added_b.ip(), &a, 256 << 10).unwrap();
    let bytes = |q: &str| prom.value(q).ok().flatten().unwrap_or(0.0);
    assert!(
        wait_for(SEEN, || bytes(
            "sluice_forward_bytes_total{direction=\"egress\"}"
        ) >= f64::from(2 * (256 << 10))),
        "egress bytes in Prometheus: {}",
        bytes("sluice_forward_bytes_total{direction=\"egress\"}")
    );
    let q = "sluice_endpoint_bytes_total{container_id=\"prom-a\",direction=\"ingress\"}";
    assert!(
        wait_for(SEEN, || bytes(q) >= f64::from(256 << 10)),
        "{q}: {}",
        bytes(q)
    );

    // A forged source from pod a: dropped, and Prometheus sees the counter rise.
    let spoofed = "sluice_drop_count_total{reason=\"spoofed\",direction=\"egress\"}";
    let before = bytes(spoofed);
    let frames = vec![forged_frame(&added_a, &added_b, Ipv4Addr::new(198, 51, 100, 7)); 3];
    assert_eq!(send_frames(&a.path, "eth0", frames).unwrap(), 3);
    assert!(
        wait_for(SEEN, || bytes(spoofed) >= before + 3.0),
        "{spoofed}: {} (before {before})",
        bytes(spoofed)
    );
    let per_pod = "sluice_endpoint_drop_count_total{container_id=\"prom-a\",reason=\"spoofed\"}";
    assert!(
        wait_for(SEEN, || bytes(per_pod) >= 3.0),
        "{per_pod}: {}",
        bytes(per_pod)
    );
    // A rate query works on the counters (they are counters to Prometheus).
    let rate = prom.query("rate(sluice_forward_count_total[30s])").unwrap();
    assert_eq!(rate.len(), 2, "{rate:?}");

    drop(prom);
    drop(server);
    del(&node, &conf, "prom-a", &a);
    del(&node, &conf, "prom-b", &b);
    node.assert_clean(NETWORK);
}
