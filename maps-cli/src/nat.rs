//! `sluicectl nat list|pods|flush`: the masqueraded flows, IPv4 and IPv6, and
//! how many each pod holds against its share of the table.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{nat_flags, nat_state, Nat6Entry, Nat6Key, NatEntry, NatKey, NatLimits};
use sluice_maps::endpoint::EndpointRow;

use crate::{
    args::{NatCommand, NatFlushArgs, NatListArgs, NatPodsArgs, Target},
    ports::selected_ifindexes,
    table,
    target::Datapath,
};

pub(crate) fn execute(t: &Target, c: &NatCommand) -> Result<()> {
    let dp = Datapath::open(t)?;
    match c {
        NatCommand::List(a) => list(&dp, a),
        NatCommand::Pods(a) => pods(&dp, a),
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

/// The flows one pod (host veth) holds in the masquerade tables, both
/// families, as the datapath counts them (`sl_nat_pods`), with who it is.
pub(crate) struct PodFlows {
    pub ifindex: u32,
    pub flows: u64,
    /// Empty when no endpoint has this host veth (any more).
    pub container_id: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

impl PodFlows {
    /// The pod as `monitor` names it (`<container>/<ifname>`), else its host
    /// veth.
    pub(crate) fn name(&self) -> String {
        if self.container_id.is_empty() {
            format!("ifindex {}", self.ifindex)
        } else {
            format!("{}/{}", table::short_id(&self.container_id), self.ifname)
        }
    }

    pub(crate) fn ips_text(&self) -> String {
        if self.ips.is_empty() {
            return "-".into();
        }
        self.ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The stable JSON shape (`nat pods --json`, `status --json`'s
    /// `masquerade.pressure.topPods`).
    pub(crate) fn json(&self, pod_max_flows: u32) -> Value {
        json!({
            "containerId": (!self.container_id.is_empty()).then_some(&self.container_id),
            "ifname": (!self.container_id.is_empty()).then_some(&self.ifname),
            "podIps": self.ips.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "hostIfindex": self.ifindex,
            "flows": self.flows,
            "podMaxFlows": (pod_max_flows != 0).then_some(pod_max_flows),
            "sharePercent": share_percent(self.flows, pod_max_flows),
        })
    }
}

/// Every pod holding masquerade flows, largest first, named from the
/// endpoints `eps`. Empty on a datapath without the per-pod counts (an older
/// sluice's).
pub(crate) fn pod_flows(dp: &Datapath, eps: &[EndpointRow]) -> Result<Vec<PodFlows>> {
    Ok(sluice_maps::nat_pressure::pod_counts(&dp.root)?
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(ifindex, flows)| {
            let mine: Vec<&EndpointRow> = eps
                .iter()
                .filter(|r| r.endpoint.ifindex == ifindex)
                .collect();
            let owner = mine.iter().find_map(|r| r.owner.as_ref());
            PodFlows {
                ifindex,
                flows,
                container_id: owner
                    .map(|o| table::text(&o.container_id))
                    .unwrap_or_default(),
                ifname: owner.map(|o| table::text(&o.ifname)).unwrap_or_default(),
                ips: mine.iter().map(|r| r.ip).collect(),
            }
        })
        .collect())
}

/// `flows` as a percentage of a pod's share (one decimal); `None` when there
/// is no share (`pod_max_flows` 0: a datapath before `natPodShare`).
pub(crate) fn share_percent(flows: u64, pod_max_flows: u32) -> Option<f64> {
    (pod_max_flows != 0).then(|| (flows as f64 * 1000.0 / f64::from(pod_max_flows)).round() / 10.0)
}

/// The idle timeout, seconds, of a UDP flow that never saw a reply: the
/// shorter `natTimeouts.udpUnreplied` where set, else the UDP timeout.
pub(crate) fn udp_unreplied_secs(masq: &sluice_common::MasqConfig, limits: &NatLimits) -> u64 {
    masq.idle_timeout_ns(nat_state::UDP, 0, limits.udp_unreplied_secs) / 1_000_000_000
}

fn pods(dp: &Datapath, a: &NatPodsArgs) -> Result<()> {
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let only = selected_ifindexes(&eps, a.pod.as_deref())?;
    let limits = sluice_maps::nat_pressure::limits(&dp.root)?;
    let max = limits.pod_max_flows;
    let rows: Vec<PodFlows> = pod_flows(dp, &eps)?
        .into_iter()
        .filter(|p| only.as_ref().is_none_or(|o| o.contains(&p.ifindex)))
        .collect();
    if a.json {
        let v: Vec<Value> = rows.iter().map(|p| p.json(max)).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            vec![
                if p.container_id.is_empty() {
                    "-".into()
                } else {
                    table::short_id(&p.container_id)
                },
                if p.container_id.is_empty() {
                    "-".into()
                } else {
                    p.ifname.clone()
                },
                p.ips_text(),
                p.ifindex.to_string(),
                p.flows.to_string(),
                share_percent(p.flows, max)
                    .map_or_else(|| "-".into(), |s| format!("{s:.1}% of {max}")),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["CONTAINER", "IFNAME", "POD", "IFINDEX", "FLOWS", "SHARE"],
            &body
        )
    );
    if max == 0 {
        println!("(no per-pod share: this datapath predates natPodShare)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_flows_are_a_percentage_of_its_share() {
        assert_eq!(share_percent(16_384, 32_768), Some(50.0));
        assert_eq!(share_percent(1, 3), Some(33.3));
        assert_eq!(share_percent(40, 32), Some(125.0));
        assert_eq!(share_percent(5, 0), None);
    }

    #[test]
    fn unreplied_udp_flows_get_the_shorter_timeout() {
        let masq = sluice_common::MasqConfig {
            udp_secs: 120,
            ..Default::default()
        };
        let lim = |s| NatLimits {
            udp_unreplied_secs: s,
            ..Default::default()
        };
        assert_eq!(udp_unreplied_secs(&masq, &lim(30)), 30);
        // Off (an older datapath, or not set), or longer: the UDP timeout.
        assert_eq!(udp_unreplied_secs(&masq, &lim(0)), 120);
        assert_eq!(udp_unreplied_secs(&masq, &lim(600)), 120);
    }

    #[test]
    fn pods_without_an_endpoint_are_named_by_their_host_veth() {
        let p = PodFlows {
            ifindex: 9,
            flows: 3,
            container_id: String::new(),
            ifname: String::new(),
            ips: Vec::new(),
        };
        assert_eq!(p.name(), "ifindex 9");
        assert_eq!(p.ips_text(), "-");
        let v = p.json(0);
        assert!(
            v["containerId"].is_null() && v["sharePercent"].is_null(),
            "{v}"
        );
        let q = PodFlows {
            container_id: "0123456789abcdef".into(),
            ifname: "eth0".into(),
            ips: vec!["10.88.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            ..p
        };
        assert_eq!(q.name(), "0123456789ab/eth0");
        assert_eq!(q.ips_text(), "10.88.0.2,fd00::2");
        assert_eq!(
            q.json(6),
            json!({
                "containerId": "0123456789abcdef",
                "ifname": "eth0",
                "podIps": ["10.88.0.2", "fd00::2"],
                "hostIfindex": 9,
                "flows": 3,
                "podMaxFlows": 6,
                "sharePercent": 50.0,
            })
        );
    }
}
