//! `sluicectl bandwidth list|get|set`: per-pod limits, changed live.
use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{bw_limits, Bucket, BwState};
use sluice_maps::bandwidth::{EgressMode, EgressModes};

use crate::{
    args::{BandwidthCommand, BandwidthGetArgs, BandwidthListArgs, BandwidthSetArgs, Target},
    ports::{select_pods, selected_ifindexes},
    table,
    target::Datapath,
};

pub(crate) fn execute(t: &Target, c: &BandwidthCommand) -> Result<()> {
    let dp = Datapath::open(t)?;
    match c {
        BandwidthCommand::List(a) => list(&dp, a),
        BandwidthCommand::Get(a) => get(&dp, a),
        BandwidthCommand::Set(a) => set(&dp, a),
    }
}

fn bucket_json(b: &Bucket) -> Value {
    match b.bits() {
        None => Value::Null,
        Some((rate, burst)) => json!({
            "rate": rate,
            "burst": burst,
            "depth": b.depth() * 8,
            "passed": b.passed,
            "dropped": b.dropped,
        }),
    }
}

fn bucket_text(b: &Bucket) -> String {
    match b.bits() {
        None => "none".into(),
        Some((rate, burst)) if b.depth() * 8 != burst => format!(
            "{rate} bit/s, burst {burst} bit, depth {} bit",
            b.depth() * 8
        ),
        Some((rate, burst)) => format!("{rate} bit/s, burst {burst} bit"),
    }
}

/// One pod's row: its endpoint rows (addresses), state, and how its egress
/// limit is enforced (`edt`: departure times and fq on the pod's eth0;
/// `policer`: the bucket drops).
fn pod_json(
    eps: &[sluice_maps::endpoint::EndpointRow],
    ifindex: u32,
    s: &BwState,
    mode: EgressMode,
) -> Value {
    let mine: Vec<&sluice_maps::endpoint::EndpointRow> = eps
        .iter()
        .filter(|r| r.endpoint.ifindex == ifindex)
        .collect();
    let owner = mine.iter().find_map(|r| r.owner.as_ref());
    json!({
        "containerId": owner.map(|o| table::text(&o.container_id)),
        "ifname": owner.map(|o| table::text(&o.ifname)),
        "podIps": mine.iter().map(|r| r.ip.to_string()).collect::<Vec<_>>(),
        "hostIfindex": ifindex,
        "egress": bucket_json(&s.egress),
        // How the egress limit is enforced (null without one).
        "egressMode": (s.egress.rate != 0).then(|| mode.as_str()),
        "ingress": bucket_json(&s.ingress),
    })
}

fn list(dp: &Datapath, a: &BandwidthListArgs) -> Result<()> {
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let only = selected_ifindexes(&eps, a.pod.as_deref())?;
    let modes = EgressModes::read(&dp.root)?;
    let rows: Vec<Value> = sluice_maps::bandwidth::list(&dp.root)?
        .iter()
        .filter(|(i, _)| only.as_ref().is_none_or(|o| o.contains(i)))
        .map(|(i, s)| pod_json(&eps, *i, s, modes.of(*i)))
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let dir = |v: &Value| match v {
        Value::Null => "-".to_string(),
        v => format!(
            "{} bit/s ({} dropped)",
            v["rate"].as_u64().unwrap_or(0),
            v["dropped"].as_u64().unwrap_or(0)
        ),
    };
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                table::short_id(r["containerId"].as_str().unwrap_or("-")),
                r["podIps"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
                dir(&r["egress"]),
                r["egressMode"].as_str().unwrap_or("-").to_string(),
                dir(&r["ingress"]),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["CONTAINER", "POD", "EGRESS", "EGRESS-MODE", "INGRESS"],
            &table_rows
        )
    );
    Ok(())
}

/// The host veth ifindex of the pod `pod` names (one pod, however many addresses).
fn pod_ifindex(eps: &[sluice_maps::endpoint::EndpointRow], pod: &str) -> Result<u32> {
    let mut ifs: Vec<u32> = select_pods(eps, pod)?
        .iter()
        .map(|r| r.endpoint.ifindex)
        .collect();
    ifs.dedup();
    match ifs.as_slice() {
        [one] => Ok(*one),
        _ => bail!(
            "{pod:?} matches {} pods; give more of the container id",
            ifs.len()
        ),
    }
}

fn get(dp: &Datapath, a: &BandwidthGetArgs) -> Result<()> {
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let ifindex = pod_ifindex(&eps, &a.pod)?;
    let s = sluice_maps::bandwidth::list(&dp.root)?
        .into_iter()
        .find(|(i, _)| *i == ifindex)
        .map(|(_, s)| s)
        .unwrap_or_default();
    let mode = sluice_maps::bandwidth::egress_mode(&dp.root, ifindex);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&pod_json(&eps, ifindex, &s, mode))?
        );
    } else {
        if s.egress.rate == 0 {
            println!("egress:  {}", bucket_text(&s.egress));
        } else {
            println!("egress:  {} ({})", bucket_text(&s.egress), mode.as_str());
        }
        println!("ingress: {}", bucket_text(&s.ingress));
    }
    Ok(())
}

fn check(flag: &str, v: Option<u64>, max: u64) -> Result<()> {
    if let Some(v) = v {
        if v == 0 || v > max {
            bail!("--{flag} {v}: must be between 1 and {max}");
        }
    }
    Ok(())
}

fn set(dp: &Datapath, a: &BandwidthSetArgs) -> Result<()> {
    check("ingress-rate", a.ingress_rate, bw_limits::MAX_RATE_BITS)?;
    check("egress-rate", a.egress_rate, bw_limits::MAX_RATE_BITS)?;
    check("ingress-burst", a.ingress_burst, bw_limits::MAX_BURST_BITS)?;
    check("egress-burst", a.egress_burst, bw_limits::MAX_BURST_BITS)?;
    let changes_ingress = a.ingress_rate.is_some() || a.clear_ingress;
    let changes_egress = a.egress_rate.is_some() || a.clear_egress;
    if !changes_ingress && !changes_egress {
        bail!(
            "nothing to set: give --ingress-rate, --egress-rate, --clear-ingress or --clear-egress"
        );
    }
    // No ADD runs between the walk of the endpoints here and the marks written
    // back by `sync_limited` (an ADD reusing a DELeted pod's address would
    // otherwise get that pod's endpoint back).
    let _lock = dp.lock_exclusive()?;
    let eps = sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
    let ifindex = pod_ifindex(&eps, &a.pod)?;
    let old = sluice_maps::bandwidth::list(&dp.root)?
        .into_iter()
        .find(|(i, _)| *i == ifindex)
        .map(|(_, s)| s)
        .unwrap_or_default();
    let now = sluice_common::user::monotonic_ns();
    let mut new = old;
    if changes_egress {
        new.egress = Bucket::from_bits(a.egress_rate, a.egress_burst, now);
    }
    if changes_ingress {
        new.ingress = Bucket::from_bits(a.ingress_rate, a.ingress_burst, now);
    }
    let none = new.egress.bits().is_none() && new.ingress.bits().is_none();
    if none {
        sluice_maps::bandwidth::remove(&dp.root, ifindex)?;
    } else {
        sluice_maps::bandwidth::set(&dp.root, ifindex, new)?;
    }
    // The programs look the buckets up only for endpoints marked limited.
    sluice_maps::bandwidth::sync_limited(&dp.root, Some(ifindex))?;
    if changes_egress {
        println!(
            "egress: {} (was {})",
            bucket_text(&new.egress),
            bucket_text(&old.egress)
        );
    }
    if changes_ingress {
        println!(
            "ingress: {} (was {})",
            bucket_text(&new.ingress),
            bucket_text(&old.ingress)
        );
    }
    Ok(())
}
