//! CHECK of what Sluice keeps for a pod: its record, the host end of its pair
//! (the peer of the pod's interface), and the datapath's part (programs, map
//! entries, limits, hostPorts), checked on the [`Attachment`] CHECK finds.
use crate::{
    cni::{config::NetConf, AttachmentId},
    datapath::{Attachment, Datapath},
    error::Error,
    netlink::{LinkInfo, Netlink},
    netns::Netns,
    state::{host_veth_name, StateStore},
};

/// Checks the pod whose own interface is `pod_link` in `pod_ns`; returns
/// the host end of its pair, for the caller to compare with prevResult.
pub async fn check(
    conf: &NetConf,
    id: &AttachmentId,
    host_nl: &Netlink,
    pod_ns: &Netns,
    pod_nl: &Netlink,
    pod_link: &LinkInfo,
) -> Result<LinkInfo, Error> {
    let store = StateStore::new(&conf.state_dir);
    let record = store
        .load(id)?
        .filter(|r| r.complete)
        .ok_or_else(|| Error::check(format!("no record of {}/{}", id.container_id, id.ifname)))?;
    let host_ifname = host_veth_name(&conf.name, id);
    let host_link = host_nl
        .link_by_name(&host_ifname)
        .await?
        .ok_or_else(|| Error::check(format!("host veth {host_ifname} is missing")))?;
    if host_link.peer_index != Some(pod_link.index) {
        return Err(Error::check(format!(
            "{host_ifname} is not the peer of {} in the pod",
            id.ifname
        )));
    }
    // What CHECK finds: the pair as the kernel has it, the addresses the
    // record has, the mappings and limits the runtime passes again.
    let pod = Attachment::paired(
        conf,
        id,
        record.addrs(),
        (&host_link, pod_link),
        (pod_ns, pod_nl),
        false,
    );
    Datapath::new(&conf.pin_root).check(host_nl, &pod).await?;
    Ok(host_link)
}
