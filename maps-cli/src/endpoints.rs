//! `sluicectl endpoints`: pod addresses, their host veth, owner and counters.
use anyhow::Result;
use serde_json::{json, Value};

use crate::{
    args::{EndpointsArgs, Target},
    table,
    target::Datapath,
};

pub(crate) fn execute(t: &Target, a: &EndpointsArgs) -> Result<()> {
    let dp = Datapath::open(t)?;
    let rows: Vec<sluice_maps::endpoint::EndpointRow> =
        sluice_maps::endpoint::Endpoints::open(&dp.root)?
            .rows()?
            .into_iter()
            .filter(|r| a.ip.is_none_or(|ip| ip == r.ip))
            .filter(|r| {
                a.container.as_deref().is_none_or(|c| {
                    r.owner
                        .as_ref()
                        .is_some_and(|o| table::text(&o.container_id).starts_with(c))
                })
            })
            .collect();
    if a.json {
        let v: Vec<Value> = rows.iter().map(to_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let (cid, ifname, host) = owner_fields(r);
                vec![
                    r.ip.to_string(),
                    host,
                    r.endpoint.ifindex.to_string(),
                    table::short_id(&cid),
                    ifname,
                    format!("{}/{}", r.stats.from_pod_packets, r.stats.from_pod_bytes),
                    format!("{}/{}", r.stats.to_pod_packets, r.stats.to_pod_bytes),
                ]
            })
            .collect();
        print!(
            "{}",
            table::render(
                &[
                    "IP",
                    "HOST-IF",
                    "IFINDEX",
                    "CONTAINER",
                    "IFNAME",
                    "FROM-POD PKTS/BYTES",
                    "TO-POD PKTS/BYTES"
                ],
                &body
            )
        );
    }
    Ok(())
}

fn owner_fields(r: &sluice_maps::endpoint::EndpointRow) -> (String, String, String) {
    r.owner.as_ref().map_or_else(
        || (String::new(), String::new(), String::new()),
        |o| {
            (
                table::text(&o.container_id),
                table::text(&o.ifname),
                table::text(&o.host_ifname),
            )
        },
    )
}

/// The stable JSON shape of one endpoint (documented in the README).
fn to_json(r: &sluice_maps::endpoint::EndpointRow) -> Value {
    let (cid, ifname, host) = owner_fields(r);
    json!({
        "ip": r.ip.to_string(),
        "ifindex": r.endpoint.ifindex,
        "hostIfname": host,
        "containerId": cid,
        "ifname": ifname,
        "podMac": table::mac(r.endpoint.pod_mac),
        "hostMac": table::mac(r.endpoint.host_mac),
        "limited": r.endpoint.flags & sluice_common::endpoint_flags::LIMITED != 0,
        "slot": sluice_common::endpoint_flags::slot(r.endpoint.flags),
        "fromPodPackets": r.stats.from_pod_packets,
        "fromPodBytes": r.stats.from_pod_bytes,
        "toPodPackets": r.stats.to_pod_packets,
        "toPodBytes": r.stats.to_pod_bytes,
    })
}
