//! `sluicectl ports list|add|del`: the hostPort mappings.
use std::net::{IpAddr, Ipv4Addr};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{port_flags, Addr6, PortKey, PortKey6, PortKeyOf, PortTargetOf};
use sluice_maps::{
    endpoint::EndpointRow,
    hostport::{describe, describe_target, Family, V4, V6},
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

/// One mapping of either family, as `ports list` shows it.
struct Row {
    proto: u8,
    host_port: u16,
    /// `*:8080/tcp`, `[fd00::1]:8080/tcp`.
    host: String,
    /// The address alone (`0.0.0.0`, `::` for every node address).
    host_ip: String,
    target: String,
    pod_ip: String,
    container_port: u16,
    pod_ifindex: u32,
    flags: u16,
}

fn rows<F: Family>(dp: &Datapath, ip: impl Fn(F::Addr) -> IpAddr) -> Result<Vec<Row>> {
    Ok(sluice_maps::hostport::list::<F>(&dp.root)?
        .into_iter()
        .map(|(k, t)| Row {
            proto: k.proto,
            host_port: k.port(),
            host: describe::<F>(&k),
            host_ip: ip(k.host_ip).to_string(),
            target: describe_target::<F>(&t),
            pod_ip: ip(t.pod_ip).to_string(),
            container_port: u16::from_be(t.pod_port),
            pod_ifindex: t.pod_ifindex,
            flags: t.flags,
        })
        .collect())
}

fn list(dp: &Datapath, a: &PortsListArgs) -> Result<()> {
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let pod_ifindexes = selected_ifindexes(&eps, a.pod.as_deref())?;
    let mut all = rows::<V4>(dp, IpAddr::from)?;
    all.extend(rows::<V6>(dp, |a| IpAddr::from(a.0))?);
    let rows: Vec<Row> = all
        .into_iter()
        .filter(|r| {
            pod_ifindexes
                .as_ref()
                .is_none_or(|v| v.contains(&r.pod_ifindex))
        })
        .filter(|r| a.port.is_none_or(|p| r.host_port == p))
        .filter(|r| {
            a.proto
                .as_deref()
                .is_none_or(|p| p == table::proto_name(r.proto))
        })
        .collect();
    let owner = |r: &Row| {
        eps.iter()
            .find(|e| e.endpoint.ifindex == r.pod_ifindex)
            .and_then(|e| e.owner.as_ref())
    };
    let origin = |r: &Row| {
        if r.flags & port_flags::OPERATOR != 0 {
            "operator"
        } else {
            "cni"
        }
    };
    if a.json {
        let v: Vec<Value> = rows
            .iter()
            .map(|r| {
                let o = owner(r);
                json!({
                    "hostIp": r.host_ip,
                    "hostPort": r.host_port,
                    "protocol": table::proto_name(r.proto),
                    "podIp": r.pod_ip,
                    "containerPort": r.container_port,
                    "containerId": o.map(|o| table::text(&o.container_id)),
                    "ifname": o.map(|o| table::text(&o.ifname)),
                    "origin": origin(r),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                table::proto_name(r.proto).to_string(),
                r.host.clone(),
                r.target.clone(),
                owner(r).map_or("-".into(), |o| {
                    format!(
                        "{}/{}",
                        table::text(&o.container_id)
                            .chars()
                            .take(12)
                            .collect::<String>(),
                        table::text(&o.ifname)
                    )
                }),
                origin(r).to_string(),
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

/// An operator mapping's target: the pod (host veth `pod_ifindex`) at `pod_ip`.
fn target<A>(pod_ip: A, a: &PortsAddArgs, pod_ifindex: u32) -> PortTargetOf<A> {
    PortTargetOf {
        pod_ip,
        pod_port: a.container_port.to_be(),
        flags: port_flags::OPERATOR,
        pod_ifindex,
    }
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
    // The mapping's family: that of --host-ip, else of the pod address named.
    let want_v6 = a.host_ip.map(|h| h.is_ipv6());
    let pods: Vec<&EndpointRow> = pod_endpoints(&eps, &a.pod)
        .into_iter()
        .filter(|r| want_v6.is_none_or(|v6| r.ip.is_ipv6() == v6))
        .collect();
    let pod = match pods.as_slice() {
        [one] => *one,
        [] => bail!(
            "--pod {}: no pod with that address or container id on this datapath{}",
            a.pod,
            match want_v6 {
                Some(true) => " with an IPv6 address",
                Some(false) => " with an IPv4 address",
                None => "",
            }
        ),
        many => bail!(
            "--pod {}: {} pod addresses match; give the address (or --host-ip of one family)",
            a.pod,
            many.len()
        ),
    };
    let (proto, ifindex) = (proto_number(&a.proto), pod.endpoint.ifindex);
    // Before the mapping exists, so a DEL of the pod racing this one looks for it.
    sluice_maps::hostport::mark_operator_mappings(&dp.root)?;
    match (pod.ip, a.host_ip) {
        (IpAddr::V4(ip), host) => {
            let host = match host {
                Some(IpAddr::V4(h)) => h.octets(),
                _ => [0; 4],
            };
            let t = target(ip.octets(), a, ifindex);
            add_one::<V4>(dp, PortKey::new(host, a.host_port, proto), t)
        }
        (IpAddr::V6(ip), host) => {
            let host = match host {
                Some(IpAddr::V6(h)) => Addr6(h.octets()),
                _ => Addr6::default(),
            };
            let t = target(Addr6(ip.octets()), a, ifindex);
            add_one::<V6>(dp, PortKey6::new(host, a.host_port, proto), t)
        }
    }
}

/// Publishes one operator mapping with the plugin's rules (a wildcard mapping
/// and one on a node address overlap; the port is taken atomically), so an
/// operator and an ADD never disagree.
fn add_one<F: Family>(
    dp: &Datapath,
    k: PortKeyOf<F::Addr>,
    t: PortTargetOf<F::Addr>,
) -> Result<()> {
    let Some(cookie) = sluice_maps::hostport::node_netns_cookie(&dp.root)? else {
        bail!(
            "this kernel has no SO_NETNS_COOKIE (Linux 5.14) and no ADD with a hostPort recorded the node namespace yet; add a pod with a hostPort first"
        );
    };
    match sluice_maps::hostport::add::<F>(&dp.root, &[(k, t)], cookie) {
        Ok(()) => {}
        Err(sluice_maps::Error::PortConflict {
            port,
            target,
            owner,
        }) => bail!(
            "{} is taken: {port} -> {target} by {owner}",
            describe::<F>(&k)
        ),
        Err(e) => return Err(e.into()),
    }
    println!(
        "added {} -> {}",
        describe::<F>(&k),
        describe_target::<F>(&t)
    );
    Ok(())
}

fn del(dp: &Datapath, a: &PortsDelArgs) -> Result<()> {
    match a.host_ip {
        Some(IpAddr::V6(ip)) => del_key::<V6>(
            dp,
            PortKey6::new(Addr6(ip.octets()), a.host_port, proto_number(&a.proto)),
        ),
        Some(IpAddr::V4(ip)) => del_key::<V4>(dp, key(Some(ip), a.host_port, &a.proto)),
        None => del_key::<V4>(dp, key(None, a.host_port, &a.proto)),
    }
}

fn del_key<F: Family>(dp: &Datapath, k: PortKeyOf<F::Addr>) -> Result<()> {
    let found = sluice_maps::hostport::list::<F>(&dp.root)?
        .into_iter()
        .find(|(o, _)| *o == k);
    let Some((_, t)) = found else {
        bail!("no mapping {}", describe::<F>(&k));
    };
    if !sluice_maps::hostport::remove_key::<F>(&dp.root, &k)? {
        bail!("no mapping {} (removed meanwhile)", describe::<F>(&k));
    }
    println!(
        "deleted {} -> {}",
        describe::<F>(&k),
        describe_target::<F>(&t)
    );
    Ok(())
}
