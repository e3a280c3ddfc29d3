//! What the Service maps should hold, from the cluster's Services and
//! EndpointSlices, as kube-proxy reads them (`pkg/proxy`'s
//! `ServiceChangeTracker` and `EndpointsChangeTracker`):
//!
//! - the Services kube-proxy proxies ([`crate::services::addresses`]: not
//!   headless, not `ExternalName`, not another proxy's); each port of each
//!   is one Service port here, with its ClusterIPs, externalIPs and load
//!   balancer IPs (VIP mode) as frontends, each with the backends of its
//!   family;
//! - its endpoints: those of its EndpointSlices (label
//!   `kubernetes.io/service-name`, same namespace) whose port has the
//!   Service port's name and protocol; the ready ones, or where none is
//!   ready the serving terminating ones (kube-proxy's fallback), or none:
//!   the Service then refuses connections;
//! - `internalTrafficPolicy: Local`: only the endpoints on this node;
//! - `sessionAffinity: ClientIP`: its timeout (default 10800 s, the API's),
//!   the client being the socket's network namespace (a pod, or the node).
//!
//! - NodePorts for connections made on the node (pods and the node's own
//!   processes to a node address or loopback and the node port), with every
//!   endpoint;
//! - for traffic from outside (the uplink), each NodePort, external IP and
//!   load balancer IP again as an external frontend (`svc_scope`), with
//!   `externalTrafficPolicy`'s endpoints: `Local`, this node's only (none:
//!   the packets are dropped); and the health check node ports of the
//!   `Local` load balancers ([`health_checks`]).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::ResourceExt;
use sluice_common::{svc_flags, Backend, SvcKey};
use sluice_maps::lb::{backend, frontend};

use crate::services::{addresses, parse_ip};

/// The label that ties an EndpointSlice to its Service.
pub(crate) const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// One Service port as the maps should hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Port {
    /// Sorted.
    pub(crate) frontends: Vec<SvcKey>,
    /// Sorted by address and port (slot order).
    pub(crate) backends: Vec<Backend>,
    /// `sluice_common::svc_flags`.
    pub(crate) flags: u32,
    /// `sessionAffinity: ClientIP`'s timeout (seconds); 0: none.
    pub(crate) affinity_secs: u32,
    /// What it is, for operators (the agent's state file): not written to
    /// the maps, not compared.
    pub(crate) about: About,
}

/// A Service port as operators name it, and the endpoints it was made of.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct About {
    /// `namespace/name`.
    pub(crate) service: String,
    /// The port's name (empty for a single unnamed port) and number.
    pub(crate) port_name: String,
    pub(crate) port: u16,
    /// `TCP` or `UDP`.
    pub(crate) protocol: String,
    /// 4 or 6.
    pub(crate) family: u8,
    /// The uplink's frontends (`externalTrafficPolicy`'s endpoints).
    pub(crate) from_outside: bool,
    /// Every endpoint of the port's family, with its state and whether it
    /// is a backend here.
    pub(crate) endpoints: Vec<EndpointState>,
}

/// One endpoint of a Service port, as its EndpointSlice says.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EndpointState {
    /// `address:port`.
    pub(crate) address: String,
    pub(crate) node: Option<String>,
    pub(crate) conditions: Conditions,
    /// A backend of this Service port on this node (kube-proxy's choice:
    /// ready ones, else serving terminating ones, the traffic policy's).
    pub(crate) backend: bool,
}

/// An endpoint's conditions, as the EndpointSlice API names them (absent
/// ones as the API defaults them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Conditions {
    pub(crate) ready: bool,
    pub(crate) serving: bool,
    pub(crate) terminating: bool,
}

/// Service ports by name (`namespace/name:port/PROTO`).
pub(crate) type Ports = BTreeMap<String, Port>;

fn proto_number(p: Option<&str>) -> Option<u8> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(6),
        "UDP" => Some(17),
        // Left to the stack (the hooks translate TCP and UDP only).
        _ => None,
    }
}

/// An endpoint of a slice: address, port, and whether it is ready or else
/// serving while terminating.
struct Ep {
    addr: IpAddr,
    port: u16,
    ready: bool,
    serving_terminating: bool,
    local: bool,
    /// As the slice says (the agent's state file).
    node: Option<String>,
    conditions: Conditions,
}

/// The endpoints of `slices` for the Service port named `port_name` over
/// `proto` (host byte order ports).
fn endpoints(slices: &[&EndpointSlice], port_name: &str, proto: &str, node: &str) -> Vec<Ep> {
    let mut out = Vec::new();
    for s in slices {
        let Some(port) = s.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && p.protocol.as_deref().unwrap_or("TCP") == proto
        }) else {
            continue;
        };
        let Some(num) = port
            .port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            let c = e.conditions.as_ref();
            // Absent conditions mean ready and serving (the API's defaults).
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let local = e.node_name.as_deref() == Some(node);
            // kube-proxy uses the first address of an endpoint.
            let Some(addr) = e.addresses.first().and_then(|a| parse_ip(a)) else {
                continue;
            };
            out.push(Ep {
                addr,
                port: num,
                ready: ready && !terminating,
                serving_terminating: serving && terminating,
                local,
                node: e.node_name.clone(),
                conditions: Conditions {
                    ready,
                    serving,
                    terminating,
                },
            });
        }
    }
    out
}

/// Session affinity's timeout: `sessionAffinityConfig.clientIP.timeoutSeconds`
/// (the API's default 10800) with `sessionAffinity: ClientIP`, else 0.
fn affinity(spec: Option<&k8s_openapi::api::core::v1::ServiceSpec>) -> u32 {
    const DEFAULT_SECS: u32 = 10_800;
    let Some(spec) = spec.filter(|s| s.session_affinity.as_deref() == Some("ClientIP")) else {
        return 0;
    };
    spec.session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .and_then(|t| u32::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(DEFAULT_SECS)
}

/// The endpoints kube-proxy sends to: the ready ones, or where none is
/// ready the serving terminating ones (then with
/// [`svc_flags::TERMINATING`]); with `local_only` (a traffic policy
/// `Local`) this node's only, the fallback taken among them. Sorted by
/// address and port, without repeats.
fn usable(eps: &[Ep], local_only: bool) -> (Vec<&Ep>, u32) {
    let mine = |e: &&Ep| !local_only || e.local;
    let mut picked: Vec<&Ep> = eps.iter().filter(mine).filter(|e| e.ready).collect();
    let mut flags = 0;
    if picked.is_empty() {
        picked = eps
            .iter()
            .filter(mine)
            .filter(|e| e.serving_terminating)
            .collect();
        if !picked.is_empty() {
            flags |= svc_flags::TERMINATING;
        }
    }
    let mut seen = BTreeSet::new();
    picked.retain(|e| seen.insert((e.addr, e.port)));
    picked.sort_by_key(|e| (e.addr, e.port));
    (picked, flags)
}

/// The backends of `picked` of one family, in slot order.
fn of_family(picked: &[&Ep], v6: bool) -> Vec<Backend> {
    picked
        .iter()
        .filter(|e| e.addr.is_ipv6() == v6)
        .map(|e| backend(e.addr, e.port))
        .collect()
}

/// The endpoints of `eps` of one family, each marked as a backend where
/// `picked` has it.
fn states(eps: &[Ep], picked: &[&Ep], v6: bool) -> Vec<EndpointState> {
    eps.iter()
        .filter(|e| e.addr.is_ipv6() == v6)
        .map(|e| EndpointState {
            address: std::net::SocketAddr::new(e.addr, e.port).to_string(),
            node: e.node.clone(),
            conditions: e.conditions,
            backend: picked.iter().any(|p| p.addr == e.addr && p.port == e.port),
        })
        .collect()
}

/// A `healthCheckNodePort` of a Service with `externalTrafficPolicy:
/// Local`: what kube-proxy's health check server answers there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HealthCheck {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// This node's ready endpoints of the Service (any port, any family).
    pub(crate) local_endpoints: usize,
}

/// The health check node ports this node answers, by port.
pub(crate) fn health_checks<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &str,
) -> BTreeMap<u16, HealthCheck> {
    let slices: Vec<&EndpointSlice> = slices.into_iter().collect();
    let mut out = BTreeMap::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        if spec.external_traffic_policy.as_deref() != Some("Local")
            || !matches!(spec.type_.as_deref(), Some("LoadBalancer"))
        {
            continue;
        }
        let Some(port) = spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            continue;
        };
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        // kube-proxy counts endpoints, not endpoint ports: one per address.
        let mut local = BTreeSet::new();
        for s in &slices {
            if s.namespace().unwrap_or_default() != ns
                || s.labels().get(SERVICE_NAME) != Some(&name)
            {
                continue;
            }
            for e in s.endpoints.iter().flatten() {
                let c = e.conditions.as_ref();
                let ready = c.and_then(|c| c.ready).unwrap_or(true);
                if ready && e.node_name.as_deref() == Some(node) {
                    if let Some(a) = e.addresses.first() {
                        local.insert(a.clone());
                    }
                }
            }
        }
        out.insert(
            port,
            HealthCheck {
                namespace: ns,
                name,
                local_endpoints: local.len(),
            },
        );
    }
    out
}

/// The Service ports the maps should hold, for node `node`.
pub(crate) fn desired<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &str,
) -> (Ports, Vec<String>) {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices {
        if let Some(name) = s.labels().get(SERVICE_NAME) {
            by_service
                .entry((s.namespace().unwrap_or_default(), name.clone()))
                .or_default()
                .push(s);
        }
    }
    let mut notes = Vec::new();
    let mut ports = Ports::new();
    for svc in services {
        let Some((cluster, external, lb)) = addresses(svc, &mut notes) else {
            continue;
        };
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        let spec = svc.spec.as_ref();
        let local_only = spec.and_then(|s| s.internal_traffic_policy.as_deref()) == Some("Local");
        let external_local =
            spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
        let affinity_secs = affinity(spec);
        let slices = by_service
            .get(&(ns.clone(), name.clone()))
            .map_or(&[][..], Vec::as_slice);
        for sp in spec.and_then(|s| s.ports.as_ref()).into_iter().flatten() {
            let proto_name = sp.protocol.as_deref().unwrap_or("TCP");
            let Some(proto) = proto_number(Some(proto_name)) else {
                continue;
            };
            let Ok(svc_port) = u16::try_from(sp.port) else {
                notes.push(format!(
                    "services: Service {ns}/{name} port {}: out of range; left out",
                    sp.port
                ));
                continue;
            };
            let port_name = sp.name.as_deref().unwrap_or("");
            let node_port = sp
                .node_port
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| {
                    *p != 0
                        && matches!(
                            spec.and_then(|s| s.type_.as_deref()),
                            Some("NodePort" | "LoadBalancer")
                        )
                });
            let eps = endpoints(slices, port_name, proto_name, node);
            // Traffic from inside the cluster: internalTrafficPolicy.
            let (picked, flags) = usable(&eps, local_only);
            // From outside (NodePort, external and load balancer IPs):
            // externalTrafficPolicy.
            let (picked_ext, flags_ext) = usable(&eps, external_local);
            // Whether the port has an endpoint anywhere: from outside, none
            // at all is rejected (kube-proxy's KUBE-EXTERNAL-SERVICES),
            // none on this node under `Local` only dropped.
            let (anywhere, _) = usable(&eps, false);
            for family_v6 in [false, true] {
                let mut fronts: BTreeSet<(IpAddr, u16)> = cluster
                    .iter()
                    .chain(&external)
                    .chain(&lb)
                    .filter(|ip| ip.is_ipv6() == family_v6)
                    .map(|ip| (*ip, svc_port))
                    .collect();
                if fronts.is_empty() {
                    continue;
                }
                // The NodePort, on every node address of the family and on
                // loopback: the unspecified address (the hooks look it up
                // for a destination in `sl_node_addrs`).
                if let Some(np) = node_port {
                    let any = if family_v6 {
                        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                    } else {
                        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
                    };
                    fronts.insert((any, np));
                }
                let mut frontends: Vec<SvcKey> = fronts
                    .iter()
                    .map(|(ip, p)| frontend(*ip, *p, proto))
                    .collect();
                frontends.sort_by_key(|k| (k.addr.addr, k.port, k.proto));
                let backends = of_family(&picked, family_v6);
                let family = if family_v6 { "6" } else { "4" };
                let key = format!("{ns}/{name}:{svc_port}/{proto_name}/v{family}");
                // The same addresses (but the ClusterIPs) for the uplink,
                // with their own endpoints (see `svc_scope`).
                let external: Vec<SvcKey> = frontends
                    .iter()
                    .filter(|k| !cluster.iter().any(|c| frontend(*c, svc_port, proto) == **k))
                    .map(|k| k.external())
                    .collect();
                // No endpoint anywhere: rejected (kube-proxy's `REJECT` in
                // KUBE-SERVICES and KUBE-EXTERNAL-SERVICES); none only on
                // this node (a `Local` policy): dropped, as kube-proxy does.
                let reject = if of_family(&anywhere, family_v6).is_empty() {
                    svc_flags::REJECT
                } else {
                    0
                };
                let about = |from_outside: bool, picked: &[&Ep]| About {
                    service: format!("{ns}/{name}"),
                    port_name: port_name.to_string(),
                    port: svc_port,
                    protocol: proto_name.to_string(),
                    family: if family_v6 { 6 } else { 4 },
                    from_outside,
                    endpoints: states(&eps, picked, family_v6),
                };
                if !external.is_empty() {
                    ports.insert(
                        format!("{key}/external"),
                        Port {
                            frontends: external,
                            backends: of_family(&picked_ext, family_v6),
                            flags: flags_ext | reject,
                            affinity_secs,
                            about: about(true, &picked_ext),
                        },
                    );
                }
                ports.insert(
                    key,
                    Port {
                        frontends,
                        backends,
                        flags: flags | reject,
                        affinity_secs,
                        about: about(false, &picked),
                    },
                );
            }
        }
    }
    (ports, notes)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sluice_maps::lb::addr_port;

    use super::*;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    fn web(extra: &serde_json::Value) -> Service {
        let mut v = json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]}
        });
        if let (Some(spec), Some(more)) = (v["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(more.clone());
        }
        svc(v)
    }

    fn ep(
        addr: &str,
        node: &str,
        ready: bool,
        serving: bool,
        terminating: bool,
    ) -> serde_json::Value {
        json!({"addresses": [addr], "nodeName": node,
               "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
    }

    fn web_slice(family: &str, eps: &[serde_json::Value]) -> EndpointSlice {
        slice(json!({
            "metadata": {"name": format!("web-{family}"), "namespace": "shop",
                         "labels": {SERVICE_NAME: "web"}},
            "addressType": family,
            "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "dns", "port": 5353, "protocol": "UDP"}]
        }))
    }

    fn backends(p: &Port) -> Vec<String> {
        p.backends
            .iter()
            .map(|b| {
                let (a, port) = addr_port(&b.addr, b.port);
                std::net::SocketAddr::new(a, port).to_string()
            })
            .collect()
    }

    /// A port's frontends as (address, port).
    fn fronts(p: &Port) -> Vec<(String, u16)> {
        p.frontends
            .iter()
            .map(|k| {
                let (a, port) = addr_port(&k.addr, k.port);
                (a.to_string(), port)
            })
            .collect()
    }

    #[test]
    fn each_port_and_family_leads_to_the_ready_endpoints_of_its_family() {
        let s = [web(&json!({}))];
        let e = [
            web_slice(
                "IPv4",
                &[
                    ep("10.1.0.5", "n1", true, true, false),
                    ep("10.1.0.4", "n2", true, true, false),
                    ep("10.1.0.6", "n1", false, false, false),
                ],
            ),
            web_slice("IPv6", &[ep("fd00:1::5", "n1", true, true, false)]),
        ];
        let (ports, notes) = desired(&s, &e, "n1");
        assert!(notes.is_empty(), "{notes:?}");
        let http4 = &ports["shop/web:80/TCP/v4"];
        assert_eq!(backends(http4), ["10.1.0.4:8080", "10.1.0.5:8080"]);
        assert_eq!(fronts(http4), [("10.96.0.10".to_string(), 80)]);
        assert_eq!(http4.frontends[0].proto, 6);
        assert_eq!(
            backends(&ports["shop/web:53/UDP/v4"]),
            ["10.1.0.4:5353", "10.1.0.5:5353"]
        );
        assert_eq!(backends(&ports["shop/web:80/TCP/v6"]), ["[fd00:1::5]:8080"]);
        assert_eq!(ports.len(), 4);
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let s = [web(&json!({}))];
        let e = [web_slice(
            "IPv4",
            &[
                ep("10.1.0.5", "n1", false, true, true),
                ep("10.1.0.7", "n1", false, false, true),
            ],
        )];
        let (ports, _) = desired(&s, &e, "n1");
        let p = &ports["shop/web:80/TCP/v4"];
        assert_eq!(backends(p), ["10.1.0.5:8080"]);
        assert_eq!(p.flags, svc_flags::TERMINATING);
        let e = [web_slice(
            "IPv4",
            &[
                ep("10.1.0.5", "n1", false, true, true),
                ep("10.1.0.8", "n1", true, true, false),
            ],
        )];
        let (ports, _) = desired(&s, &e, "n1");
        assert_eq!(backends(&ports["shop/web:80/TCP/v4"]), ["10.1.0.8:8080"]);
    }

    #[test]
    fn no_endpoint_is_a_frontend_with_no_backend_and_local_policy_keeps_this_nodes() {
        let (ports, _) = desired(&[web(&json!({}))], &[], "n1");
        assert!(ports["shop/web:80/TCP/v4"].backends.is_empty());
        // No endpoint anywhere: refused (kube-proxy's REJECT in KUBE-SERVICES).
        assert_ne!(ports["shop/web:80/TCP/v4"].flags & svc_flags::REJECT, 0);
        let s = [web(&json!({"internalTrafficPolicy": "Local"}))];
        let e = [web_slice(
            "IPv4",
            &[
                ep("10.1.0.5", "n1", true, true, false),
                ep("10.2.0.5", "n2", true, true, false),
            ],
        )];
        let (ports, _) = desired(&s, &e, "n1");
        assert_eq!(backends(&ports["shop/web:80/TCP/v4"]), ["10.1.0.5:8080"]);
        assert_eq!(ports["shop/web:80/TCP/v4"].flags & svc_flags::REJECT, 0);
        // A node without one of its own: no backend, and dropped rather than
        // refused (kube-proxy's DROP "has no local endpoints").
        let (ports, _) = desired(&s, &e, "n3");
        assert!(ports["shop/web:80/TCP/v4"].backends.is_empty());
        assert_eq!(ports["shop/web:80/TCP/v4"].flags & svc_flags::REJECT, 0);
    }

    #[test]
    fn headless_external_name_and_sctp_are_left_to_others() {
        let headless = web(&json!({"clusterIP": "None", "clusterIPs": ["None"]}));
        let ext = svc(json!({"metadata": {"name": "x", "namespace": "a"},
                             "spec": {"type": "ExternalName", "externalName": "example.com"}}));
        let sctp = svc(json!({"metadata": {"name": "s", "namespace": "a"},
                              "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 9, "protocol": "SCTP"}]}}));
        let (ports, _) = desired(&[headless, ext, sctp], &[], "n1");
        assert!(ports.is_empty(), "{ports:?}");
    }

    #[test]
    fn client_ip_affinity_has_its_timeout_or_the_apis_default() {
        let (ports, _) = desired(&[web(&json!({}))], &[], "n1");
        assert_eq!(ports["shop/web:80/TCP/v4"].affinity_secs, 0);
        let s = web(&json!({"sessionAffinity": "ClientIP"}));
        let (ports, _) = desired(&[s], &[], "n1");
        assert_eq!(ports["shop/web:80/TCP/v4"].affinity_secs, 10_800);
        let s = web(&json!({"sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}));
        let (ports, _) = desired(&[s], &[], "n1");
        assert_eq!(ports["shop/web:53/UDP/v4"].affinity_secs, 60);
    }

    #[test]
    fn a_node_port_is_a_frontend_on_the_unspecified_address() {
        let s = web(&json!({"type": "NodePort",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}));
        let (ports, _) = desired(&[s], &[], "n1");
        assert_eq!(
            fronts(&ports["shop/web:80/TCP/v4"]),
            [
                ("0.0.0.0".to_string(), 30080),
                ("10.96.0.10".to_string(), 80)
            ]
        );
        let v6 = &ports["shop/web:80/TCP/v6"].frontends;
        assert!(v6.iter().any(|k| k.addr.addr == [0; 16]), "{v6:?}");
        // A ClusterIP Service's stray nodePort is not one.
        let s = web(&json!({"ports": [{"name": "http", "port": 80, "nodePort": 30080}]}));
        let (ports, _) = desired(&[s], &[], "n1");
        assert_eq!(ports["shop/web:80/TCP/v4"].frontends.len(), 1);
    }

    #[test]
    fn external_and_load_balancer_ips_are_frontends_too() {
        let mut s = web(&json!({"externalIPs": ["192.0.2.7"]}));
        s.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}, {"ip": "198.51.100.10", "ipMode": "Proxy"}]}})).unwrap();
        let (ports, _) = desired(&[s], &[], "n1");
        let mut addrs: Vec<String> = fronts(&ports["shop/web:80/TCP/v4"])
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        addrs.sort();
        assert_eq!(addrs, ["10.96.0.10", "192.0.2.7", "198.51.100.9"]);
    }

    #[test]
    fn traffic_from_outside_gets_frontends_of_its_own_with_the_external_policys_endpoints() {
        let lb = |policy: &str| {
            let mut s = web(
                &json!({"type": "LoadBalancer", "externalTrafficPolicy": policy,
                "healthCheckNodePort": 32100,
                "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
            );
            s.status = serde_json::from_value(
                json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}),
            )
            .unwrap();
            s
        };
        let e = [web_slice(
            "IPv4",
            &[
                ep("10.1.0.5", "n1", true, true, false),
                ep("10.1.0.4", "n2", true, true, false),
            ],
        )];
        // Local: the node's own endpoints from outside, every endpoint from
        // inside; the ClusterIP is no frontend from outside.
        let (ports, _) = desired(&[lb("Local")], &e, "n1");
        let ext = &ports["shop/web:80/TCP/v4/external"];
        assert_eq!(backends(ext), ["10.1.0.5:8080"]);
        let mut f = fronts(ext);
        f.sort();
        assert_eq!(
            f,
            [
                ("0.0.0.0".to_string(), 30080),
                ("198.51.100.9".to_string(), 80)
            ]
        );
        assert!(ext
            .frontends
            .iter()
            .all(|k| k.scope == sluice_common::svc_scope::EXTERNAL));
        assert_eq!(ext.flags & svc_flags::REJECT, 0);
        assert_eq!(backends(&ports["shop/web:80/TCP/v4"]).len(), 2);
        // Named for operators, every endpoint listed, the backends marked.
        assert_eq!(ext.about.service, "shop/web");
        assert_eq!((ext.about.port_name.as_str(), ext.about.port), ("http", 80));
        assert!(ext.about.from_outside);
        let used: Vec<(&str, bool)> = ext
            .about
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.backend))
            .collect();
        assert_eq!(used, [("10.1.0.5:8080", true), ("10.1.0.4:8080", false)]);
        assert!(ext.about.endpoints[1].conditions.ready);
        assert_eq!(ext.about.endpoints[1].node.as_deref(), Some("n2"));
        let inside = &ports["shop/web:80/TCP/v4"].about;
        assert!(!inside.from_outside && inside.endpoints.iter().all(|e| e.backend));
        // Local on a node without one: dropped, not rejected (there are
        // endpoints elsewhere); the health check says 0.
        let (ports, _) = desired(&[lb("Local")], &e, "n3");
        let ext = &ports["shop/web:80/TCP/v4/external"];
        assert!(ext.backends.is_empty());
        assert_eq!(ext.flags & svc_flags::REJECT, 0);
        let hc = health_checks(&[lb("Local")], &e, "n3");
        assert_eq!(hc[&32100].local_endpoints, 0);
        assert_eq!(
            health_checks(&[lb("Local")], &e, "n1")[&32100].local_endpoints,
            1
        );
        // Cluster: every endpoint from outside too, and no health check.
        let (ports, _) = desired(&[lb("Cluster")], &e, "n3");
        assert_eq!(backends(&ports["shop/web:80/TCP/v4/external"]).len(), 2);
        assert!(health_checks(&[lb("Cluster")], &e, "n1").is_empty());
        // No endpoint anywhere: rejected from outside, as kube-proxy does.
        let (ports, _) = desired(&[lb("Cluster")], &[], "n1");
        let ext = &ports["shop/web:80/TCP/v4/external"];
        assert_ne!(ext.flags & svc_flags::REJECT, 0);
    }
}
