//! `sluicectl counters`: why packets were redirected, passed or dropped — for
//! the node (every reason) and per endpoint (packets and bytes each way, drops
//! by reason). `--watch` refreshes and shows what changed.
use std::{collections::BTreeMap, io::IsTerminal, time::Duration};

use anyhow::Result;
use serde_json::{json, Map, Value};
use sluice_common::reason;

use crate::{
    args::{CountersArgs, Target},
    ports::select_pods,
    signals, table,
    target::Datapath,
};

/// One pod interface: its addresses, owner, traffic and drops.
#[derive(Clone, Default)]
pub(crate) struct EndpointCounters {
    pub ifindex: u32,
    pub host_ifname: String,
    pub container_id: String,
    pub ifname: String,
    /// The Kubernetes pod (`sluicectl metrics` fills these from the
    /// attachment records; empty when unknown).
    pub namespace: String,
    pub pod: String,
    pub ips: Vec<String>,
    /// (packets, bytes) the pod sent, and received.
    pub sent: (u64, u64),
    pub received: (u64, u64),
    pub drops: BTreeMap<&'static str, u64>,
}

pub(crate) struct Reading {
    /// Every reason of the node and its count.
    pub node: Vec<(&'static str, u64)>,
    pub endpoints: Vec<EndpointCounters>,
}

/// The node's counters and every endpoint's (`sluicectl metrics`).
pub(crate) fn read_all(dp: &Datapath) -> Result<Reading> {
    read(
        dp,
        &CountersArgs {
            json: false,
            pod: None,
            node: false,
            all: true,
            watch: None,
            count: None,
        },
    )
}

pub(crate) fn execute(t: &Target, a: &CountersArgs) -> Result<()> {
    let dp = Datapath::open(t)?;
    let Some(every) = a.watch else {
        let r = read(&dp, a)?;
        return print(&r, None, a);
    };
    signals::install();
    let mut last: Option<Reading> = None;
    let mut n = 0;
    loop {
        let r = read(&dp, a)?;
        if !a.json && std::io::stdout().is_terminal() {
            // Clear the screen and go home, like watch(1).
            print!("\x1b[2J\x1b[H");
        }
        print(&r, last.as_ref(), a)?;
        last = Some(r);
        n += 1;
        if a.count.is_some_and(|c| n >= c) || signals::sleep(Duration::from_secs(every)) {
            return Ok(());
        }
        if !a.json {
            println!();
        }
    }
}

fn read(dp: &Datapath, a: &CountersArgs) -> Result<Reading> {
    let node = sluice_maps::counters::named(&dp.root)?;
    if a.node {
        return Ok(Reading {
            node,
            endpoints: Vec::new(),
        });
    }
    let rows = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let selected = match &a.pod {
        Some(p) => select_pods(&rows, p)?,
        None => rows.iter().collect(),
    };
    let mut by_if: BTreeMap<u32, EndpointCounters> = BTreeMap::new();
    for r in selected {
        let e = by_if
            .entry(r.endpoint.ifindex)
            .or_insert_with(|| EndpointCounters {
                ifindex: r.endpoint.ifindex,
                host_ifname: r
                    .owner
                    .as_ref()
                    .map(|o| table::text(&o.host_ifname))
                    .unwrap_or_default(),
                container_id: r
                    .owner
                    .as_ref()
                    .map(|o| table::text(&o.container_id))
                    .unwrap_or_default(),
                ifname: r
                    .owner
                    .as_ref()
                    .map(|o| table::text(&o.ifname))
                    .unwrap_or_default(),
                sent: (r.stats.from_pod_packets, r.stats.from_pod_bytes),
                received: (r.stats.to_pod_packets, r.stats.to_pod_bytes),
                ..Default::default()
            });
        e.ips.push(r.ip.to_string());
    }
    for (k, n) in sluice_maps::endpoint::drops(&dp.root)? {
        if let (Some(e), Some(name)) = (by_if.get_mut(&k.ifindex), reason_name(k.reason)) {
            *e.drops.entry(name).or_default() += n;
        }
    }
    Ok(Reading {
        node,
        endpoints: by_if.into_values().collect(),
    })
}

fn reason_name(r: u32) -> Option<&'static str> {
    reason::NAMES.get(r as usize).copied()
}

fn to_json(r: &Reading, a: &CountersArgs) -> Value {
    let node: Map<String, Value> = r
        .node
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect();
    if a.node {
        return json!({ "node": node });
    }
    let eps: Vec<Value> = r
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "ifindex": e.ifindex,
                "hostIfname": e.host_ifname,
                "containerId": e.container_id,
                "ifname": e.ifname,
                "ips": e.ips,
                "sent": { "packets": e.sent.0, "bytes": e.sent.1 },
                "received": { "packets": e.received.0, "bytes": e.received.1 },
                "drops": e.drops,
            })
        })
        .collect();
    json!({ "node": node, "endpoints": eps })
}

fn print(r: &Reading, last: Option<&Reading>, a: &CountersArgs) -> Result<()> {
    if a.json {
        let v = to_json(r, a);
        // --watch: one object per line, so a script can read refreshes as a stream.
        if a.watch.is_some() {
            println!("{}", serde_json::to_string(&v)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        return Ok(());
    }
    let delta = |now: u64, before: Option<u64>| match before {
        Some(b) if now >= b => format!("+{}", now - b),
        _ => String::new(),
    };
    let rows: Vec<Vec<String>> = r
        .node
        .iter()
        .enumerate()
        .filter(|(_, (_, v))| a.all || *v > 0)
        .map(|(i, (k, v))| {
            let before = last.and_then(|l| l.node.get(i)).map(|(_, b)| *b);
            vec![(*k).to_string(), v.to_string(), delta(*v, before)]
        })
        .collect();
    let header: &[&str] = if last.is_some() {
        &["NODE REASON", "PACKETS", "CHANGE"]
    } else {
        &["NODE REASON", "PACKETS"]
    };
    print!("{}", table::render(header, &rows));
    if a.node {
        return Ok(());
    }
    println!();
    let rows: Vec<Vec<String>> = r
        .endpoints
        .iter()
        .map(|e| {
            let before = last.and_then(|l| l.endpoints.iter().find(|b| b.ifindex == e.ifindex));
            let drops: Vec<String> = e
                .drops
                .iter()
                .map(|(k, v)| {
                    let d = before.and_then(|b| b.drops.get(k).copied()).unwrap_or(0);
                    match before {
                        Some(_) if *v > d => format!("{k}={v}(+{})", v - d),
                        _ => format!("{k}={v}"),
                    }
                })
                .collect();
            let pair = |now: (u64, u64), b: Option<(u64, u64)>| match b {
                Some(b) if now.0 > b.0 => format!("{}/{} (+{})", now.0, now.1, now.0 - b.0),
                _ => format!("{}/{}", now.0, now.1),
            };
            vec![
                table::short_id(&e.container_id),
                e.ifname.clone(),
                e.host_ifname.clone(),
                e.ips.join(","),
                pair(e.sent, before.map(|b| b.sent)),
                pair(e.received, before.map(|b| b.received)),
                if drops.is_empty() {
                    "-".into()
                } else {
                    drops.join(" ")
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "CONTAINER",
                "IFNAME",
                "HOST-IF",
                "IPS",
                "SENT PKTS/BYTES",
                "RECEIVED PKTS/BYTES",
                "DROPS"
            ],
            &rows
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(node: bool) -> CountersArgs {
        CountersArgs {
            json: true,
            pod: None,
            node,
            all: false,
            watch: None,
            count: None,
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let r = Reading {
            node: vec![("drop_bw_egress", 3), ("masq_snat", 0)],
            endpoints: vec![EndpointCounters {
                ifindex: 7,
                host_ifname: "sl0".into(),
                container_id: "c1".into(),
                ifname: "eth0".into(),
                ips: vec!["10.0.0.2".into()],
                sent: (1, 100),
                received: (2, 200),
                drops: [("drop_bw_egress", 3)].into_iter().collect(),
                ..EndpointCounters::default()
            }],
        };
        let v = to_json(&r, &args(false));
        assert_eq!(v["node"]["drop_bw_egress"], 3);
        assert_eq!(v["node"]["masq_snat"], 0, "zero reasons are listed too");
        let e = &v["endpoints"][0];
        assert_eq!(e["ifindex"], 7);
        assert_eq!(e["hostIfname"], "sl0");
        assert_eq!(e["containerId"], "c1");
        assert_eq!(e["ifname"], "eth0");
        assert_eq!(e["ips"][0], "10.0.0.2");
        assert_eq!(e["sent"]["packets"], 1);
        assert_eq!(e["sent"]["bytes"], 100);
        assert_eq!(e["received"]["packets"], 2);
        assert_eq!(e["drops"]["drop_bw_egress"], 3);
        let node_only = to_json(&r, &args(true));
        assert!(node_only.get("endpoints").is_none());
        assert_eq!(node_only["node"]["drop_bw_egress"], 3);
    }
}
