//! The endpoint feature: a pod's owner and counters entry (`sl_ep_info`,
//! with its counter slot), its programs on its host device, and one
//! `sl_endpoints` entry per address, which is what the programs route by.
use std::net::IpAddr;

use sluice_common::{
    endpoint_flags, maps, to_cbuf, Endpoint, EndpointInfo, CONTAINER_ID_LEN, IFNAME_LEN,
    LAYOUT_VERSION,
};
use sluice_maps::{endpoint::Endpoints, PinRoot};

use super::{features, now_unix, pod_links, Attachment, Gone};
use crate::{
    cni::{config::PodAttach, AttachmentId},
    error::{Error, Errors},
    lock::FileLock,
    netlink::Netlink,
};

/// Whether the owner recorded in `sl_ep_info` is `id`. The map keeps the container
/// id cut at `CONTAINER_ID_LEN` bytes, so `id` is cut the same way first.
pub fn info_owned_by(info: &EndpointInfo, id: &AttachmentId) -> bool {
    let cid: [u8; CONTAINER_ID_LEN] = to_cbuf(id.container_id.as_bytes());
    let ifname: [u8; IFNAME_LEN] = to_cbuf(id.ifname.as_bytes());
    info.container_id == cid && info.ifname == ifname
}

/// The same test for an owner read back as an [`AttachmentId`] by
/// [`owners`].
pub fn owned_by(recorded: &AttachmentId, id: &AttachmentId) -> bool {
    let info = EndpointInfo {
        container_id: to_cbuf(recorded.container_id.as_bytes()),
        ifname: to_cbuf(recorded.ifname.as_bytes()),
        ..EndpointInfo::default()
    };
    info_owned_by(&info, id)
}

/// Attaches the endpoint: its counters and owner first (so the programs count
/// from the first packet), the programs on its host device, then its
/// addresses (the limits of [`super::bandwidth`] are written before, so the
/// `LIMITED` mark never points at no bucket).
pub(super) fn attach(root: &PinRoot, pod: &Attachment<'_>) -> Result<(), Error> {
    let mut steps = crate::timing::Steps::start();
    let mut eps = Endpoints::open(root)?;
    let info = EndpointInfo {
        container_id: to_cbuf(pod.id.container_id.as_bytes()),
        ifname: to_cbuf(pod.id.ifname.as_bytes()),
        host_ifname: to_cbuf(pod.host_ifname.as_bytes()),
        netns_ino: pod.netns_ino,
        created_unix: now_unix(),
    };
    eps.insert_interface(pod.host_ifindex, &info)?;
    let slot = {
        // One claim at a time (ADDs hold the pin root shared): the maps
        // directory is the lock.
        let _claim = FileLock::dir_exclusive(&root.maps_dir())?;
        eps.claim_slot(pod.host_ifindex)?
    };
    steps.done("attach: counters and owner");
    if pod.netkit {
        pod_links::attach_pod_netkit(root, &pod.host_ifname, pod.host_ifindex)?;
    } else {
        pod_links::attach_pod(
            root,
            &pod.host_ifname,
            pod.host_ifindex,
            features::pod_attach(pod.attach),
        )?;
    }
    steps.done("attach: programs");
    for ip in &pod.ips {
        let mut flags = if ip.is_ipv6() {
            endpoint_flags::IPV6
        } else {
            0
        };
        if pod.xdp_ready {
            flags |= endpoint_flags::XDP_READY;
        }
        if pod.bandwidth.is_some() {
            flags |= endpoint_flags::LIMITED;
        }
        if let Some(slot) = slot {
            flags = endpoint_flags::with_slot(flags, slot);
        }
        eps.insert(
            *ip,
            Endpoint {
                ifindex: pod.host_ifindex,
                flags,
                pod_mac: pod.pod_mac,
                host_mac: pod.host_mac,
            },
        )?;
    }
    steps.done("attach: endpoints");
    Ok(())
}

/// Removes the addresses of a pod that is going.
pub(super) fn detach(root: &PinRoot, gone: &Gone<'_>, errors: &mut Errors) {
    match Endpoints::open(root) {
        Ok(mut eps) => {
            for ip in &gone.ips {
                errors.note(eps.remove(*ip));
            }
        }
        Err(e) => errors.push(e.into()),
    }
}

/// Removes the owner and counters of a pod that is going: the last step of a
/// DEL, so that one cut short leaves the owner for GC to find.
pub(super) fn forget(root: &PinRoot, gone: &Gone<'_>, errors: &mut Errors) {
    match Endpoints::open(root) {
        Ok(mut eps) => {
            for idx in &gone.ifindexes {
                for e in eps.remove_interface(*idx) {
                    errors.push(e.into());
                }
            }
        }
        Err(e) => errors.push(e.into()),
    }
}

/// CHECK: the programs on the host device (`cls_bpf` filters of the pinned
/// programs, tcx or netkit links), the counters and the addresses.
pub(super) async fn check(
    root: &PinRoot,
    host_nl: &Netlink,
    pod: &Attachment<'_>,
) -> Result<(), Error> {
    match features::pod_attach(pod.attach) {
        _ if pod.netkit => pod_links::check_pod_netkit(root, &pod.host_ifname)?,
        PodAttach::Tc => check_filters(root, host_nl, pod).await?,
        PodAttach::Tcx => pod_links::check_pod_tcx(root, &pod.host_ifname)?,
    }
    let eps = Endpoints::open(root)?;
    if !eps.has_counters(pod.host_ifindex) {
        return Err(Error::check(format!(
            "no counters for {} (ifindex {})",
            &pod.host_ifname, pod.host_ifindex
        )));
    }
    for ip in &pod.ips {
        match eps.get(*ip) {
            Some(e) if e.ifindex == pod.host_ifindex && e.pod_mac == pod.pod_mac => {}
            Some(e) => {
                return Err(Error::check(format!(
                    "endpoint {ip} points at ifindex {} instead of {} ({})",
                    e.ifindex, pod.host_ifindex, pod.host_ifname
                )))
            }
            None => {
                return Err(Error::check(format!(
                    "endpoint {ip} missing from {}",
                    maps::ENDPOINTS.name
                )))
            }
        }
    }
    Ok(())
}

/// The pinned pod programs are the `cls_bpf` filters of the host veth's hooks.
async fn check_filters(
    root: &PinRoot,
    host_nl: &Netlink,
    pod: &Attachment<'_>,
) -> Result<(), Error> {
    for (name, ingress, id) in pod_links::pod_program_ids(root)? {
        let filters = host_nl.bpf_filters(pod.host_ifindex, ingress).await?;
        if !filters.iter().any(|f| f.prog_id == id) {
            return Err(Error::check(format!(
                "{name} (program id {id}) is not attached to {} of {} (filters: {filters:?})",
                if ingress { "ingress" } else { "egress" },
                &pod.host_ifname,
            )));
        }
    }
    Ok(())
}

/// Whether the pinned maps can hold pods of ours: a load of this layout
/// finished there. Not when nothing is pinned, when a first ADD was killed
/// while it pinned the maps one by one (no pod was published yet), or when
/// another layout's datapath is pinned (never ours to read or change).
pub(super) fn held(root: &PinRoot) -> Result<bool, Error> {
    Ok(
        sluice_maps::node::meta(root)?.is_some_and(|m| m.layout_version == LAYOUT_VERSION)
            && root.has(&maps::ENDPOINTS),
    )
}

/// Owners of the endpoint entries: (host ifindex, attachment, host ifname).
pub(super) fn owners(root: &PinRoot) -> Result<Vec<(u32, AttachmentId, String)>, Error> {
    if !held(root)? {
        return Ok(Vec::new());
    }
    let eps = Endpoints::open(root)?;
    let text = sluice_maps::endpoint::text;
    Ok(eps
        .interfaces()
        .into_iter()
        .map(|(idx, info)| {
            (
                idx,
                AttachmentId {
                    container_id: text(&info.container_id),
                    ifname: text(&info.ifname),
                },
                text(&info.host_ifname),
            )
        })
        .collect())
}

/// What of a pod is going: with `pod` (from its complete record: its host
/// veth's index, addresses and mappings), by key, so a DEL costs the same on a
/// node with 20 pods or 1,000; without (a crash before the record had the
/// index, GC of an endpoint without a record), the interface is known by
/// `host_ifindex` or only by the owner entry, and the endpoints are walked.
pub(super) fn gone<'a>(
    root: &PinRoot,
    host_ifindex: Option<u32>,
    id: &AttachmentId,
    pod: Option<&'a Attachment<'a>>,
) -> Result<Gone<'a>, Error> {
    let eps = Endpoints::open(root)?;
    let (ifindexes, ips): (Vec<u32>, Vec<IpAddr>) = if let Some(p) = pod {
        // The record's addresses that still go to its interface.
        (
            vec![p.host_ifindex],
            p.ips
                .iter()
                .copied()
                .filter(|ip| eps.get(*ip).is_some_and(|e| e.ifindex == p.host_ifindex))
                .collect(),
        )
    } else {
        let mut ifindexes: Vec<u32> = host_ifindex.into_iter().collect();
        for (idx, info) in eps.interfaces() {
            if info_owned_by(&info, id) && !ifindexes.contains(&idx) {
                ifindexes.push(idx);
            }
        }
        let ips = eps
            .list()
            .into_iter()
            .filter(|(_, ep)| ifindexes.contains(&ep.ifindex))
            .map(|(ip, _)| ip)
            .collect();
        (ifindexes, ips)
    };
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for ip in &ips {
        match ip {
            IpAddr::V4(a) => v4.push(a.octets()),
            IpAddr::V6(a) => v6.push(a.octets()),
        }
    }
    Ok(Gone {
        ifindexes,
        ips,
        v4,
        v6,
        pod,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: &str, i: &str) -> AttachmentId {
        AttachmentId {
            container_id: c.into(),
            ifname: i.into(),
        }
    }

    #[test]
    fn owners_compare_with_the_cut_container_id() {
        let long = "a".repeat(99);
        let full = id(&long, "eth0");
        let recorded = id(&long[..CONTAINER_ID_LEN], "eth0");
        assert!(owned_by(&recorded, &full));
        assert!(!owned_by(&recorded, &id(&long, "eth1")));
        assert!(!owned_by(&id("abc", "eth0"), &id("abcd", "eth0")));
        assert!(owned_by(&id("abc", "eth0"), &id("abc", "eth0")));
    }
}
