//! `sluicectl nat list|flush`: the masqueraded flows.
use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{nat_flags, nat_state, NatEntry, NatKey};

use crate::{
    args::{NatCommand, NatFlushArgs, NatListArgs, Target},
    table,
    target::Datapath,
};

pub(crate) fn execute(t: &Target, c: &NatCommand) -> Result<()> {
    let dp = Datapath::open(t)?;
    match c {
        NatCommand::List(a) => list(&dp, a),
        NatCommand::Flush(a) => flush(&dp, a),
    }
}

fn state_name(s: u8) -> &'static str {
    match s {
        nat_state::TCP_SYN => "syn-sent",
        nat_state::TCP_ESTABLISHED => "established",
        nat_state::TCP_CLOSING => "closing",
        nat_state::UDP => "udp",
        nat_state::ICMP => "icmp",
        _ => "?",
    }
}

/// The pod addresses `pod` names: an IPv4 address, or a container id prefix.
fn pod_ips(dp: &Datapath, pod: &str) -> Result<Vec<[u8; 4]>> {
    // An address must be a pod's too (DEL removes a pod's flows, so no other
    // address has any), like --pod everywhere else.
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let ips: Vec<[u8; 4]> = crate::ports::select_pods(&eps, pod)?
        .into_iter()
        .filter_map(|r| match r.ip {
            std::net::IpAddr::V4(v4) => Some(v4.octets()),
            std::net::IpAddr::V6(_) => None,
        })
        .collect();
    if ips.is_empty() {
        bail!("no pod with address or container id {pod:?} on this datapath");
    }
    Ok(ips)
}

fn selected(dp: &Datapath, pod: Option<&str>) -> Result<Vec<(NatKey, NatEntry)>> {
    let flows = sluice_maps::nat::flows(&dp.root)?;
    Ok(match pod {
        Some(p) => {
            let ips = pod_ips(dp, p)?;
            flows
                .into_iter()
                .filter(|(k, _)| ips.contains(&k.src_ip))
                .collect()
        }
        None => flows,
    })
}

/// Who opened a flow: a pod (masqueraded), the outside (a connection to a routed
/// pod address: untranslated), or the node (its own ping, tracked).
fn origin(e: &NatEntry) -> &'static str {
    if e.flags & nat_flags::INBOUND != 0 {
        "outside"
    } else if e.flags & nat_flags::NODE != 0 {
        "node"
    } else {
        "pod"
    }
}

fn list(dp: &Datapath, a: &NatListArgs) -> Result<()> {
    let now = sluice_common::user::monotonic_ns();
    let flows: Vec<(NatKey, NatEntry)> = selected(dp, a.pod.as_deref())?
        .into_iter()
        .filter(|(k, _)| {
            a.proto
                .as_deref()
                .is_none_or(|p| p == table::proto_name(k.proto))
        })
        .filter(|(k, _)| a.dst.is_none_or(|d| d.octets() == k.dst_ip))
        .filter(|(k, e)| {
            a.port.is_none_or(|p| {
                [k.src_port, k.dst_port, e.nat_port]
                    .iter()
                    .any(|x| u16::from_be(*x) == p)
            })
        })
        .collect();
    let idle = |e: &NatEntry| now.saturating_sub(e.last_seen_ns) / 1_000_000_000;
    if a.json {
        let v: Vec<Value> = flows
            .iter()
            .map(|(k, e)| {
                json!({
                    "proto": table::proto_name(k.proto),
                    "podIp": Ipv4Addr::from(k.src_ip).to_string(),
                    "podPort": u16::from_be(k.src_port),
                    "natIp": Ipv4Addr::from(e.nat_addr).to_string(),
                    "natPort": u16::from_be(e.nat_port),
                    "origin": origin(e),
                    "dstIp": Ipv4Addr::from(k.dst_ip).to_string(),
                    "dstPort": u16::from_be(k.dst_port),
                    "state": state_name(e.state),
                    "idleSeconds": idle(e),
                    "hostIfindex": e.pod_ifindex,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = flows
        .iter()
        .map(|(k, e)| {
            vec![
                table::proto_name(k.proto).to_string(),
                format!("{}:{}", Ipv4Addr::from(k.src_ip), u16::from_be(k.src_port)),
                if e.flags & nat_flags::INBOUND != 0 {
                    "-".to_string()
                } else {
                    format!(
                        "{}:{}",
                        Ipv4Addr::from(e.nat_addr),
                        u16::from_be(e.nat_port)
                    )
                },
                format!("{}:{}", Ipv4Addr::from(k.dst_ip), u16::from_be(k.dst_port)),
                state_name(e.state).to_string(),
                format!("{}s", idle(e)),
                origin(e).to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "PROTO",
                "POD",
                "NAT",
                "DESTINATION",
                "STATE",
                "IDLE",
                "ORIGIN"
            ],
            &rows
        )
    );
    Ok(())
}

fn flush(dp: &Datapath, a: &NatFlushArgs) -> Result<()> {
    let flows = selected(dp, a.pod.as_deref())?;
    let n = sluice_maps::nat::remove_flows(&dp.root, &flows)?;
    match &a.pod {
        Some(p) => println!("deleted {n} masqueraded flows of {p}"),
        None => println!("deleted {n} masqueraded flows"),
    }
    Ok(())
}
