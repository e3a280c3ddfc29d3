//! `sluicectl status`: the state of a network's datapath at a glance.
use std::fmt::Write as _;

use anyhow::Result;
use serde_json::{json, Value};
use sluice_common::{config_flags, masq_flags, pin_dirs, reason, Masq6Config, MasqConfig};

use crate::{
    args::{JsonArgs, Target},
    nat::{share_percent, PodFlows},
    table,
    target::Datapath,
};

/// Pods `status` lists by the masquerade flows they hold.
const TOP_PODS: usize = 5;

pub(crate) fn execute(t: &Target, a: &JsonArgs) -> Result<()> {
    let dp = Datapath::open(t)?;
    let meta = sluice_maps::node::read_meta(&dp.root)?;
    let cfg = sluice_maps::node::config(&dp.root)?;
    let links = dp.root.pins(pin_dirs::LINKS)?;
    let programs: Vec<Value> = dp
        .root
        .pins(pin_dirs::PROGS)?
        .iter()
        .map(|p| json!({ "name": p, "id": sluice_maps::programs::id(&dp.root, p).ok() }))
        .collect();
    let rows = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let endpoints = rows.len();
    // Pod interfaces: the host veths owning endpoints (attached as cls_bpf
    // filters or tcx links, whichever `podAttach` chose).
    let mut pods: Vec<String> = rows
        .iter()
        .filter_map(|r| r.owner.as_ref().map(|o| table::text(&o.host_ifname)))
        .collect();
    pods.sort();
    pods.dedup();
    let xdp = xdp_mode(cfg.flags);
    let all_counters = sluice_maps::counters::named(&dp.root)?;
    let counters: Vec<(&str, u64)> = all_counters
        .iter()
        .copied()
        .filter(|(_, v)| *v > 0)
        .collect();
    let masq = sluice_maps::nat::config(&dp.root)?;
    let mappings = sluice_maps::hostport::list::<sluice_maps::hostport::V4>(&dp.root)?.len()
        + sluice_maps::hostport::list::<sluice_maps::hostport::V6>(&dp.root)?.len();
    let mut node_addrs: Vec<String> =
        sluice_maps::hostport::node_addrs::<sluice_maps::hostport::V4>(&dp.root)?
            .into_iter()
            .map(|a| std::net::Ipv4Addr::from(a).to_string())
            .collect();
    node_addrs.extend(
        sluice_maps::hostport::node_addrs::<sluice_maps::hostport::V6>(&dp.root)?
            .into_iter()
            .map(|a| std::net::Ipv6Addr::from(a.0).to_string()),
    );
    let hooks: Vec<&String> = links.iter().filter(|l| l.starts_with("cgroup-")).collect();
    let flows = sluice_maps::nat::flows(&dp.root)?.len();
    // (A datapath loaded before IPv6 masquerade has no sl_masq6.)
    let masq6 = if dp.root.has(&sluice_common::maps::MASQ6) {
        sluice_maps::nat::config6(&dp.root)?
    } else {
        sluice_common::Masq6Config::default()
    };
    let flows6 = sluice_maps::nat::flows6(&dp.root)?.len();
    let pressure = NatPressure::read(&dp, &masq, [flows, flows6], &rows, &all_counters)?;
    // Limited pods, and those with an egress limit by how it is enforced (an
    // sl_edt entry counts only while its pod has an egress limit, as in
    // `bandwidth list`).
    let limited = sluice_maps::bandwidth::list(&dp.root)?;
    let modes = sluice_maps::bandwidth::EgressModes::read(&dp.root)?;
    let (edt, policer) = limited.iter().filter(|(_, s)| s.egress.rate != 0).fold(
        (0, 0),
        |(e, p), (i, _)| match modes.of(*i) {
            sluice_maps::bandwidth::EgressMode::Edt => (e + 1, p),
            sluice_maps::bandwidth::EgressMode::Policer => (e, p + 1),
        },
    );
    let sweep = NatSweep::read(&dp, &links)?;
    // Who keeps the node addresses: the node agent while its lease lasts,
    // else each ADD with hostPorts.
    let addrs_lease = sluice_maps::hostport::node_addrs_lease_left_ns(&dp.root)?;
    let addrs_by = if addrs_lease > 0 { "agent" } else { "add" };
    // Service traffic (kube-proxy); a datapath an older Sluice pinned has no
    // Service maps and says so.
    let services = crate::services::Summary::read(&dp)?;
    let v = json!({
        "pinRoot": dp.pin_root.display().to_string(),
        "layoutVersion": meta.layout_version,
        "objectHash": format!("{:016x}", meta.object_hash),
        "loadedUnix": meta.loaded_unix,
        "uplink": if cfg.uplink_ifindex == 0 { Value::Null } else {
            json!({ "ifindex": cfg.uplink_ifindex, "mac": table::mac(cfg.uplink_mac), "xdp": xdp })
        },
        "podMtu": cfg.pod_mtu,
        "programs": programs,
        "links": links,
        "podInterfaces": pods,
        "endpoints": endpoints,
        "masquerade": masq_json(&masq, flows, &masq6, flows6, &pressure),
        "natSweep": sweep.json(),
        "hostPort": {
            "mappings": mappings,
            "nodeAddresses": node_addrs,
            "nodeAddressesBy": addrs_by,
            "nodeAddressesAgentLeaseSeconds": (addrs_lease as f64 / 1e6).round() / 1e3,
            "socketHooks": hooks,
        },
        "bandwidth": {
            "pods": limited.len(),
            "egressEdt": edt,
            "egressPolicer": policer,
        },
        "services": services.json(),
        "counters": counters.iter().map(|(k, v)| ((*k).to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("pin root:   {}", dp.pin_root.display());
    println!(
        "datapath:   object {:016x}, map layout v{}, loaded at {} (unix)",
        meta.object_hash, meta.layout_version, meta.loaded_unix
    );
    if cfg.uplink_ifindex == 0 {
        println!("uplink:     none attached");
    } else {
        println!(
            "uplink:     ifindex {} ({}), XDP {xdp}",
            cfg.uplink_ifindex,
            table::mac(cfg.uplink_mac)
        );
    }
    println!(
        "pods:       {} interfaces, {endpoints} addresses",
        pods.len()
    );
    println!("masquerade: {}", masq_line(&masq, flows));
    println!("masquerade IPv6: {}", masq6_line(&masq6, flows6));
    println!("NAT table:  {}", pressure.table_line());
    if pressure.supported {
        println!("NAT evict:  {}", pressure.evict_line());
        for p in &pressure.top {
            println!("NAT pod:    {}", pod_line(p, pressure.pod_max_flows));
        }
    }
    println!("NAT sweep:  {}", sweep.line());
    println!(
        "hostPort:   {mappings} mappings; node addresses {} ({}); socket hooks {}",
        if node_addrs.is_empty() {
            "-".to_string()
        } else {
            node_addrs.join(", ")
        },
        if addrs_lease > 0 {
            format!(
                "kept by the node agent, lease {:.1} s left",
                addrs_lease as f64 / 1e9
            )
        } else {
            "read by each ADD with hostPorts".to_string()
        },
        if hooks.is_empty() {
            "not attached (the first ADD with portMappings attaches them)".to_string()
        } else {
            format!("attached ({})", hooks.len())
        }
    );
    println!(
        "bandwidth:  {} pods limited; egress: {edt} EDT (fq on the pod's eth0), {policer} policer",
        limited.len()
    );
    println!("services:   {}", services.line());
    for p in &programs {
        println!(
            "program:    {} (id {})",
            p["name"].as_str().unwrap_or_default(),
            p["id"].as_u64().map_or("?".into(), |i| i.to_string())
        );
    }
    for (k, v) in &counters {
        println!("counter:    {k} {v}");
    }
    Ok(())
}

/// Who removes idle NAT flows: the node agent (`sluice-node`, while its lease
/// in `sl_agent` lasts), the in-kernel sweeper (its perf-event link is
/// pinned), or nobody between packets (kernels without the sweeper expire a
/// flow when a packet meets it).
struct NatSweep {
    /// Seconds left of the agent's lease (0: not held).
    lease_secs: f64,
    /// Flows the agent has removed (since the map was made).
    agent_expired: u64,
    kernel: bool,
}

impl NatSweep {
    fn read(dp: &Datapath, links: &[String]) -> Result<Self> {
        let (lease_secs, agent_expired) = if sluice_maps::sweep::supported(&dp.root) {
            (
                sluice_maps::sweep::lease_left_ns(&dp.root)? as f64 / 1e9,
                sluice_maps::sweep::agent_expired(&dp.root)?,
            )
        } else {
            (0.0, 0)
        };
        Ok(Self {
            lease_secs,
            agent_expired,
            kernel: links
                .iter()
                .any(|l| l == sluice_common::prog_names::NAT_SWEEP),
        })
    }

    fn by(&self) -> &'static str {
        if self.lease_secs > 0.0 {
            "agent"
        } else if self.kernel {
            "kernel"
        } else {
            "lazy"
        }
    }

    fn json(&self) -> Value {
        json!({
            "by": self.by(),
            "agentLeaseSeconds": (self.lease_secs * 1000.0).round() / 1000.0,
            "agentExpired": self.agent_expired,
        })
    }

    fn line(&self) -> String {
        let agent = format!("the node agent has removed {} flows", self.agent_expired);
        match self.by() {
            "agent" => format!(
                "by the node agent (sluice-node; lease {:.1} s left); {agent}",
                self.lease_secs
            ),
            "kernel" => format!("by the in-kernel sweeper (a perf event, once a second); {agent}"),
            _ => format!("when a packet meets an idle flow (this kernel has no sweeper); {agent}"),
        }
    }
}

/// How full the masquerade tables are and what keeps them open to every pod:
/// the per-pod share, the unreplied UDP timeout, evictions and the drops of
/// a full table or share, the pods holding most flows.
struct NatPressure {
    /// The datapath has `sl_nat_limits` (an older sluice's has no eviction,
    /// share or per-pod counts).
    supported: bool,
    /// (flows, capacity) of the IPv4 and IPv6 tables.
    tables: [(usize, u32); 2],
    /// A pod's share in flows (0: none).
    pod_max_flows: u32,
    /// Idle timeout of a UDP flow without a reply, seconds.
    udp_unreplied_secs: u64,
    /// Evictions: unreplied, idle, pod share.
    evictions: [u64; 3],
    drop_pod_share: u64,
    drop_map_full: u64,
    top: Vec<PodFlows>,
}

impl NatPressure {
    fn read(
        dp: &Datapath,
        masq: &MasqConfig,
        flows: [usize; 2],
        eps: &[sluice_maps::endpoint::EndpointRow],
        counters: &[(&str, u64)],
    ) -> Result<Self> {
        let cap = |spec: &sluice_common::maps::MapSpec| -> Result<u32> {
            Ok(if dp.root.has(spec) {
                dp.root.capacity(spec)?
            } else {
                0
            })
        };
        let limits = sluice_maps::nat_pressure::limits(&dp.root)?;
        let count = |r: u32| counters.get(r as usize).map_or(0, |(_, n)| *n);
        let mut top = crate::nat::pod_flows(dp, eps)?;
        top.truncate(TOP_PODS);
        Ok(Self {
            supported: dp.root.has(&sluice_common::maps::NAT_LIMITS),
            tables: [
                (flows[0], cap(&sluice_common::maps::NAT_FWD)?),
                (flows[1], cap(&sluice_common::maps::NAT6_FWD)?),
            ],
            pod_max_flows: limits.pod_max_flows,
            udp_unreplied_secs: crate::nat::udp_unreplied_secs(masq, &limits),
            evictions: [
                count(reason::NAT_EVICT_UNREPLIED),
                count(reason::NAT_EVICT_IDLE),
                count(reason::NAT_EVICT_POD_SHARE),
            ],
            drop_pod_share: count(reason::DROP_MASQ_POD_SHARE),
            drop_map_full: count(reason::DROP_MASQ_MAP_FULL),
            top,
        })
    }

    fn json(&self) -> Value {
        let table = |(flows, max): (usize, u32)| json!({ "flows": flows, "max": max });
        let [unreplied, idle, pod_share] = self.evictions;
        json!({
            "ipv4": table(self.tables[0]),
            "ipv6": table(self.tables[1]),
            "podMaxFlows": (self.pod_max_flows != 0).then_some(self.pod_max_flows),
            "udpUnrepliedSeconds": self.udp_unreplied_secs,
            "evictions": {
                "unreplied": unreplied,
                "idle": idle,
                "podShare": pod_share,
                "total": unreplied + idle + pod_share,
            },
            "drops": {
                "podShare": self.drop_pod_share,
                "mapFull": self.drop_map_full,
            },
            "topPods": self.top.iter().map(|p| p.json(self.pod_max_flows)).collect::<Vec<_>>(),
        })
    }

    fn table_line(&self) -> String {
        let fill = |(flows, max): (usize, u32)| {
            format!(
                "{flows}/{max} flows ({:.1}%)",
                flows as f64 * 100.0 / f64::from(max.max(1))
            )
        };
        let mut s = format!(
            "IPv4 {}, IPv6 {}",
            fill(self.tables[0]),
            fill(self.tables[1])
        );
        if !self.supported {
            s.push_str("; no eviction or per-pod share (the datapath predates them)");
            return s;
        }
        match self.pod_max_flows {
            0 => s.push_str("; per-pod share off"),
            n => {
                let _ = write!(s, "; per-pod share {n} flows");
            }
        }
        let _ = write!(
            s,
            "; unreplied UDP flows idle out after {}s",
            self.udp_unreplied_secs
        );
        s
    }

    fn evict_line(&self) -> String {
        let [unreplied, idle, pod_share] = self.evictions;
        format!(
            "{} flows evicted (unreplied {unreplied}, idle {idle}, pod share {pod_share}); \
             new flows dropped: pod at its share {}, table full {}",
            unreplied + idle + pod_share,
            self.drop_pod_share,
            self.drop_map_full
        )
    }
}

/// A pod of the NAT top list: who, its addresses, its flows against its share.
fn pod_line(p: &PodFlows, pod_max_flows: u32) -> String {
    let share = share_percent(p.flows, pod_max_flows)
        .map_or_else(String::new, |s| format!(" ({s:.1}% of its share)"));
    format!(
        "{} {} ifindex {}: {} flows{share}",
        p.name(),
        p.ips_text(),
        p.ifindex,
        p.flows
    )
}

/// The uplink's XDP mode from `sl_config`'s flags: native, generic or off.
pub(crate) fn xdp_mode(flags: u32) -> &'static str {
    if flags & config_flags::XDP_NATIVE != 0 {
        "native"
    } else if flags & config_flags::XDP_GENERIC != 0 {
        "generic"
    } else {
        "off"
    }
}

fn addr(a: [u8; 4]) -> Option<String> {
    (a != [0; 4]).then(|| std::net::Ipv4Addr::from(a).to_string())
}

/// The NAT port ranges as "lo-hi[,lo-hi]" (the second range may be empty).
fn port_ranges(m: &MasqConfig) -> Vec<String> {
    [(m.port_min, m.port_max), (m.port2_min, m.port2_max)]
        .iter()
        .filter(|(lo, hi)| lo <= hi && *hi != 0)
        .map(|(lo, hi)| format!("{lo}-{hi}"))
        .collect()
}

fn masq_json(
    m: &MasqConfig,
    flows: usize,
    m6: &Masq6Config,
    flows6: usize,
    pressure: &NatPressure,
) -> Value {
    let v6 = |a: sluice_common::Addr6| {
        (a != sluice_common::Addr6::default()).then(|| std::net::Ipv6Addr::from(a.0).to_string())
    };
    json!({
        "ipv6": {
            "enabled": m6.flags & masq_flags::ENABLED != 0,
            "address": v6(m6.addr),
            "previousAddress": v6(m6.prev_addr),
            "flows": flows6,
        },
        "enabled": m.flags & masq_flags::ENABLED != 0,
        "address": addr(m.addr),
        "previousAddress": addr(m.prev_addr),
        "ports": port_ranges(m),
        "timeouts": {
            "tcpSyn": m.tcp_syn_secs,
            "tcpEstablished": m.tcp_established_secs,
            "tcpClosing": m.tcp_closing_secs,
            "udp": m.udp_secs,
            "icmp": m.icmp_secs,
        },
        "flows": flows,
        "pressure": pressure.json(),
    })
}

fn masq6_line(m: &Masq6Config, flows: usize) -> String {
    if m.flags & masq_flags::ENABLED == 0 {
        return format!("off ({flows} flows tracked)");
    }
    let mut s = format!(
        "on, as {}, {flows} flows",
        std::net::Ipv6Addr::from(m.addr.0)
    );
    if m.prev_addr != sluice_common::Addr6::default() {
        let _ = write!(
            s,
            ", replies to {} still translated",
            std::net::Ipv6Addr::from(m.prev_addr.0)
        );
    }
    s
}

fn masq_line(m: &MasqConfig, flows: usize) -> String {
    if m.flags & masq_flags::ENABLED == 0 {
        return format!("off ({flows} flows tracked)");
    }
    let mut s = format!(
        "on, as {}, ports {}, {flows} flows",
        addr(m.addr).unwrap_or_else(|| "?".into()),
        port_ranges(m).join(",")
    );
    if let Some(p) = addr(m.prev_addr) {
        let _ = write!(s, ", replies to {p} still translated");
    }
    let _ = write!(
        s,
        "; timeouts tcp syn/est/closing {}/{}/{}s, udp {}s, icmp {}s",
        m.tcp_syn_secs, m.tcp_established_secs, m.tcp_closing_secs, m.udp_secs, m.icmp_secs
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pressure(supported: bool) -> NatPressure {
        NatPressure {
            supported,
            tables: [(512, 1024), (0, 1024)],
            pod_max_flows: if supported { 512 } else { 0 },
            udp_unreplied_secs: if supported { 30 } else { 60 },
            evictions: [10, 2, 3],
            drop_pod_share: 4,
            drop_map_full: 5,
            top: vec![PodFlows {
                ifindex: 7,
                flows: 128,
                container_id: "0123456789abcdef".into(),
                ifname: "eth0".into(),
                ips: vec!["10.88.0.2".parse().unwrap()],
            }],
        }
    }

    #[test]
    fn nat_pressure_says_fill_share_timeout_evictions_and_top_pods() {
        let p = pressure(true);
        assert_eq!(
            p.table_line(),
            "IPv4 512/1024 flows (50.0%), IPv6 0/1024 flows (0.0%); per-pod share 512 flows; \
             unreplied UDP flows idle out after 30s"
        );
        assert_eq!(
            p.evict_line(),
            "15 flows evicted (unreplied 10, idle 2, pod share 3); \
             new flows dropped: pod at its share 4, table full 5"
        );
        assert_eq!(
            pod_line(&p.top[0], p.pod_max_flows),
            "0123456789ab/eth0 10.88.0.2 ifindex 7: 128 flows (25.0% of its share)"
        );
        let v = p.json();
        assert_eq!(v["ipv4"], json!({"flows": 512, "max": 1024}));
        assert_eq!(v["podMaxFlows"], 512);
        assert_eq!(v["udpUnrepliedSeconds"], 30);
        assert_eq!(
            v["evictions"],
            json!({"unreplied": 10, "idle": 2, "podShare": 3, "total": 15})
        );
        assert_eq!(v["drops"], json!({"podShare": 4, "mapFull": 5}));
        assert_eq!(v["topPods"][0]["sharePercent"], 25.0);
    }

    #[test]
    fn an_older_datapath_has_no_share() {
        let p = pressure(false);
        assert!(p
            .table_line()
            .ends_with("no eviction or per-pod share (the datapath predates them)"));
        assert!(p.json()["podMaxFlows"].is_null());
        assert_eq!(
            pod_line(&p.top[0], 0),
            "0123456789ab/eth0 10.88.0.2 ifindex 7: 128 flows"
        );
    }
}
