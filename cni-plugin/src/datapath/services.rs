//! Kubernetes Services on a node that runs kube-proxy, the plugin's side: the
//! Service ranges of the config (`serviceCIDRs`), checked against the pod
//! ranges at ADD and written into the datapath's Service tries. The datapath
//! hands a pod's traffic to them to the node's stack, where kube-proxy
//! translates it, and keeps every packet of a flow the stack translated on the
//! stack's path (the eBPF crate's `kernel_nat`; the maps are
//! `sluice_maps::services`). docs/kubernetes.md says what an operator sets.
use ipnetwork::IpNetwork;
use sluice_maps::{services::service_owner, PinRoot};

use crate::{
    cni::{config::NetConf, result::IpConfig},
    error::Error,
    ipam::Ipam,
};

/// The config's Service ranges, host bits cleared. A range that overlaps this
/// network's pods (here or on the `nodes`) is an error naming both: pods'
/// traffic to their peers would go to the node's stack.
pub fn spec(conf: &NetConf, ipam: &Ipam, ips: &[IpConfig]) -> Result<Vec<IpNetwork>, Error> {
    if conf.service_cidrs.is_empty() {
        return Ok(Vec::new());
    }
    let pods = super::masquerade::pod_ranges(conf, ipam, ips);
    let mut out = Vec::new();
    for (i, c) in conf.service_cidrs.iter().enumerate() {
        let net = IpNetwork::new(c.network(), c.prefix()).unwrap_or(*c);
        if let Some(p) = pods.iter().find(|p| overlap(p, &net)) {
            return Err(Error::config(
                format!("serviceCIDRs[{i}]"),
                c,
                format!(
                    "overlaps the pod range {p}: traffic between pods would be handed to the node's stack as Service traffic"
                ),
            ));
        }
        if !out.contains(&net) {
            out.push(net);
        }
    }
    Ok(out)
}

/// Whether two prefixes share an address.
fn overlap(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

/// The node's part: the config's Service ranges.
pub(super) fn prepare(root: &PinRoot, settings: &super::NodeSettings) -> Result<(), Error> {
    write(root, &settings.services)
}

/// Writes the config's Service ranges (`nets`, from [`spec`]) unless they are
/// what the datapath holds: their fingerprint is kept beside them, so an ADD
/// reads one map value instead of walking tries the node agent may have
/// filled with thousands of addresses.
pub fn write(root: &PinRoot, nets: &[IpNetwork]) -> Result<(), Error> {
    let print = sluice_maps::services::fingerprint(nets);
    if sluice_maps::services::config_fingerprint(root)? == Some(print) {
        return Ok(());
    }
    sluice_maps::services::set_prefixes(root, service_owner::CONFIG, nets)?;
    sluice_maps::services::set_config_fingerprint(root, print)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_overlap_when_one_holds_the_other() {
        assert!(overlap(&n("10.96.0.0/12"), &n("10.100.0.0/16")));
        assert!(overlap(&n("10.100.0.0/16"), &n("10.96.0.0/12")));
        assert!(!overlap(&n("10.96.0.0/12"), &n("10.244.0.0/16")));
        assert!(!overlap(&n("10.96.0.0/12"), &n("fd00::/8")));
        assert!(overlap(&n("fd00:10:96::/112"), &n("fd00::/8")));
    }
}
