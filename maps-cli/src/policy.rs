//! `sluicectl policy`: NetworkPolicy in the datapath (`sluice-node policy`).
//! Whether it is on and in which mode, the pods here with their isolation
//! and the policies that select them, each compiled rule with the new flows
//! it let in, the drops by direction, and the policy maps' fill. What the
//! agent compiled comes from its state file (`--state`); the mode, the
//! counters and the maps from the datapath.
use std::{net::IpAddr, path::Path};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sluice_common::{map_sizes, policy_flags};
use sluice_maps::{counters, policy as pmaps};

use crate::{args::PolicyArgs, table, target::Datapath};

/// The counters `sluicectl policy` shows.
const COUNTERS: [&str; 6] = [
    "policy_new",
    "drop_policy_ingress",
    "drop_policy_egress",
    "drop_policy_pending",
    "policy_audit_ingress",
    "policy_audit_egress",
];

pub(crate) fn mode(flags: u32) -> &'static str {
    if flags & policy_flags::ON == 0 {
        "off"
    } else if flags & policy_flags::AUDIT != 0 {
        "audit"
    } else {
        "enforce"
    }
}

/// The agent's state file, `null` when there is none.
fn state(path: &Path) -> Result<Value> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).with_context(|| format!("reading {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Null),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Whether pod report `p` is the one `want` names: one of its addresses,
/// or `namespace/name`.
fn pod_matches(p: &Value, want: &str) -> bool {
    let name = format!(
        "{}/{}",
        p["namespace"].as_str().unwrap_or(""),
        p["name"].as_str().unwrap_or("")
    );
    if name == want {
        return true;
    }
    let Ok(ip) = want.parse::<IpAddr>() else {
        return false;
    };
    p["ips"].as_array().is_some_and(|ips| {
        ips.iter()
            .any(|i| i.as_str().and_then(|s| s.parse().ok()) == Some(ip))
    })
}

pub(crate) fn execute(dp: &Datapath, a: &PolicyArgs) -> Result<()> {
    let flags = pmaps::config(&dp.root)?.map_or(0, |c| c.flags);
    let st = state(&a.state)?;
    let report = &st["report"];
    let mut pods: Vec<Value> = report["pods"].as_array().cloned().unwrap_or_default();
    let mut rules: Vec<Value> = report["rules"].as_array().cloned().unwrap_or_default();
    if let Some(want) = &a.pod {
        pods.retain(|p| pod_matches(p, want));
        if pods.is_empty() {
            anyhow::bail!(
                "--pod {want:?}: no pod here with that address or namespace/name in {}",
                a.state.display()
            );
        }
        let selecting: Vec<String> = pods
            .iter()
            .flat_map(|p| p["policies"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        rules.retain(|r| {
            r["policy"]
                .as_str()
                .is_some_and(|p| selecting.iter().any(|s| s == p))
        });
    }
    let ids: Vec<u16> = rules
        .iter()
        .filter_map(|r| r["id"].as_u64().and_then(|i| u16::try_from(i).ok()))
        .collect();
    let hits = pmaps::hits_of(&dp.root, &ids).unwrap_or_default();
    for r in &mut rules {
        let id = r["id"]
            .as_u64()
            .and_then(|i| u16::try_from(i).ok())
            .unwrap_or(0);
        r["flows"] = json!(hits.get(&id).copied().unwrap_or(0));
    }
    let named = counters::named(&dp.root)?;
    let counts: serde_json::Map<String, Value> = COUNTERS
        .iter()
        .map(|c| {
            let n = named.iter().find(|(k, _)| k == c).map_or(0, |(_, v)| *v);
            ((*c).to_string(), json!(n))
        })
        .collect();
    let in_maps = json!({
        "pods": pmaps::pods(&dp.root).map_or(0, |p| p.len()),
        "podsMax": map_sizes::POL_PODS,
        "ruleEntries": pmaps::rules(&dp.root).map_or(0, |r| r.len()),
        "ruleEntriesMax": map_sizes::POL_RULES,
        "flows": pmaps::flows(&dp.root).map_or(0, |f| f.len()),
        "flowsMax": map_sizes::POL_CT,
    });
    if a.json {
        let out = json!({
            "mode": mode(flags),
            "agentState": if st.is_null() { Value::Null } else { json!(a.state.display().to_string()) },
            "pods": pods,
            "rules": rules,
            "counters": counts,
            "maps": in_maps,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("NetworkPolicy: {}", mode(flags));
    if st.is_null() {
        println!(
            "no agent state at {} (sluice-node policy writes it)",
            a.state.display()
        );
    }
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let list = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    if !pods.is_empty() {
        let rows: Vec<Vec<String>> = pods
            .iter()
            .map(|p| {
                let iso = match (
                    p["ingressIsolated"].as_bool().unwrap_or(false),
                    p["egressIsolated"].as_bool().unwrap_or(false),
                ) {
                    (true, true) => "ingress,egress",
                    (true, false) => "ingress",
                    (false, true) => "egress",
                    (false, false) => "-",
                };
                vec![
                    format!("{}/{}", s(&p["namespace"]), s(&p["name"])),
                    list(&p["ips"]),
                    iso.to_string(),
                    p["set"].to_string(),
                    list(&p["policies"]),
                ]
            })
            .collect();
        print!(
            "{}",
            table::render(&["POD", "ADDRESSES", "ISOLATED", "SET", "POLICIES"], &rows)
        );
    }
    if !rules.is_empty() {
        let rows: Vec<Vec<String>> = rules
            .iter()
            .map(|r| {
                vec![
                    r["id"].to_string(),
                    s(&r["policy"]),
                    format!("{} #{}", s(&r["direction"]), r["index"]),
                    list(&r["peers"]),
                    list(&r["ports"]),
                    r["flows"].to_string(),
                ]
            })
            .collect();
        print!(
            "{}",
            table::render(
                &["RULE", "POLICY", "DIRECTION", "PEERS", "PORTS", "FLOWS"],
                &rows
            )
        );
    }
    let c = |k: &str| counts.get(k).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "new flows let in: {}; dropped: {} ingress, {} egress, {} pending; audit (let through): {} ingress, {} egress",
        c("policy_new"),
        c("drop_policy_ingress"),
        c("drop_policy_egress"),
        c("drop_policy_pending"),
        c("policy_audit_ingress"),
        c("policy_audit_egress"),
    );
    println!(
        "maps: {} of {} pods, {} of {} rule entries, {} of {} flows",
        in_maps["pods"],
        in_maps["podsMax"],
        in_maps["ruleEntries"],
        in_maps["ruleEntriesMax"],
        in_maps["flows"],
        in_maps["flowsMax"]
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{mode, pod_matches};
    use sluice_common::policy_flags;

    #[test]
    fn modes_are_named() {
        assert_eq!(mode(0), "off");
        assert_eq!(mode(policy_flags::ON), "enforce");
        assert_eq!(mode(policy_flags::ON | policy_flags::AUDIT), "audit");
        assert_eq!(mode(policy_flags::AUDIT), "off");
    }

    #[test]
    fn a_pod_is_found_by_address_or_name() {
        let p = json!({"namespace": "x", "name": "a", "ips": ["10.0.0.5", "fd00::5"]});
        assert!(pod_matches(&p, "x/a"));
        assert!(pod_matches(&p, "10.0.0.5"));
        assert!(pod_matches(&p, "fd00::5"));
        assert!(!pod_matches(&p, "x/b"));
        assert!(!pod_matches(&p, "10.0.0.6"));
        assert!(!pod_matches(&p, "nonsense"));
    }
}
