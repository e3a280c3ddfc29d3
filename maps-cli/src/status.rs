//! `sluicectl status`: the state of a network's datapath at a glance.
use std::fmt::Write as _;

use anyhow::Result;
use serde_json::{json, Value};
use sluice_common::{config_flags, masq_flags, pin_dirs, Masq6Config, MasqConfig};

use crate::{
    args::{JsonArgs, Target},
    table,
    target::Datapath,
};

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
    let counters: Vec<(&str, u64)> = sluice_maps::counters::named(&dp.root)?
        .into_iter()
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
        "masquerade": masq_json(&masq, flows, &masq6, flows6),
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

fn masq_json(m: &MasqConfig, flows: usize, m6: &Masq6Config, flows6: usize) -> Value {
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
