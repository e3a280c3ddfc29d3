//! `sluicectl status`: the state of a network's datapath at a glance.
use anyhow::Result;
use serde_json::{json, Value};
use sluice_common::{config_flags, pin_dirs};

use crate::{
    args::{JsonArgs, Target},
    bpf::Datapath,
    table,
};

pub fn execute(t: &Target, a: &JsonArgs) -> Result<()> {
    let dp = Datapath::open(t)?;
    let meta = dp.meta()?;
    let cfg = dp.config()?;
    let links = dp.pins(pin_dirs::LINKS)?;
    let programs: Vec<Value> = dp
        .pins(pin_dirs::PROGS)?
        .iter()
        .map(|p| json!({ "name": p, "id": dp.program_id(p).ok() }))
        .collect();
    let rows = dp.endpoints()?;
    let endpoints = rows.len();
    // Pod interfaces: the host veths owning endpoints (attached as cls_bpf
    // filters or tcx links, whichever `podAttach` chose).
    let mut pods: Vec<String> = rows
        .iter()
        .filter_map(|r| r.owner.as_ref().map(|o| table::text(&o.host_ifname)))
        .collect();
    pods.sort();
    pods.dedup();
    let xdp = if cfg.flags & config_flags::XDP_NATIVE != 0 {
        "native"
    } else if cfg.flags & config_flags::XDP_GENERIC != 0 {
        "generic"
    } else {
        "off"
    };
    let counters: Vec<(&str, u64)> = dp.counters()?.into_iter().filter(|(_, v)| *v > 0).collect();
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
