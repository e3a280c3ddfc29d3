//! `sluicectl nat list|flush`: the masqueraded flows, IPv4 and IPv6.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{nat_flags, nat_state, Nat6Entry, Nat6Key, NatEntry, NatKey};

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

/// The flows of both families, as they are in the maps.
struct Flows {
    v4: Vec<(NatKey, NatEntry)>,
    v6: Vec<(Nat6Key, Nat6Entry)>,
}

/// One flow of either family, for printing.
struct Flow {
    proto: u8,
    pod: (IpAddr, u16),
    nat: (IpAddr, u16),
    dst: (IpAddr, u16),
    state: u8,
    flags: u8,
    last_seen_ns: u64,
    pod_ifindex: u32,
}

impl Flows {
    fn rows(&self) -> Vec<Flow> {
        let v4 = self.v4.iter().map(|(k, e)| Flow {
            proto: k.proto,
            pod: (Ipv4Addr::from(k.src_ip).into(), u16::from_be(k.src_port)),
            nat: (Ipv4Addr::from(e.nat_addr).into(), u16::from_be(e.nat_port)),
            dst: (Ipv4Addr::from(k.dst_ip).into(), u16::from_be(k.dst_port)),
            state: e.state,
            flags: e.flags,
            last_seen_ns: e.last_seen_ns,
            pod_ifindex: e.pod_ifindex,
        });
        let v6 = self.v6.iter().map(|(k, e)| Flow {
            proto: k.proto,
            pod: (Ipv6Addr::from(k.src_ip.0).into(), u16::from_be(k.src_port)),
            nat: (
                Ipv6Addr::from(e.nat_addr.0).into(),
                u16::from_be(e.nat_port),
            ),
            dst: (Ipv6Addr::from(k.dst_ip.0).into(), u16::from_be(k.dst_port)),
            state: e.state,
            flags: e.flags,
            last_seen_ns: e.last_seen_ns,
            pod_ifindex: e.pod_ifindex,
        });
        v4.chain(v6).collect()
    }
}

/// The pod addresses `pod` names: an address, or a container id prefix.
fn pod_ips(dp: &Datapath, pod: &str) -> Result<Vec<IpAddr>> {
    // An address must be a pod's too (DEL removes a pod's flows, so no other
    // address has any), like --pod everywhere else.
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let ips: Vec<IpAddr> = crate::ports::select_pods(&eps, pod)?
        .into_iter()
        .map(|r| r.ip)
        .collect();
    if ips.is_empty() {
        bail!("no pod with address or container id {pod:?} on this datapath");
    }
    Ok(ips)
}

fn selected(dp: &Datapath, pod: Option<&str>) -> Result<Flows> {
    let mut f = Flows {
        v4: sluice_maps::nat::flows(&dp.root)?,
        v6: sluice_maps::nat::flows6(&dp.root)?,
    };
    if let Some(p) = pod {
        let ips = pod_ips(dp, p)?;
        f.v4.retain(|(k, _)| ips.contains(&Ipv4Addr::from(k.src_ip).into()));
        f.v6.retain(|(k, _)| ips.contains(&Ipv6Addr::from(k.src_ip.0).into()));
    }
    Ok(f)
}

/// Who opened a flow: a pod (masqueraded), the outside (a connection to a routed
/// pod address: untranslated), or the node (its own ping, tracked).
fn origin(flags: u8) -> &'static str {
    if flags & nat_flags::INBOUND != 0 {
        "outside"
    } else if flags & nat_flags::NODE != 0 {
        "node"
    } else {
        "pod"
    }
}

/// `addr:port`, IPv6 in brackets.
fn endpoint((ip, port): (IpAddr, u16)) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

fn list(dp: &Datapath, a: &NatListArgs) -> Result<()> {
    let now = sluice_common::user::monotonic_ns();
    let flows: Vec<Flow> = selected(dp, a.pod.as_deref())?
        .rows()
        .into_iter()
        .filter(|f| {
            a.proto
                .as_deref()
                .is_none_or(|p| p == table::proto_name(f.proto))
        })
        .filter(|f| a.dst.is_none_or(|d| d == f.dst.0))
        .filter(|f| {
            a.port
                .is_none_or(|p| [f.pod.1, f.dst.1, f.nat.1].contains(&p))
        })
        .collect();
    let idle = |f: &Flow| now.saturating_sub(f.last_seen_ns) / 1_000_000_000;
    if a.json {
        let v: Vec<Value> = flows
            .iter()
            .map(|f| {
                json!({
                    "proto": table::proto_name(f.proto),
                    "podIp": f.pod.0.to_string(),
                    "podPort": f.pod.1,
                    "natIp": f.nat.0.to_string(),
                    "natPort": f.nat.1,
                    "origin": origin(f.flags),
                    "dstIp": f.dst.0.to_string(),
                    "dstPort": f.dst.1,
                    "state": state_name(f.state),
                    "idleSeconds": idle(f),
                    "hostIfindex": f.pod_ifindex,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = flows
        .iter()
        .map(|f| {
            vec![
                table::proto_name(f.proto).to_string(),
                endpoint(f.pod),
                if f.flags & nat_flags::INBOUND != 0 {
                    "-".to_string()
                } else {
                    endpoint(f.nat)
                },
                endpoint(f.dst),
                state_name(f.state).to_string(),
                format!("{}s", idle(f)),
                origin(f.flags).to_string(),
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
    let n = sluice_maps::nat::remove_flows(&dp.root, &flows.v4)?
        + sluice_maps::nat::remove_flows6(&dp.root, &flows.v6)?;
    match &a.pod {
        Some(p) => println!("deleted {n} masqueraded flows of {p}"),
        None => println!("deleted {n} masqueraded flows"),
    }
    Ok(())
}
