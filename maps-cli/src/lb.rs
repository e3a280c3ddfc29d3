//! `sluicectl services lb`: the Services Sluice translates itself
//! (`sluice-node proxy`): each Service port's frontends, its backends in slot
//! order, whether they are terminating ones (no endpoint was ready), and its
//! translations so far; and whether the socket hooks are attached. A
//! NodePort, external or load balancer IP shows twice: for connections made
//! on the node, and "from outside" (the uplink's, with
//! `externalTrafficPolicy`'s endpoints).
//!
//! The maps hold addresses only: the Service's name, its port's name and
//! each endpoint's state (ready, serving, terminating, its node, whether it
//! is a backend here) come from the agent's state file (`sluice-node proxy
//! --state-file`), trusted for a Service port only while the frontends it
//! gives for the port's id are the ones the maps hold.
use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr, path::Path};

use anyhow::Result;
use serde_json::{json, Value};
use sluice_common::{svc_flags, svc_scope, SvcValue};
use sluice_maps::lb::{addr_port, frontend_text, hooks_attached, LbMaps};

use crate::{args::ServicesLbArgs, table, target::Datapath};

/// One Service port.
pub(crate) struct Row {
    pub(crate) id: u32,
    /// `addr:port/proto`, sorted.
    pub(crate) frontends: Vec<String>,
    /// The frontends are the uplink's (`svc_scope::EXTERNAL`).
    pub(crate) external: bool,
    pub(crate) backends: Vec<SocketAddr>,
    pub(crate) terminating: bool,
    /// `sessionAffinity: ClientIP`'s timeout (seconds); 0: none.
    pub(crate) affinity_secs: u32,
    pub(crate) translations: u64,
    /// What the agent's state file says of it (`about`: the Service, its
    /// port, the endpoints), if it names this Service port.
    pub(crate) about: Option<Value>,
}

impl Row {
    /// `namespace/name`, where the state file names it.
    pub(crate) fn service(&self) -> Option<&str> {
        self.about.as_ref()?["service"].as_str()
    }

    /// The port's name, else its number.
    pub(crate) fn port_name(&self) -> Option<String> {
        let a = self.about.as_ref()?;
        match a["portName"].as_str() {
            Some(n) if !n.is_empty() => Some(n.to_string()),
            _ => a["port"].as_u64().map(|p| p.to_string()),
        }
    }

    /// `namespace/name:port/PROTO`, or `-` where unknown.
    fn label(&self) -> String {
        match (self.service(), self.port_name(), self.about.as_ref()) {
            (Some(s), Some(p), Some(a)) => {
                format!("{s}:{p}/{}", a["protocol"].as_str().unwrap_or("?"))
            }
            _ => "-".to_string(),
        }
    }
}

/// The agent's state file: each Service port's `about`, by id, with the
/// frontends it was written with. Empty where there is none (the agent not
/// run with `--state-file`, or no proxy).
pub(crate) fn state(path: &Path) -> BTreeMap<u32, (Vec<String>, Value)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return BTreeMap::new();
    };
    v["servicePorts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let id = u32::try_from(p["id"].as_u64()?).ok()?;
            let fronts = p["frontends"]
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
            Some((id, (fronts, p["about"].clone())))
        })
        .collect()
}

/// The Service ports in the maps, named where `names` (see [`state`])
/// agrees with the maps.
pub(crate) fn rows(maps: &LbMaps, names: &BTreeMap<u32, (Vec<String>, Value)>) -> Vec<Row> {
    let mut by_id: BTreeMap<u32, (SvcValue, Vec<String>, bool)> = BTreeMap::new();
    for (k, v) in maps.frontends() {
        let e = by_id
            .entry(v.id)
            .or_insert((v, Vec::new(), k.scope == svc_scope::EXTERNAL));
        e.1.push(frontend_text(&k));
    }
    by_id
        .into_iter()
        .map(|(id, (v, mut frontends, external))| {
            frontends.sort();
            let about = names
                .get(&id)
                .filter(|(f, _)| *f == frontends)
                .map(|(_, a)| a.clone());
            Row {
                id,
                about,
                frontends,
                external,
                backends: maps
                    .backends(id, v.count)
                    .iter()
                    .map(|b| {
                        let (ip, port) = addr_port(&b.addr, b.port);
                        SocketAddr::new(ip, port)
                    })
                    .collect(),
                terminating: v.flags & svc_flags::TERMINATING != 0,
                affinity_secs: v.affinity_secs,
                translations: maps.translations(id),
            }
        })
        .collect()
}

/// Whether frontend `f` (`addr:port/proto`) is what `want` names: an
/// address, or an address and port.
fn frontend_matches(f: &str, want: &str) -> bool {
    let Some((sock, _proto)) = f.rsplit_once('/') else {
        return false;
    };
    let Ok(sock) = sock.parse::<SocketAddr>() else {
        return false;
    };
    if let Ok(w) = want.parse::<SocketAddr>() {
        return w == sock;
    }
    want.trim_matches(|c| c == '[' || c == ']')
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip == sock.ip())
}

/// Whether the row is the Service (`namespace/name`) or the Service port
/// (`namespace/name:port`, by name or number) `want` names.
fn service_matches(r: &Row, want: &str) -> bool {
    let Some(svc) = r.service() else {
        return false;
    };
    match want.split_once(':') {
        Some((s, p)) => {
            s == svc
                && (r.port_name().as_deref() == Some(p)
                    || r.about.as_ref().and_then(|a| a["port"].as_u64()) == p.parse::<u64>().ok())
        }
        None => want == svc,
    }
}

pub(crate) fn list(dp: &Datapath, a: &ServicesLbArgs) -> Result<()> {
    let maps = LbMaps::open(&dp.root)?;
    let names = state(&a.state);
    let mut rows = maps.as_ref().map(|m| rows(m, &names)).unwrap_or_default();
    if let Some(want) = &a.service {
        if !want.contains('/') {
            anyhow::bail!("--service {want:?}: not namespace/name nor namespace/name:port");
        }
        if names.is_empty() {
            anyhow::bail!(
                "--service {want:?}: no Service names: {} is missing or empty (run the agent with --state-file, or pass --state)",
                a.state.display()
            );
        }
        rows.retain(|r| service_matches(r, want));
    }
    if let Some(want) = &a.frontend {
        if want.parse::<SocketAddr>().is_err()
            && want
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<std::net::IpAddr>()
                .is_err()
        {
            anyhow::bail!("--frontend {want:?}: not an address nor an address:port");
        }
        rows.retain(|r| r.frontends.iter().any(|f| frontend_matches(f, want)));
    }
    let hooks = hooks_attached(&dp.root);
    if a.json {
        let ports: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": r.id,
                    "service": r.service(),
                    "port": r.port_name(),
                    "protocol": r.about.as_ref().map(|a| a["protocol"].clone()),
                    "endpoints": r.about.as_ref().map(|a| a["endpoints"].clone()),
                    "frontends": r.frontends,
                    "fromOutside": r.external,
                    "backends": r.backends.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "backendsTerminating": r.terminating,
                    "affinitySeconds": r.affinity_secs,
                    "translations": r.translations,
                })
            })
            .collect();
        let out = json!({
            "supported": maps.is_some(),
            "hooksAttached": hooks,
            "servicePorts": ports,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if maps.is_none() {
        println!("Services are not translated by Sluice: the datapath was loaded by a Sluice without Service maps");
        return Ok(());
    }
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut backends = if r.backends.is_empty() && r.external {
                "none (dropped)".to_string()
            } else if r.backends.is_empty() {
                "none (refused)".to_string()
            } else {
                r.backends
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            if r.terminating {
                backends.push_str(" (terminating)");
            }
            if r.affinity_secs > 0 {
                let _ = write!(backends, " (client affinity {} s)", r.affinity_secs);
            }
            vec![
                r.id.to_string(),
                r.label(),
                if r.external {
                    format!("from outside: {}", r.frontends.join(","))
                } else {
                    r.frontends.join(",")
                },
                backends,
                r.translations.to_string(),
            ]
        })
        .collect();
    if !table_rows.is_empty() {
        print!(
            "{}",
            table::render(
                &["ID", "SERVICE", "FRONTENDS", "BACKENDS", "TRANSLATIONS"],
                &table_rows
            )
        );
    }
    // One Service asked for: each endpoint, its state and whether it is a
    // backend here.
    if a.service.is_some() {
        for r in &rows {
            print!("{}", endpoints_text(r));
        }
    }
    println!(
        "{} Service ports translated by Sluice; socket hooks {}",
        rows.len(),
        if hooks {
            "attached (sluice-node proxy)"
        } else {
            "not attached: Services are left to kube-proxy"
        }
    );
    Ok(())
}

/// A Service port's endpoints as the state file gives them, one line each.
fn endpoints_text(r: &Row) -> String {
    let mut out = format!(
        "\n{} ({}, id {}): endpoints\n",
        r.label(),
        if r.external {
            "from outside"
        } else {
            "from the cluster"
        },
        r.id
    );
    let eps: Vec<Vec<String>> = r
        .about
        .as_ref()
        .and_then(|a| a["endpoints"].as_array())
        .into_iter()
        .flatten()
        .map(|e| {
            let c = &e["conditions"];
            let on = |k: &str| c[k].as_bool() == Some(true);
            let state = match (on("ready"), on("serving"), on("terminating")) {
                (true, _, false) => "ready",
                (_, true, true) => "serving, terminating",
                (_, false, true) => "terminating",
                _ => "not ready",
            };
            vec![
                e["address"].as_str().unwrap_or("?").to_string(),
                e["node"].as_str().unwrap_or("-").to_string(),
                state.to_string(),
                if e["backend"].as_bool() == Some(true) {
                    "yes".to_string()
                } else {
                    "no".to_string()
                },
            ]
        })
        .collect();
    if eps.is_empty() {
        out.push_str("  none\n");
    } else {
        out.push_str(&table::render(
            &["ENDPOINT", "NODE", "STATE", "BACKEND HERE"],
            &eps,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{endpoints_text, frontend_matches, service_matches, Row};

    fn row(about: Option<serde_json::Value>) -> Row {
        Row {
            id: 3,
            frontends: vec!["10.96.0.10:53/udp".into()],
            external: false,
            backends: Vec::new(),
            terminating: false,
            affinity_secs: 0,
            translations: 0,
            about,
        }
    }

    #[test]
    fn a_service_is_named_by_namespace_name_and_port_name_or_number() {
        let r = row(Some(
            json!({"service": "kube-system/kube-dns", "portName": "dns",
                                "port": 53, "protocol": "UDP", "endpoints": []}),
        ));
        assert!(service_matches(&r, "kube-system/kube-dns"));
        assert!(service_matches(&r, "kube-system/kube-dns:dns"));
        assert!(service_matches(&r, "kube-system/kube-dns:53"));
        assert!(!service_matches(&r, "kube-system/kube-dns:dns-tcp"));
        assert!(!service_matches(&r, "default/kube-dns"));
        assert_eq!(r.label(), "kube-system/kube-dns:dns/UDP");
        // Unnamed ports go by number; unknown Service ports match nothing.
        let r = row(Some(json!({"service": "a/b", "portName": "", "port": 80,
                                "protocol": "TCP"})));
        assert_eq!(r.label(), "a/b:80/TCP");
        assert!(!service_matches(&row(None), "a/b"));
        assert_eq!(row(None).label(), "-");
    }

    #[test]
    fn endpoints_show_their_state_and_whether_they_are_backends() {
        let cond = |r, s, t| json!({"ready": r, "serving": s, "terminating": t});
        let r = row(Some(
            json!({"service": "a/b", "portName": "dns", "port": 53,
            "protocol": "UDP", "endpoints": [
                {"address": "10.1.0.5:53", "node": "n1", "conditions": cond(true, true, false), "backend": true},
                {"address": "10.1.0.6:53", "node": "n2", "conditions": cond(false, true, true), "backend": false},
                {"address": "10.1.0.7:53", "node": null, "conditions": cond(false, false, false), "backend": false}]}),
        ));
        let text = endpoints_text(&r);
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert!(
            lines.contains(&"10.1.0.5:53 n1 ready yes".to_string()),
            "{text}"
        );
        assert!(
            lines.contains(&"10.1.0.6:53 n2 serving, terminating no".to_string()),
            "{text}"
        );
        assert!(
            lines.contains(&"10.1.0.7:53 - not ready no".to_string()),
            "{text}"
        );
        assert!(
            text.contains("a/b:dns/UDP (from the cluster, id 3)"),
            "{text}"
        );
    }

    #[test]
    fn a_frontend_matches_its_address_or_address_and_port() {
        assert!(frontend_matches("10.96.0.10:53/udp", "10.96.0.10"));
        assert!(frontend_matches("10.96.0.10:53/udp", "10.96.0.10:53"));
        assert!(!frontend_matches("10.96.0.10:53/udp", "10.96.0.10:80"));
        assert!(!frontend_matches("10.96.0.10:53/udp", "10.96.0.1"));
        assert!(frontend_matches("[fd00::10]:53/tcp", "fd00::10"));
        assert!(frontend_matches("[fd00::10]:53/tcp", "[fd00::10]:53"));
        assert!(frontend_matches("[fd00::10]:53/tcp", "[fd00::10]"));
        assert!(!frontend_matches("[fd00::10]:53/tcp", "nonsense"));
    }
}
