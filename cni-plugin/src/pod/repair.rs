//! Re-attaching the pods of a lost datapath. After a reboot's empty bpffs, or
//! pins deleted by hand, the next ADD loads a new datapath: the pods attached
//! before keep their veths, addresses, routes and neighbours, but their programs
//! (if still attached) use maps nobody pins any more, and the new maps know
//! nothing of them. The attachment records in the state directory say who they
//! are; each one whose host veth still exists is attached to the new datapath
//! like a new pod (`cls_bpf` filters replaced in place, or attached anew;
//! hostPort mappings; bandwidth limits).
use std::net::IpAddr;

use crate::{
    cni::{config::NetConf, AttachmentId},
    datapath::{Attachment, Datapath, Prepared},
    error::Error,
    interface,
    netlink::Netlink,
    netns::Netns,
    state::{AttachmentRecord, StateStore},
};

/// Re-attaches every recorded attachment but `skip` (the ADD in progress).
/// Returns how many were re-attached; one that fails is reported and skipped,
/// so a broken pod cannot block the others (or the ADD).
pub async fn repair(
    dp: &Datapath,
    prepared: &Prepared,
    conf: &NetConf,
    store: &StateStore,
    host_nl: &Netlink,
    skip: &AttachmentId,
) -> Result<usize, Error> {
    let mut n = 0;
    for rec in store.list()? {
        if !rec.complete || rec.id() == *skip {
            continue;
        }
        match reattach_one(dp, prepared, conf, host_nl, &rec).await {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => eprintln!(
                "sluice: re-attaching {}/{} to the new datapath failed: {}",
                rec.container_id,
                rec.ifname,
                e.details()
            ),
        }
    }
    Ok(n)
}

/// `Ok(false)`: the pod's veth is gone (its DEL or GC will clean up).
async fn reattach_one(
    dp: &Datapath,
    prepared: &Prepared,
    conf: &NetConf,
    host_nl: &Netlink,
    rec: &AttachmentRecord,
) -> Result<bool, Error> {
    let Some(link) = host_nl.link_by_name(&rec.host_ifname).await? else {
        return Ok(false);
    };
    if rec.host_ifindex.is_some_and(|i| i != link.index) {
        // Same name, another interface: not the pod's veth.
        return Ok(false);
    }
    let Some(mut pod) = Attachment::recorded(rec, conf.pod_attach) else {
        return Ok(false);
    };
    // The pod's MAC: the permanent neighbour ADD made for its address.
    let neighbours = host_nl.permanent_neighbours(link.index).await?;
    pod.pod_mac = pod
        .ips
        .iter()
        .find_map(|ip| neighbours.iter().find(|(a, _)| a == ip).map(|(_, m)| *m))
        .ok_or_else(|| {
            Error::datapath(
                "re-attach",
                format!(
                    "no neighbour entry for {:?} on {}",
                    pod.ips, rec.host_ifname
                ),
            )
        })?;
    let pod_ns = rec
        .netns
        .as_deref()
        .map(|p| Netns::open(p.as_ref()))
        .transpose()?;
    // The host end as the kernel shows it now; no pod interface: a repair
    // does not enter pods, so an egress limit is the policer's (the pod's
    // `fq` stays).
    pod.host_ifindex = link.index;
    pod.host_mac = link.mac.unwrap_or_default();
    pod.netkit = link.is_netkit();
    pod.netns_ino = pod_ns.as_ref().map_or(0, Netns::inode);
    // XDP cannot redirect into a netkit device (no `ndo_xdp_xmit`).
    pod.xdp_ready = !pod.netkit
        && pod_ns
            .as_ref()
            .is_some_and(|ns| interface::enable_gro(ns, &rec.ifname).is_ok());
    if !rec.port_mappings.is_empty() {
        let addrs = host_nl
            .local_addrs(pod.ips.iter().any(IpAddr::is_ipv6))
            .await?;
        dp.prepare_host_ports(&addrs, conf.host_port_cgroup.as_deref())?;
    }
    dp.attach(prepared, &pod)?;
    Ok(true)
}
