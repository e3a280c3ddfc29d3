//! Traffic the node's own stack translates (kube-proxy's Services, any
//! netfilter or IPVS DNAT): the Service ranges (`sl_svc`, `sl_svc6`), whose
//! traffic from pods goes to the stack, and the flows the stack translates
//! (`sl_kflows`), every packet of which takes the stack's path.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{Array, MapData};
use ipnetwork::IpNetwork;
use sluice_common::{maps, KernelFlow, KernelFlowKey};

use crate::{Error, PinRoot, Result};

/// Who put a Service prefix into the tries: the value is a set of these bits.
pub mod service_owner {
    /// The network config (`serviceCIDRs`), set by ADD.
    pub const CONFIG: u8 = 1;
    /// The node agent (`sluice-node`): the cluster's ServiceCIDRs, external
    /// IPs and load balancer IPs.
    pub const AGENT: u8 = 2;
}

/// Makes the Service tries hold exactly `nets` for `owner`
/// ([`service_owner`]); the other owner's prefixes stay. Host bits are
/// cleared (`10.96.0.1/12` is `10.96.0.0/12`).
pub fn set_prefixes(root: &PinRoot, owner: u8, nets: &[IpNetwork]) -> Result<()> {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for n in nets {
        match n {
            IpNetwork::V4(n) => v4.push((u32::from(n.prefix()), n.network().octets())),
            IpNetwork::V6(n) => v6.push((u32::from(n.prefix()), n.network().octets())),
        }
    }
    crate::trie::set_owned(root, &maps::SVC, owner, &v4, |a| Ipv4Addr::from(a).into())?;
    crate::trie::set_owned(root, &maps::SVC6, owner, &v6, |a| Ipv6Addr::from(a).into())
}

/// A fingerprint of the config's Service ranges (FNV-1a of their text, in
/// order), never 0.
pub fn fingerprint(nets: &[IpNetwork]) -> u64 {
    let text: Vec<String> = nets.iter().map(ToString::to_string).collect();
    sluice_common::fnv1a64(text.join(",").as_bytes()) | 1
}

/// The fingerprint of the config's Service ranges the tries hold, if any
/// (none where the pinned datapath predates them: then nothing can be
/// written either, and the caller's write fails with the map's name).
pub fn config_fingerprint(root: &PinRoot) -> Result<Option<u64>> {
    let arr: Array<MapData, u64> = root.typed(&maps::SVC_CONFIG)?;
    let v = arr
        .get(&0, 0)
        .map_err(|e| Error::map("read", maps::SVC_CONFIG.name, e))?;
    Ok((v != 0).then_some(v))
}

/// Records the fingerprint of the config's Service ranges just written.
pub fn set_config_fingerprint(root: &PinRoot, print: u64) -> Result<()> {
    let mut arr: Array<MapData, u64> = root.typed(&maps::SVC_CONFIG)?;
    arr.set(0, print, 0)
        .map_err(|e| Error::map("write", maps::SVC_CONFIG.name, e))
}

/// A Service prefix and who put it there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePrefix {
    pub net: IpNetwork,
    /// [`service_owner`] bits.
    pub owners: u8,
}

/// Every Service prefix, IPv4 first, each family sorted. None where the
/// pinned datapath predates them.
pub fn prefixes(root: &PinRoot) -> Result<Vec<ServicePrefix>> {
    if !root.has(&maps::SVC) {
        return Ok(Vec::new());
    }
    let net = |a: IpAddr, len: u32| {
        u8::try_from(len)
            .ok()
            .and_then(|l| IpNetwork::new(a, l).ok())
            .ok_or_else(|| Error::Check(format!("{a}/{len} in the Service tries is no prefix")))
    };
    let mut out = Vec::new();
    for (len, a, owners) in crate::trie::list::<[u8; 4]>(root, &maps::SVC)? {
        out.push(ServicePrefix {
            net: net(Ipv4Addr::from(a).into(), len)?,
            owners,
        });
    }
    for (len, a, owners) in crate::trie::list::<[u8; 16]>(root, &maps::SVC6)? {
        out.push(ServicePrefix {
            net: net(Ipv6Addr::from(a).into(), len)?,
            owners,
        });
    }
    Ok(out)
}

/// Every flow the stack translates that the datapath remembers, sorted by pod
/// address and port. None where the pinned datapath predates them.
pub fn kernel_flows(root: &PinRoot) -> Result<Vec<(KernelFlowKey, KernelFlow)>> {
    if !root.has(&maps::KFLOWS) {
        return Ok(Vec::new());
    }
    let mut v: Vec<(KernelFlowKey, KernelFlow)> = crate::batch::lookup_all(root, &maps::KFLOWS)?;
    v.sort_by_key(|(k, _)| (k.pod.addr, k.pod_port, k.peer.addr, k.peer_port, k.proto));
    Ok(v)
}

/// The capacity of the kernel flow table (set from `natMaxFlows` when the
/// datapath was loaded).
pub fn kernel_flows_capacity(root: &PinRoot) -> Result<u32> {
    root.capacity(&maps::KFLOWS)
}
