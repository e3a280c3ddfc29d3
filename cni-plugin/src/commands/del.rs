//! DEL: undo everything ADD made. Works without `CNI_NETNS`, without prevResult,
//! after the netns is gone and twice in a row (spec section 2), and always
//! releases the address reservation.
use crate::{
    cni::{config::NetConf, env::Env, AttachmentId},
    datapath::{Datapath, Known},
    error::{Error, Errors},
    ipam::Ipam,
    netlink::Netlink,
    state::{host_veth_name, AttachmentRecord, StateStore},
    timing::Steps,
};
use std::net::IpAddr;

use ipnetwork::IpNetwork;

pub(super) async fn del(env: &Env, conf: &NetConf) -> Result<(), Error> {
    let id = env.attachment()?;
    // A runtime giving up on us mid-DEL must not leave half a pod behind
    // (netavark does the same): finish, then exit.
    ignore_termination_signals();
    let host_nl = Netlink::open()?;
    let store = StateStore::new(&conf.state_dir);
    match Ipam::new(conf, &env.path) {
        Ok(ipam) => teardown(conf, id, &ipam, &store, &host_nl).await,
        Err(e) => {
            // Without IPAM we still remove the interface and datapath state, then
            // report why the reservation could not be released.
            let mut errors = Errors::new();
            let record = load_record(&store, id);
            errors.note(teardown_node(conf, id, record.as_ref(), &host_nl).await);
            errors.push(e);
            errors.finish()
        }
    }
}

fn ignore_termination_signals() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: installing SIG_IGN runs no handler code.
        let _ = unsafe { signal(s, SigHandler::SigIgn) };
    }
}

/// Removes everything the attachment owns: datapath entries and links, the veth
/// pair, the address reservation and finally the record. Best effort: it goes on
/// past errors and returns them all; the record stays while something failed, so
/// a later DEL or GC can retry.
pub(super) async fn teardown(
    conf: &NetConf,
    id: &AttachmentId,
    ipam: &Ipam,
    store: &StateStore,
    host_nl: &Netlink,
) -> Result<(), Error> {
    let mut steps = Steps::start();
    let mut errors = Errors::new();
    let record = load_record(store, id);
    errors.note(teardown_node(conf, id, record.as_ref(), host_nl).await);
    steps.done("node teardown");
    // The record names the addresses: the built-in allocator releases those
    // without reading every reservation of the node.
    let known: Option<Vec<IpAddr>> = record
        .as_ref()
        .map(|r| r.ips.iter().map(IpNetwork::ip).collect());
    errors.note(ipam.del(conf, id, known.as_deref()));
    steps.done("ipam release");
    if errors.is_empty() {
        store.remove(id)
    } else {
        errors.finish()
    }
}

/// The attachment's record, if there is a readable one.
fn load_record(store: &StateStore, id: &AttachmentId) -> Option<AttachmentRecord> {
    store.load(id).unwrap_or_else(|e| {
        eprintln!("sluice: ignoring unreadable record: {e}");
        None
    })
}

/// The node-side part of [`teardown`]: datapath and veth.
async fn teardown_node(
    conf: &NetConf,
    id: &AttachmentId,
    record: Option<&AttachmentRecord>,
    host_nl: &Netlink,
) -> Result<(), Error> {
    let host_ifname =
        record.map_or_else(|| host_veth_name(&conf.name, id), |r| r.host_ifname.clone());
    let mut errors = Errors::new();
    // The veth first: deleting it takes the filters (or tcx attachments) with it,
    // so the datapath finds no filter left to delete one by one.
    let mut steps = Steps::start();
    let deleted = errors
        .note(delete_host_veth(host_nl, &host_ifname).await)
        .flatten();
    steps.done("veth delete");
    // The recorded index, or (an ADD killed before its record had it, after
    // the counters entry was made) the index of the veth just deleted. A
    // record with the index is complete: its addresses and mappings are what
    // the datapath holds for the pod.
    let ips: Vec<IpAddr> = record
        .map(|r| r.ips.iter().map(IpNetwork::ip).collect())
        .unwrap_or_default();
    let known = record.and_then(|r| {
        Some(Known {
            host_ifindex: r.host_ifindex?,
            ips: &ips,
            port_mappings: &r.port_mappings,
        })
    });
    errors.note(Datapath::new(&conf.pin_root).detach(
        &host_ifname,
        record.and_then(|r| r.host_ifindex).or(deleted),
        id,
        known.as_ref(),
    ));
    errors.finish()
}

/// Deletes our host veth or netkit device (and with it the pod end and
/// everything on both), and returns the index it had. Only a pair device is
/// ever deleted, whatever its name.
pub(super) async fn delete_host_veth(
    host_nl: &Netlink,
    host_ifname: &str,
) -> Result<Option<u32>, Error> {
    if let Some(link) = host_nl.link_by_name(host_ifname).await? {
        if !matches!(link.kind.as_deref(), Some("veth" | "netkit")) {
            return Err(Error::netlink(
                format!("delete {host_ifname}"),
                format!(
                    "it is a {} interface, not a veth or netkit device Sluice made",
                    link.kind.as_deref().unwrap_or("plain")
                ),
            ));
        }
        host_nl.delete_link(link.index).await?;
        return Ok(Some(link.index));
    }
    Ok(None)
}
