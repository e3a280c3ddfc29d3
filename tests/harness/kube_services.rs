//! Sluice's own Services on the [`crate::kube_cluster`] cluster, instead of
//! kube-proxy's rules: on each node the real agent (`sluice-node route-sync
//! --service-proxy`) reads a stand-in API server ([`ApiServer`], one per
//! node, in that node's namespace on 127.0.0.1, as each node's agent reaches
//! its API) serving the very Services and EndpointSlices kube-proxy's rules
//! are written from ([`crate::kube_cluster::Cluster::services`], both
//! families merged into one Service object each, as the API holds them).
//! Each node's socket hooks are on a cgroup of the test's own
//! ([`Cgroup`]): the clients of that node's pods and of the node itself
//! run in it (a process of their own, `sluice-test-client`).
use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{json, Value};

use crate::{
    agent, apiserver::ApiServer, exec::Running, hostport::Cgroup, kube_proxy::Protocol,
    kube_proxy::Service, masq::wait_for, Node, Result,
};

/// The agent's log, in each node's directory.
pub const LOG: &str = "route-sync.log";
/// Longest the agents get to program every Service port.
const FOLLOW: Duration = Duration::from_secs(30);

/// One node's share: its API server, its hooks' cgroup, its agent.
pub struct NodeServices {
    pub api: ApiServer,
    pub cgroup: Cgroup,
    /// `None` once stopped.
    pub agent: Option<Running>,
}

/// Sluice's Services on every node of the cluster, and the client binary
/// that runs in a node's cgroup.
pub struct SluiceServices {
    pub nodes: Vec<NodeServices>,
    /// `sluice-test-client`.
    pub client: PathBuf,
}

/// What a node's agent is started with.
pub struct AgentNode<'a> {
    pub node: &'a Node,
    pub hostname: &'a str,
    pub ip4: std::net::Ipv4Addr,
    pub ip6: std::net::Ipv6Addr,
    pub pod_cidrs: Vec<&'a str>,
}

impl SluiceServices {
    /// Starts each node's API server with `services` (both families) and
    /// its agent.
    pub fn start(nodes: &[AgentNode<'_>], services: &[Service], client: &Path) -> Result<Self> {
        let mut out = Vec::new();
        for n in nodes {
            let api = ApiServer::start(&n.node.netns_path(), "127.0.0.1:0")?;
            api.set_bookmark_interval(Duration::from_millis(300));
            // Only the node's own Node object: the nodes are not on one
            // link (the router routes between them), and route-sync would
            // add routes to the other node's pods through an address that
            // is not a neighbour.
            api.set_node(
                n.hostname,
                &n.pod_cidrs,
                &[&n.ip4.to_string(), &n.ip6.to_string()],
            );
            publish(&api, services);
            let cgroup = Cgroup::new()?;
            let state = n.node.state_dir().display().to_string();
            let agent = agent::start(
                n.node,
                api.port(),
                &[
                    "route-sync",
                    "--node-name",
                    n.hostname,
                    "--service-proxy",
                    "--service-cgroup",
                    &cgroup.display(),
                    "--cni-state-dir",
                    &state,
                    "--node-ip",
                    &n.ip4.to_string(),
                ],
                LOG,
            )?;
            out.push(NodeServices {
                api,
                cgroup,
                agent: Some(agent),
            });
        }
        Ok(Self {
            nodes: out,
            client: client.to_path_buf(),
        })
    }

    /// Waits until every node's datapath holds the `want` Service ports
    /// (`sluicectl services lb --json`: `servicePorts`).
    pub fn wait_programmed(&self, nodes: &[&Node], want: usize) -> Result<()> {
        for (i, node) in nodes.iter().enumerate() {
            let mut last = Value::Null;
            let ok = wait_for(FOLLOW, || {
                last = node
                    .sluicectl_json(&["services", "lb", "--json"])
                    .unwrap_or(Value::Null);
                last["servicePorts"].as_array().map_or(0, Vec::len) >= want
            });
            if !ok {
                return Err(crate::err!(
                    "node {}: the agent did not program {want} Service ports within {FOLLOW:?}: {last:#}\n{}",
                    i + 1,
                    agent::log_of(node, LOG)
                ));
            }
        }
        Ok(())
    }

    /// Stops each agent (SIGTERM): each must exit cleanly.
    pub fn stop(&mut self, nodes: &[&Node]) -> Result<()> {
        let mut errs = Vec::new();
        for (s, node) in self.nodes.iter_mut().zip(nodes) {
            if let Some(a) = s.agent.take() {
                if let Err(e) = agent::stop(a, node, LOG) {
                    errs.push(e.to_string());
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(crate::err!("{}", errs.join("\n")))
        }
    }
}

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    }
}

/// The Service ports `services` make in the datapath: one per port and
/// family, and one more from outside where it has a NodePort, external or
/// load balancer IPs (what `sluicectl services lb` lists).
pub fn service_ports(services: &[Service]) -> usize {
    services
        .iter()
        .map(|s| {
            let outside = !s.external_ips.is_empty() || !s.load_balancer_ips.is_empty();
            s.ports
                .iter()
                .map(|p| 1 + usize::from(outside || p.node_port.is_some()))
                .sum::<usize>()
        })
        .sum()
}

/// Writes `services` (kube-proxy's view, one object per family) to `api` as
/// the API holds them: one Service per name with the ClusterIPs of both
/// families, and an EndpointSlice per family.
pub fn publish(api: &ApiServer, services: &[Service]) {
    let mut by_name: BTreeMap<(&str, &str), Vec<&Service>> = BTreeMap::new();
    for s in services {
        by_name
            .entry((s.namespace.as_str(), s.name.as_str()))
            .or_default()
            .push(s);
    }
    for ((ns, name), fams) in by_name {
        let first = fams[0];
        let node_ports = first.ports.iter().any(|p| p.node_port.is_some());
        let kind = if !first.load_balancer_ips.is_empty() {
            "LoadBalancer"
        } else if node_ports {
            "NodePort"
        } else {
            "ClusterIP"
        };
        let ips: Vec<String> = fams.iter().map(|s| s.cluster_ip.to_string()).collect();
        let families: Vec<&str> = fams
            .iter()
            .map(|s| {
                if s.cluster_ip.is_ipv6() {
                    "IPv6"
                } else {
                    "IPv4"
                }
            })
            .collect();
        let ports: Vec<Value> = first
            .ports
            .iter()
            .map(|p| {
                let mut v = json!({"port": p.port, "protocol": protocol(p.protocol),
                                   "targetPort": p.target_port});
                if !p.name.is_empty() {
                    v["name"] = json!(p.name);
                }
                if let Some(np) = p.node_port {
                    v["nodePort"] = json!(np);
                }
                v
            })
            .collect();
        let mut spec = json!({
            "type": kind,
            "clusterIP": ips[0],
            "clusterIPs": ips,
            "ipFamilies": families,
            "ipFamilyPolicy": if fams.len() > 1 { "PreferDualStack" } else { "SingleStack" },
            "ports": ports,
            "internalTrafficPolicy": if first.internal_traffic_local { "Local" } else { "Cluster" },
            "sessionAffinity": if first.session_affinity_seconds.is_some() { "ClientIP" } else { "None" },
        });
        if kind != "ClusterIP" || !first.external_ips.is_empty() {
            spec["externalTrafficPolicy"] = json!(if first.external_traffic_local {
                "Local"
            } else {
                "Cluster"
            });
        }
        if let Some(t) = first.session_affinity_seconds {
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
        }
        let externals: Vec<String> = fams
            .iter()
            .flat_map(|s| s.external_ips.iter().map(IpAddr::to_string))
            .collect();
        if !externals.is_empty() {
            spec["externalIPs"] = json!(externals);
        }
        if let Some(h) = first.health_check_node_port {
            spec["healthCheckNodePort"] = json!(h);
        }
        if !first.load_balancer_source_ranges.is_empty() {
            spec["loadBalancerSourceRanges"] = json!(first.load_balancer_source_ranges);
        }
        let ingress: Vec<Value> = fams
            .iter()
            .flat_map(|s| s.load_balancer_ips.iter())
            .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"}))
            .collect();
        let status = if ingress.is_empty() {
            json!({})
        } else {
            json!({"loadBalancer": {"ingress": ingress}})
        };
        api.set_service(ns, name, &spec, &status);
        for s in fams {
            let (family, suffix) = if s.cluster_ip.is_ipv6() {
                ("IPv6", "v6")
            } else {
                ("IPv4", "v4")
            };
            let endpoints: Vec<Value> = s
                .endpoints
                .iter()
                .map(|e| {
                    let mut v = json!({"addresses": [e.ip.to_string()],
                        "conditions": {"ready": e.ready, "serving": e.ready, "terminating": false}});
                    if !e.node.is_empty() {
                        v["nodeName"] = json!(e.node);
                    }
                    v
                })
                .collect();
            let ports: Vec<Value> = s
                .ports
                .iter()
                .map(|p| {
                    json!({"name": p.name, "port": p.target_port, "protocol": protocol(p.protocol)})
                })
                .collect();
            api.set_endpoint_slice(
                ns,
                &format!("{name}-{suffix}"),
                name,
                family,
                &json!(endpoints),
                &json!(ports),
            );
        }
    }
}
