//! `sluicectl ports list|add|del`: the hostPort mappings.
use std::net::{IpAddr, Ipv4Addr};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{port_flags, PortKey, PortTarget};
use sluice_maps::{
    endpoint::EndpointRow,
    hostport::{describe, describe_target},
};

use crate::{
    args::{PortsAddArgs, PortsCommand, PortsDelArgs, PortsListArgs, Target},
    table,
    target::Datapath,
};

pub(crate) fn execute(t: &Target, c: &PortsCommand) -> Result<()> {
    let dp = Datapath::open(t)?;
    match c {
        PortsCommand::List(a) => list(&dp, a),
        PortsCommand::Add(a) => add(&dp, a),
        PortsCommand::Del(a) => del(&dp, a),
    }
}

fn proto_number(p: &str) -> u8 {
    match p {
        "udp" => 17,
        "sctp" => 132,
        _ => 6,
    }
}

/// The endpoint a mapping goes to (by host veth), if the pod is still there.
fn owner<'a>(eps: &'a [EndpointRow], t: &PortTarget) -> Option<&'a EndpointRow> {
    eps.iter().find(|r| r.endpoint.ifindex == t.pod_ifindex)
}

/// The pod endpoints `pod` names: an IPv4 address or a container id prefix.
pub(crate) fn pod_endpoints<'a>(eps: &'a [EndpointRow], pod: &str) -> Vec<&'a EndpointRow> {
    let ip: Option<IpAddr> = pod.parse().ok();
    eps.iter()
        .filter(|r| match ip {
            Some(ip) => r.ip == ip,
            None => r
                .owner
                .as_ref()
                .is_some_and(|o| table::text(&o.container_id).starts_with(pod)),
        })
        .collect()
}

/// [`pod_endpoints`] for a `--pod` filter: a `pod` naming none is refused.
pub(crate) fn select_pods<'a>(eps: &'a [EndpointRow], pod: &str) -> Result<Vec<&'a EndpointRow>> {
    let v = pod_endpoints(eps, pod);
    if v.is_empty() {
        bail!("no pod with address or container id {pod:?} on this datapath");
    }
    Ok(v)
}

/// The host veths of the pods an optional `--pod` filter selects (`None`: all).
pub(crate) fn selected_ifindexes(
    eps: &[EndpointRow],
    pod: Option<&str>,
) -> Result<Option<Vec<u32>>> {
    pod.map(|p| {
        Ok(select_pods(eps, p)?
            .iter()
            .map(|r| r.endpoint.ifindex)
            .collect())
    })
    .transpose()
}

fn list(dp: &Datapath, a: &PortsListArgs) -> Result<()> {
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let pod_ifindexes = selected_ifindexes(&eps, a.pod.as_deref())?;
    let rows: Vec<(PortKey, PortTarget)> = sluice_maps::hostport::list(&dp.root)?
        .into_iter()
        .filter(|(_, t)| {
            pod_ifindexes
                .as_ref()
                .is_none_or(|v| v.contains(&t.pod_ifindex))
        })
        .filter(|(k, _)| a.port.is_none_or(|p| u16::from_be(k.host_port) == p))
        .filter(|(k, _)| {
            a.proto
                .as_deref()
                .is_none_or(|p| p == table::proto_name(k.proto))
        })
        .collect();
    if a.json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(k, t)| {
                let o = owner(&eps, t).and_then(|r| r.owner.as_ref());
                json!({
                    "hostIp": Ipv4Addr::from(k.host_ip).to_string(),
                    "hostPort": u16::from_be(k.host_port),
                    "protocol": table::proto_name(k.proto),
                    "podIp": Ipv4Addr::from(t.pod_ip).to_string(),
                    "containerPort": u16::from_be(t.pod_port),
                    "containerId": o.map(|o| table::text(&o.container_id)),
                    "ifname": o.map(|o| table::text(&o.ifname)),
                    "origin": if t.flags & port_flags::OPERATOR != 0 { "operator" } else { "cni" },
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(k, t)| {
            let o = owner(&eps, t).and_then(|r| r.owner.as_ref());
            vec![
                table::proto_name(k.proto).to_string(),
                describe(k),
                describe_target(t),
                o.map_or("-".into(), |o| {
                    format!(
                        "{}/{}",
                        table::text(&o.container_id)
                            .chars()
                            .take(12)
                            .collect::<String>(),
                        table::text(&o.ifname)
                    )
                }),
                if t.flags & port_flags::OPERATOR != 0 {
                    "operator"
                } else {
                    "cni"
                }
                .to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["PROTO", "HOST", "POD", "CONTAINER", "ORIGIN"],
            &table_rows
        )
    );
    Ok(())
}

fn key(host_ip: Option<Ipv4Addr>, port: u16, proto: &str) -> PortKey {
    PortKey::new(
        host_ip.map_or([0; 4], |a| a.octets()),
        port,
        proto_number(proto),
    )
}

fn add(dp: &Datapath, a: &PortsAddArgs) -> Result<()> {
    if a.proto == "sctp" && a.host_port != a.container_port {
        bail!(
            "--container-port {}: an sctp mapping must keep the port ({}): SCTP's CRC32c covers the ports",
            a.container_port,
            a.host_port
        );
    }
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let pods: Vec<&EndpointRow> = pod_endpoints(&eps, &a.pod)
        .into_iter()
        .filter(|r| r.ip.is_ipv4())
        .collect();
    let pod = match pods.as_slice() {
        [one] => *one,
        [] => bail!(
            "--pod {}: no pod with that IPv4 address or container id on this datapath",
            a.pod
        ),
        many => bail!(
            "--pod {}: {} pod addresses match; give the address",
            a.pod,
            many.len()
        ),
    };
    let IpAddr::V4(pod_ip) = pod.ip else {
        bail!("--pod {}: not an IPv4 pod", a.pod);
    };
    let k = key(a.host_ip, a.host_port, &a.proto);
    let t = PortTarget {
        pod_ip: pod_ip.octets(),
        pod_port: a.container_port.to_be(),
        flags: port_flags::OPERATOR,
        pod_ifindex: pod.endpoint.ifindex,
    };
    // The plugin's rules (a wildcard mapping and one on a node address overlap;
    // the port is taken atomically), so an operator and an ADD never disagree.
    let Some(cookie) = sluice_maps::hostport::node_netns_cookie(&dp.root)? else {
        bail!(
            "this kernel has no SO_NETNS_COOKIE (Linux 5.14) and no ADD with a hostPort recorded the node namespace yet; add a pod with a hostPort first"
        );
    };
    match sluice_maps::hostport::add(&dp.root, &[(k, t)], cookie) {
        Ok(()) => {}
        Err(sluice_maps::Error::PortConflict {
            port,
            target,
            owner,
        }) => bail!("{} is taken: {port} -> {target} by {owner}", describe(&k)),
        Err(e) => return Err(e.into()),
    }
    println!("added {} -> {}", describe(&k), describe_target(&t));
    Ok(())
}

fn del(dp: &Datapath, a: &PortsDelArgs) -> Result<()> {
    let k = key(a.host_ip, a.host_port, &a.proto);
    let found = sluice_maps::hostport::list(&dp.root)?
        .into_iter()
        .find(|(o, _)| *o == k);
    let Some((_, t)) = found else {
        bail!("no mapping {}", describe(&k));
    };
    if !sluice_maps::hostport::remove_key(&dp.root, &k)? {
        bail!("no mapping {} (removed meanwhile)", describe(&k));
    }
    println!("deleted {} -> {}", describe(&k), describe_target(&t));
    Ok(())
}
