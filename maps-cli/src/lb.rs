//! `sluicectl services lb`: the Services Sluice translates itself
//! (`sluice-node proxy`): each Service port's frontends, its backends in slot
//! order, whether they are terminating ones (no endpoint was ready), and its
//! translations so far; and whether the socket hooks are attached. A
//! NodePort, external or load balancer IP shows twice: for connections made
//! on the node, and "from outside" (the uplink's, with
//! `externalTrafficPolicy`'s endpoints).
use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr};

use anyhow::Result;
use serde_json::{json, Value};
use sluice_common::{svc_flags, svc_scope, SvcValue};
use sluice_maps::lb::{addr_port, hooks_attached, LbMaps};

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
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        n => n.to_string(),
    }
}

pub(crate) fn rows(maps: &LbMaps) -> Vec<Row> {
    let mut by_id: BTreeMap<u32, (SvcValue, Vec<String>, bool)> = BTreeMap::new();
    for (k, v) in maps.frontends() {
        let (ip, port) = addr_port(&k.addr, k.port);
        let e = by_id
            .entry(v.id)
            .or_insert((v, Vec::new(), k.scope == svc_scope::EXTERNAL));
        e.1.push(format!(
            "{}/{}",
            SocketAddr::new(ip, port),
            proto_name(k.proto)
        ));
    }
    by_id
        .into_iter()
        .map(|(id, (v, mut frontends, external))| {
            frontends.sort();
            Row {
                id,
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

pub(crate) fn list(dp: &Datapath, a: &ServicesLbArgs) -> Result<()> {
    let maps = LbMaps::open(&dp.root)?;
    let mut rows = maps.as_ref().map(rows).unwrap_or_default();
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
                &["ID", "FRONTENDS", "BACKENDS", "TRANSLATIONS"],
                &table_rows
            )
        );
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

#[cfg(test)]
mod tests {
    use super::frontend_matches;

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
