//! `sluicectl services list|flows`: how Service traffic is handled. The
//! Service ranges (`sl_svc`, `sl_svc6`) whose traffic from pods the datapath
//! hands to the node's stack, where kube-proxy translates it, who set each
//! (the config's `serviceCIDRs`, the node agent), and the flows the stack
//! translates (`sl_kflows`), every packet of which stays on the stack's path.
//! [`Summary`] is also `status`'s `services` section and `metrics`' gauges.
use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use anyhow::Result;
use serde_json::{json, Value};
use sluice_common::{kernel_flow_origin, maps, EndpointInfo, KernelFlow, KernelFlowKey};
use sluice_maps::{
    endpoint::{key_ip, EndpointRow},
    services::{service_owner, ServicePrefix},
};

use crate::{
    args::{JsonArgs, ServicesCommand, ServicesFlowsArgs, Target},
    table,
    target::Datapath,
};

pub(crate) fn execute(t: &Target, c: &ServicesCommand) -> Result<()> {
    let dp = Datapath::open(t)?;
    match c {
        ServicesCommand::List(a) => list(&dp, a),
        ServicesCommand::Flows(a) => flows(&dp, a),
        ServicesCommand::Lb(a) => crate::lb::list(&dp, a),
    }
}

/// Who set a Service range, from its owner bits: `config`, `agent` or `both`.
fn owner_name(owners: u8) -> &'static str {
    match (
        owners & service_owner::CONFIG != 0,
        owners & service_owner::AGENT != 0,
    ) {
        (true, true) => "both",
        (true, false) => "config",
        (false, true) => "agent",
        (false, false) => "?",
    }
}

/// Ranges a one-line summary names before it says how many more there are
/// (the node agent may add an address per external and load balancer IP).
const RANGES_NAMED: usize = 4;

/// How the datapath handles Service traffic.
pub(crate) struct Summary {
    /// `false` where the datapath was pinned by a Sluice without Service
    /// handling (no `sl_svc`): its pods' traffic to Services is forwarded
    /// like any other.
    pub supported: bool,
    pub ranges: Vec<ServicePrefix>,
    /// Flows in `sl_kflows`.
    pub flows: usize,
    /// `sl_kflows`' capacity (`natMaxFlows`); 0 where there is none.
    pub capacity: u32,
}

impl Summary {
    pub(crate) fn read(dp: &Datapath) -> Result<Self> {
        let has_flows = dp.root.has(&maps::KFLOWS);
        Ok(Self {
            supported: dp.root.has(&maps::SVC) && has_flows,
            ranges: sluice_maps::services::prefixes(&dp.root)?,
            flows: sluice_maps::services::kernel_flows(&dp.root)?.len(),
            capacity: if has_flows {
                sluice_maps::services::kernel_flows_capacity(&dp.root)?
            } else {
                0
            },
        })
    }

    /// Ranges `owner` ([`service_owner`]) set (a range both set counts for each).
    pub(crate) fn ranges_of(&self, owner: u8) -> usize {
        self.ranges.iter().filter(|r| r.owners & owner != 0).count()
    }

    /// What happens to pods' traffic to Services, in one line.
    pub(crate) fn handling(&self) -> String {
        const UNSEEN: &str = "pods' traffic to ClusterIPs is forwarded like any other, and kube-proxy's iptables/nftables rules will not see it";
        if !self.supported {
            return format!(
                "not handled: the datapath was loaded by a Sluice without Service handling; {UNSEEN} (an upgraded plugin adds it at its next ADD or sluicectl datapath reload)"
            );
        }
        if self.ranges.is_empty() {
            return format!(
                "no Service ranges: {UNSEEN}; set serviceCIDRs in the network config or run the node agent (sluice-node)"
            );
        }
        let mut names: Vec<String> = self
            .ranges
            .iter()
            .take(RANGES_NAMED)
            .map(|r| r.net.to_string())
            .collect();
        if self.ranges.len() > RANGES_NAMED {
            names.push(format!("{} more", self.ranges.len() - RANGES_NAMED));
        }
        format!(
            "handed to the node's stack (kube-proxy) for {} Service range{} ({}); flows it translates stay on its path",
            self.ranges.len(),
            if self.ranges.len() == 1 { "" } else { "s" },
            names.join(", ")
        )
    }

    /// `sl_kflows`' fill: "2 of 65536", or "none" without the map.
    fn flows_text(&self) -> String {
        if self.supported {
            format!("{} of {}", self.flows, self.capacity)
        } else {
            "none".to_string()
        }
    }

    /// The stable JSON shape (`services list --json`, `status --json`'s
    /// `services`; documented in the README).
    pub(crate) fn json(&self) -> Value {
        let ranges: Vec<Value> = self
            .ranges
            .iter()
            .map(|r| {
                json!({
                    "cidr": r.net.to_string(),
                    "family": if r.net.is_ipv4() { "ipv4" } else { "ipv6" },
                    "owner": owner_name(r.owners),
                })
            })
            .collect();
        json!({
            "handling": self.handling(),
            "ranges": ranges,
            "kernelFlows": self.flows,
            "kernelFlowsCapacity": if self.supported { json!(self.capacity) } else { Value::Null },
        })
    }

    /// `status`'s text line.
    pub(crate) fn line(&self) -> String {
        let mut s = self.handling();
        if self.supported {
            let _ = write!(s, "; kernel flows {}", self.flows_text());
        }
        s
    }
}

fn list(dp: &Datapath, a: &JsonArgs) -> Result<()> {
    let s = Summary::read(dp)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s.json())?);
        return Ok(());
    }
    if !s.ranges.is_empty() {
        let rows: Vec<Vec<String>> = s
            .ranges
            .iter()
            .map(|r| vec![r.net.to_string(), owner_name(r.owners).to_string()])
            .collect();
        print!("{}", table::render(&["RANGE", "SET-BY"], &rows));
    }
    let how = if s.supported && !s.ranges.is_empty() {
        "handed to the node's stack (kube-proxy) for these ranges".to_string()
    } else {
        s.handling()
    };
    println!("Service traffic: {how}");
    println!(
        "kernel flows: {} (the flows the node's stack translates: sluicectl services flows)",
        s.flows_text()
    );
    Ok(())
}

fn origin_name(o: u8) -> &'static str {
    match o {
        kernel_flow_origin::DELIVERED => "delivered",
        kernel_flow_origin::ROUTED => "routed",
        kernel_flow_origin::CLIENT => "client",
        _ => "?",
    }
}

/// One kernel flow, for printing.
struct Row<'a> {
    key: KernelFlowKey,
    flow: KernelFlow,
    /// The pod's endpoint ([`pod_of`]).
    pod: Option<&'a EndpointRow>,
}

impl Row<'_> {
    fn pod_addr(&self) -> SocketAddr {
        SocketAddr::new(key_ip(&self.key.pod), u16::from_be(self.key.pod_port))
    }

    /// `None` for a pod socket ([`kernel_flow_origin::CLIENT`]), which has no
    /// peer.
    fn peer_addr(&self) -> Option<SocketAddr> {
        (self.flow.origin != kernel_flow_origin::CLIENT)
            .then(|| SocketAddr::new(key_ip(&self.key.peer), u16::from_be(self.key.peer_port)))
    }

    fn owner(&self) -> Option<&EndpointInfo> {
        self.pod.and_then(|p| p.owner.as_ref())
    }

    fn host_ifindex(&self) -> u32 {
        match self.flow.pod_ifindex {
            0 => self.pod.map_or(0, |p| p.endpoint.ifindex),
            i => i,
        }
    }
}

/// The endpoint of a flow's pod: the one on the flow's host device, or where
/// the datapath did not know it, the one with the flow's pod address. A flow
/// whose device is gone (its pod was deleted; the entry ages out of the LRU)
/// has none, even if a new pod has its address.
fn pod_of<'a>(
    eps: &'a [EndpointRow],
    key: &KernelFlowKey,
    flow: &KernelFlow,
) -> Option<&'a EndpointRow> {
    match flow.pod_ifindex {
        0 => eps.iter().find(|e| e.ip == key_ip(&key.pod)),
        i => eps.iter().find(|e| e.endpoint.ifindex == i),
    }
}

fn flows(dp: &Datapath, a: &ServicesFlowsArgs) -> Result<()> {
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    // An address must be a pod's, like --pod everywhere else.
    let selected: Option<Vec<IpAddr>> = match &a.pod {
        Some(p) => Some(
            crate::ports::select_pods(&eps, p)?
                .iter()
                .map(|r| r.ip)
                .collect(),
        ),
        None => None,
    };
    let now = sluice_common::user::monotonic_ns();
    let rows: Vec<Row> = sluice_maps::services::kernel_flows(&dp.root)?
        .into_iter()
        .filter(|(k, _)| {
            selected
                .as_ref()
                .is_none_or(|ips| ips.contains(&key_ip(&k.pod)))
        })
        .filter(|(k, _)| {
            a.proto
                .as_deref()
                .is_none_or(|p| p == table::proto_name(k.proto))
        })
        .map(|(key, flow)| {
            let pod = pod_of(&eps, &key, &flow);
            Row { key, flow, pod }
        })
        .collect();
    let age = |f: &Row| now.saturating_sub(f.flow.created_ns) / 1_000_000_000;
    if a.json {
        let v: Vec<Value> = rows
            .iter()
            .map(|f| {
                let o = f.owner();
                json!({
                    "proto": table::proto_name(f.key.proto),
                    "podIp": f.pod_addr().ip().to_string(),
                    "podPort": f.pod_addr().port(),
                    "peerIp": f.peer_addr().map(|a| a.ip().to_string()),
                    "peerPort": f.peer_addr().map(|a| a.port()),
                    "origin": origin_name(f.flow.origin),
                    "hostIfindex": f.host_ifindex(),
                    "hostIfname": o.map(|o| table::text(&o.host_ifname)),
                    "containerId": o.map(|o| table::text(&o.container_id)),
                    "ifname": o.map(|o| table::text(&o.ifname)),
                    "ageSeconds": age(f),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|f| {
            let o = f.owner();
            vec![
                table::proto_name(f.key.proto).to_string(),
                f.pod_addr().to_string(),
                f.peer_addr()
                    .map_or_else(|| "-".to_string(), |a| a.to_string()),
                origin_name(f.flow.origin).to_string(),
                o.map_or("-".into(), |o| table::text(&o.host_ifname)),
                o.map_or("-".into(), |o| {
                    format!(
                        "{}/{}",
                        table::short_id(&table::text(&o.container_id)),
                        table::text(&o.ifname)
                    )
                }),
                format!("{}s", age(f)),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "PROTO",
                "POD",
                "PEER",
                "ORIGIN",
                "HOST-IF",
                "CONTAINER",
                "AGE"
            ],
            &table_rows
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(ranges: &[(&str, u8)]) -> Summary {
        Summary {
            supported: true,
            ranges: ranges
                .iter()
                .map(|(n, owners)| ServicePrefix {
                    net: n.parse().unwrap(),
                    owners: *owners,
                })
                .collect(),
            flows: 2,
            capacity: 65_536,
        }
    }

    #[test]
    fn a_flow_is_its_devices_pod_or_by_address_when_the_device_is_unknown() {
        let ep = |ip: &str, ifindex| EndpointRow {
            ip: ip.parse().unwrap(),
            endpoint: sluice_common::Endpoint {
                ifindex,
                ..Default::default()
            },
            owner: None,
            stats: sluice_common::EndpointStats::default(),
        };
        let eps = [ep("10.1.0.2", 7), ep("10.1.0.3", 8)];
        let key = |ip: &str| {
            let std::net::IpAddr::V4(v4) = ip.parse().unwrap() else {
                unreachable!()
            };
            KernelFlowKey::new(
                sluice_common::IpKey::v4(v4.octets()),
                sluice_common::IpKey::v4([10, 96, 0, 10]),
                8080_u16.to_be(),
                80_u16.to_be(),
                6,
            )
        };
        let flow = |pod_ifindex| KernelFlow {
            pod_ifindex,
            ..Default::default()
        };
        let found = |k, f| pod_of(&eps, &k, &f).map(|e| e.endpoint.ifindex);
        assert_eq!(found(key("10.1.0.2"), flow(8)), Some(8));
        assert_eq!(found(key("10.1.0.2"), flow(0)), Some(7));
        // The device is gone: not the pod that has the address now.
        assert_eq!(found(key("10.1.0.2"), flow(9)), None);
        assert_eq!(found(key("10.1.0.9"), flow(0)), None);
    }

    #[test]
    fn owners_are_named_config_agent_or_both() {
        assert_eq!(owner_name(service_owner::CONFIG), "config");
        assert_eq!(owner_name(service_owner::AGENT), "agent");
        assert_eq!(
            owner_name(service_owner::CONFIG | service_owner::AGENT),
            "both"
        );
    }

    #[test]
    fn handling_says_what_happens_to_service_traffic() {
        let none = summary(&[]);
        let h = none.handling();
        assert!(h.contains("forwarded like any other"), "{h}");
        assert!(
            h.contains("kube-proxy's iptables/nftables rules will not see it"),
            "{h}"
        );
        assert!(
            h.contains("serviceCIDRs") && h.contains("node agent"),
            "{h}"
        );

        let one = summary(&[("10.96.0.0/12", service_owner::CONFIG)]);
        assert_eq!(
            one.handling(),
            "handed to the node's stack (kube-proxy) for 1 Service range (10.96.0.0/12); flows it translates stay on its path"
        );
        assert_eq!(one.ranges_of(service_owner::CONFIG), 1);
        assert_eq!(one.ranges_of(service_owner::AGENT), 0);
        assert!(one.line().ends_with("; kernel flows 2 of 65536"));

        let many: Vec<(String, u8)> = (1..=6)
            .map(|i| (format!("10.0.0.{i}/32"), service_owner::AGENT))
            .collect();
        let many: Vec<(&str, u8)> = many.iter().map(|(n, o)| (n.as_str(), *o)).collect();
        let h = summary(&many).handling();
        assert!(h.contains("for 6 Service ranges (10.0.0.1/32"), "{h}");
        assert!(h.contains("10.0.0.4/32, 2 more)"), "{h}");

        let old = Summary {
            supported: false,
            ranges: Vec::new(),
            flows: 0,
            capacity: 0,
        };
        assert!(old.handling().starts_with("not handled"));
        assert_eq!(old.json()["kernelFlowsCapacity"], Value::Null);
        assert_eq!(old.line(), old.handling());
    }

    #[test]
    fn the_json_names_each_range_with_its_family_and_owner() {
        let s = summary(&[
            ("10.96.0.0/12", service_owner::CONFIG | service_owner::AGENT),
            ("fd00:96::/112", service_owner::AGENT),
        ]);
        let v = s.json();
        assert_eq!(
            v["ranges"],
            json!([
                {"cidr": "10.96.0.0/12", "family": "ipv4", "owner": "both"},
                {"cidr": "fd00:96::/112", "family": "ipv6", "owner": "agent"},
            ])
        );
        assert_eq!(v["kernelFlows"], 2);
        assert_eq!(v["kernelFlowsCapacity"], 65_536);
    }
}
