//! What the agent reads from the Kubernetes API: Nodes, through kube-rs.
//!
//! The client is configured as kubectl would be: `KUBECONFIG` (or
//! `~/.kube/config`) when present, else the pod's service account (in-cluster:
//! `KUBERNETES_SERVICE_HOST`, the token and CA under
//! `/var/run/secrets/kubernetes.io/serviceaccount`).
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, Config};

use crate::error::{Error, Result};

/// A Node as install and route sync see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeInfo {
    pub(crate) name: String,
    /// `spec.podCIDRs` (or the older single `spec.podCIDR`).
    pub(crate) pod_cidrs: Vec<IpNetwork>,
    /// `status.addresses` of type `InternalIP`, in the API's order.
    pub(crate) internal_ips: Vec<IpAddr>,
}

pub(crate) async fn client() -> Result<Client> {
    let cfg = Config::infer()
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    Client::try_from(cfg).map_err(|e| Error::kube("building the client", e))
}

/// Node `name`, read once.
pub(crate) async fn get_node(client: &Client, name: &str) -> Result<NodeInfo> {
    let api: Api<Node> = Api::all(client.clone());
    let node = api
        .get(name)
        .await
        .map_err(|e| Error::kube(format!("reading Node {name:?}"), e))?;
    node_info(&node)
}

/// The fields we use of `node`; a value that does not parse is an error
/// naming the node, the field and the value.
pub(crate) fn node_info(node: &Node) -> Result<NodeInfo> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut pod_cidrs = Vec::new();
    if let Some(spec) = &node.spec {
        let listed = spec
            .pod_cidrs
            .clone()
            .filter(|l| !l.is_empty())
            .or_else(|| spec.pod_cidr.clone().map(|c| vec![c]))
            .unwrap_or_default();
        for c in listed {
            pod_cidrs.push(c.parse::<IpNetwork>().map_err(|e| {
                Error::invalid(format!("Node {name:?} spec.podCIDRs"), &c, e.to_string())
            })?);
        }
    }
    let mut internal_ips = Vec::new();
    for a in node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
    {
        if a.type_ == "InternalIP" {
            internal_ips.push(a.address.parse::<IpAddr>().map_err(|e| {
                Error::invalid(
                    format!("Node {name:?} status.addresses InternalIP"),
                    &a.address,
                    e.to_string(),
                )
            })?);
        }
    }
    Ok(NodeInfo {
        name,
        pod_cidrs,
        internal_ips,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reads_pod_cidrs_and_internal_ips() {
        let n = node(serde_json::json!({
            "metadata": {"name": "b"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:1::/64"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "b"},
                {"type": "InternalIP", "address": "192.168.0.12"},
                {"type": "ExternalIP", "address": "203.0.113.9"},
                {"type": "InternalIP", "address": "fd01::12"},
            ]},
        }));
        let i = node_info(&n).unwrap();
        assert_eq!(i.name, "b");
        assert_eq!(
            i.pod_cidrs,
            vec![
                "10.244.1.0/24".parse().unwrap(),
                "fd00:1::/64".parse().unwrap()
            ]
        );
        assert_eq!(
            i.internal_ips,
            vec![
                "192.168.0.12".parse::<IpAddr>().unwrap(),
                "fd01::12".parse().unwrap()
            ]
        );
    }

    #[test]
    fn old_single_field_and_missing_parts() {
        let i = node_info(&node(serde_json::json!({
            "metadata": {"name": "c"}, "spec": {"podCIDR": "10.244.2.0/24"},
        })))
        .unwrap();
        assert_eq!(i.pod_cidrs, vec!["10.244.2.0/24".parse().unwrap()]);
        assert!(i.internal_ips.is_empty());
        let i = node_info(&node(serde_json::json!({"metadata": {"name": "d"}}))).unwrap();
        assert!(i.pod_cidrs.is_empty());
    }

    #[test]
    fn bad_values_are_named() {
        let e = node_info(&node(serde_json::json!({
            "metadata": {"name": "e"}, "spec": {"podCIDRs": ["10.244.300.0/24"]},
        })))
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"e\"") && e.contains("10.244.300.0/24"), "{e}");
    }
}
