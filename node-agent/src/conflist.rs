//! The network configuration list a node's runtime reads, made from the pod
//! ranges Kubernetes gave the node (`spec.podCIDRs`: at most one per family,
//! IPv4 first on a dual-stack node when the cluster lists IPv4 first).
use ipnetwork::IpNetwork;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// What goes into the conflist besides the fixed parts.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    /// The network name (also the pin root's last component).
    pub(crate) name: String,
    /// The conflist's `cniVersion`.
    pub(crate) cni_version: String,
    /// This node's pod ranges, in the Node's order.
    pub(crate) pod_cidrs: Vec<IpNetwork>,
    /// The whole cluster's pod ranges, if given: never masqueraded. Without
    /// them the plugin's default applies (this node's ranges), and
    /// `sluice-node route-sync` adds the other nodes' ranges as they come.
    pub(crate) cluster_cidrs: Vec<IpNetwork>,
    /// The cluster's Service ranges (`serviceCIDRs`): pods' traffic to them
    /// goes to the node's stack, where kube-proxy translates it. Empty: the
    /// key is left out, and `sluice-node route-sync` writes each ClusterIP.
    pub(crate) service_cidrs: Vec<IpNetwork>,
    pub(crate) masquerade: bool,
    /// More keys of the plugin's entry (`uplink`, `mtu`, `podDevice`, ...),
    /// given by the operator; they win over the defaults here.
    pub(crate) extra: Map<String, Value>,
}

/// Keys of the plugin entry this module owns; `extra` may not set them.
const OWNED: [&str; 2] = ["type", "capabilities"];
/// Keys of the IPAM section this module owns; `extra.ipam` may set the others
/// (`dataDir`, `routes`, ...).
const IPAM_OWNED: [&str; 2] = ["type", "ranges"];

/// Checks that `cidrs` (named `what`) are network addresses, at most one per
/// family when `one_per_family`.
pub(crate) fn check_cidrs(what: &str, cidrs: &[IpNetwork], one_per_family: bool) -> Result<()> {
    for c in cidrs {
        if c.network() != c.ip() {
            return Err(Error::invalid(
                what,
                c,
                format!(
                    "has host bits set (the range is {}/{})",
                    c.network(),
                    c.prefix()
                ),
            ));
        }
    }
    if one_per_family {
        for v6 in [false, true] {
            if cidrs.iter().filter(|c| c.is_ipv6() == v6).count() > 1 {
                return Err(Error::invalid(
                    what,
                    join(cidrs),
                    "lists two ranges of one family (a node has at most one per family)",
                ));
            }
        }
    }
    Ok(())
}

/// Whether two prefixes share an address.
fn overlaps(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

fn join(cidrs: &[IpNetwork]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The conflist for `spec`.
pub(crate) fn render(spec: &Spec) -> Result<Value> {
    if spec.pod_cidrs.is_empty() {
        return Err(Error::invalid(
            "pod CIDRs",
            "",
            "none: the node has no spec.podCIDRs yet (is the controller manager's --allocate-node-cidrs on?) and none were given with --pod-cidrs",
        ));
    }
    check_cidrs("pod CIDRs", &spec.pod_cidrs, true)?;
    check_cidrs("cluster CIDRs", &spec.cluster_cidrs, false)?;
    check_cidrs("service CIDRs", &spec.service_cidrs, false)?;
    // The plugin refuses such a range at every ADD; better said once, here.
    for s in &spec.service_cidrs {
        if let Some(p) = spec.pod_cidrs.iter().find(|p| overlaps(p, s)) {
            return Err(Error::invalid(
                "service CIDRs",
                s,
                format!("overlaps the pod range {p}: traffic between pods would go to kube-proxy"),
            ));
        }
    }
    if let Some(k) = OWNED.iter().find(|k| spec.extra.contains_key(**k)) {
        return Err(Error::invalid(
            "plugin config",
            k,
            "is written by sluice-node; leave it out",
        ));
    }
    let extra_ipam = match spec.extra.get("ipam") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(Error::invalid(
                "plugin config ipam",
                other,
                "is not a JSON object",
            ))
        }
    };
    if let Some(k) = IPAM_OWNED.iter().find(|k| extra_ipam.contains_key(**k)) {
        return Err(Error::invalid(
            "plugin config ipam",
            k,
            "is written by sluice-node from the node's pod CIDRs; leave it out",
        ));
    }
    let ranges: Vec<Value> = spec
        .pod_cidrs
        .iter()
        .map(|c| json!([{ "subnet": c.to_string() }]))
        .collect();
    let routes: Vec<Value> = spec
        .pod_cidrs
        .iter()
        .map(|c| json!({ "dst": if c.is_ipv6() { "::/0" } else { "0.0.0.0/0" } }))
        .collect();
    let mut plugin = json!({
        "type": "sluice",
        "ipMasq": spec.masquerade,
        "ipam": { "type": "sluice", "ranges": ranges, "routes": routes },
        // The runtime fills runtimeConfig from the pod spec: hostPorts and the
        // bandwidth annotations (CNI conventions, "Well-known Capabilities").
        "capabilities": { "portMappings": true, "bandwidth": true },
    });
    if !spec.cluster_cidrs.is_empty() {
        plugin["nonMasqueradeCIDRs"] = json!(spec
            .cluster_cidrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>());
    }
    if !spec.service_cidrs.is_empty() {
        plugin["serviceCIDRs"] = json!(spec
            .service_cidrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>());
    }
    if let Some(p) = plugin.as_object_mut() {
        for (k, v) in spec.extra.iter().filter(|(k, _)| *k != "ipam") {
            p.insert(k.clone(), v.clone());
        }
    }
    if let Some(ipam) = plugin["ipam"].as_object_mut() {
        for (k, v) in extra_ipam {
            ipam.insert(k, v);
        }
    }
    Ok(json!({
        "cniVersion": spec.cni_version,
        "name": spec.name,
        "plugins": [plugin],
    }))
}

/// Whether `conflist` is one [`render`] wrote for network `name` (what
/// uninstall may remove).
pub(crate) fn is_ours(conflist: &Value, name: &str) -> bool {
    conflist["name"] == name
        && conflist["plugins"]
            .as_array()
            .is_some_and(|p| p.len() == 1 && p[0]["type"] == "sluice")
}

/// A spec for network `sluice` with these pod CIDRs and nothing else (tests).
#[cfg(test)]
pub(crate) fn test_spec(pod: &[&str]) -> Spec {
    Spec {
        name: "sluice".into(),
        cni_version: "1.0.0".into(),
        pod_cidrs: pod.iter().map(|c| c.parse().unwrap()).collect(),
        cluster_cidrs: Vec::new(),
        service_cidrs: Vec::new(),
        masquerade: true,
        extra: Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{test_spec as spec, *};

    #[test]
    fn dual_stack_node_gets_both_ranges_and_default_routes() {
        let c = render(&spec(&["10.244.3.0/24", "fd00:10:244:3::/64"])).unwrap();
        assert_eq!(c["name"], "sluice");
        assert_eq!(c["cniVersion"], "1.0.0");
        let p = &c["plugins"][0];
        assert_eq!(p["type"], "sluice");
        assert_eq!(p["ipMasq"], true);
        assert_eq!(
            p["ipam"]["ranges"],
            json!([[{"subnet": "10.244.3.0/24"}], [{"subnet": "fd00:10:244:3::/64"}]])
        );
        assert_eq!(
            p["ipam"]["routes"],
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
        assert_eq!(
            p["capabilities"],
            json!({"portMappings": true, "bandwidth": true})
        );
        assert!(p.get("nonMasqueradeCIDRs").is_none());
        assert!(p.get("serviceCIDRs").is_none());
        assert!(is_ours(&c, "sluice"));
        assert!(!is_ours(&c, "other"));
    }

    #[test]
    fn cluster_ranges_and_extra_keys() {
        let mut s = spec(&["10.244.3.0/24"]);
        s.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        s.extra.insert("uplink".into(), json!("ens3"));
        s.extra.insert("ipMasq".into(), json!(false));
        s.extra
            .insert("ipam".into(), json!({"dataDir": "/var/lib/sluice/ipam"}));
        let c = render(&s).unwrap();
        let p = &c["plugins"][0];
        assert_eq!(p["ipam"]["dataDir"], "/var/lib/sluice/ipam");
        assert_eq!(p["ipam"]["ranges"], json!([[{"subnet": "10.244.3.0/24"}]]));
        assert_eq!(p["nonMasqueradeCIDRs"], json!(["10.244.0.0/16"]));
        assert_eq!(p["uplink"], "ens3");
        assert_eq!(p["ipMasq"], false);
    }

    #[test]
    fn service_ranges_both_families() {
        let mut s = spec(&["10.244.3.0/24", "fd00:10:244:3::/64"]);
        s.service_cidrs = vec![
            "10.96.0.0/12".parse().unwrap(),
            "fd00:10:96::/112".parse().unwrap(),
        ];
        let c = render(&s).unwrap();
        assert_eq!(
            c["plugins"][0]["serviceCIDRs"],
            json!(["10.96.0.0/12", "fd00:10:96::/112"])
        );
        // Host bits, and a range over the pods, are refused by name.
        s.service_cidrs = vec!["10.96.0.1/12".parse().unwrap()];
        let e = render(&s).unwrap_err().to_string();
        assert!(
            e.contains("service CIDRs") && e.contains("10.96.0.1/12"),
            "{e}"
        );
        s.service_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        let e = render(&s).unwrap_err().to_string();
        assert!(
            e.contains("10.244.0.0/16") && e.contains("10.244.3.0/24"),
            "{e}"
        );
        // Inside the never-masqueraded ranges is fine (operators list wide ones).
        s.service_cidrs = vec!["10.96.0.0/12".parse().unwrap()];
        s.cluster_cidrs = vec!["10.0.0.0/8".parse().unwrap()];
        render(&s).unwrap();
    }

    #[test]
    fn refusals_name_the_value() {
        let e = render(&spec(&[])).unwrap_err().to_string();
        assert!(e.contains("podCIDRs"), "{e}");
        let e = render(&spec(&["10.244.3.1/24"])).unwrap_err().to_string();
        assert!(
            e.contains("10.244.3.1/24") && e.contains("10.244.3.0/24"),
            "{e}"
        );
        let e = render(&spec(&["10.1.0.0/24", "10.2.0.0/24"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("10.1.0.0/24,10.2.0.0/24"), "{e}");
        for (k, v) in [
            ("type", json!("bridge")),
            ("ipam", json!({"ranges": []})),
            ("ipam", json!("host-local")),
        ] {
            let mut s = spec(&["10.1.0.0/24"]);
            s.extra.insert(k.into(), v);
            let e = render(&s).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }
}
