//! What a DEL removes, and a failed ADD's rollback, and GC for a stale
//! record: the pod's datapath entries and links, its pair, its address
//! reservation and finally its record. Works after the netns is gone and
//! twice in a row (spec section 2).
use std::net::IpAddr;

use futures::channel::oneshot;
use ipnetwork::IpNetwork;

use crate::{
    cni::{config::NetConf, AttachmentId},
    datapath::{Attachment, Datapath},
    error::{Error, Errors},
    ipam::Ipam,
    netlink::{Blocking, LinkEvents, Netlink},
    state::{host_veth_name, AttachmentRecord, StateStore},
    timing::Steps,
};

/// Removes everything the attachment owns: datapath entries and links, the veth
/// pair, the address reservation and finally the record. Best effort: it goes on
/// past errors and returns them all; the record stays while something failed, so
/// a later DEL or GC can retry.
pub async fn teardown(
    conf: &NetConf,
    id: &AttachmentId,
    ipam: &Ipam,
    store: &StateStore,
    host_nl: &Netlink,
) -> Result<(), Error> {
    let mut errors = Errors::new();
    let record = load_record(store, id);
    // The record names the addresses: the built-in allocator releases those
    // without reading every reservation of the node.
    let known: Option<Vec<IpAddr>> = record
        .as_ref()
        .map(|r| r.ips.iter().map(IpNetwork::ip).collect());
    errors.note(
        teardown_node(conf, id, record.as_ref(), host_nl, || {
            ipam.del(conf, id, known.as_deref())
        })
        .await,
    );
    if errors.is_empty() {
        store.remove(id)
    } else {
        errors.finish()
    }
}

/// The attachment's record, if there is a readable one.
pub(crate) fn load_record(store: &StateStore, id: &AttachmentId) -> Option<AttachmentRecord> {
    store.load(id).unwrap_or_else(|e| {
        eprintln!("sluice: ignoring unreadable record: {e}");
        None
    })
}

/// The node-side part of [`teardown`]: veth and datapath, with `release` (the
/// address reservation's) run while the kernel finishes removing the veth.
pub(crate) async fn teardown_node(
    conf: &NetConf,
    id: &AttachmentId,
    record: Option<&AttachmentRecord>,
    host_nl: &Netlink,
    release: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let host_ifname =
        record.map_or_else(|| host_veth_name(&conf.name, id), |r| r.host_ifname.clone());
    let mut errors = Errors::new();
    // The veth first: unregistering it takes the filters (or tcx attachments)
    // with it, so the datapath finds no filter left to delete one by one.
    let mut steps = Steps::start();
    let removal = errors
        .note(VethRemoval::start(host_nl, &host_ifname).await)
        .flatten();
    steps.done("veth unregister");
    // The recorded index, or (an ADD killed before its record had it, after
    // the counters entry was made) the index of the veth being deleted. A
    // record with the index is complete: its addresses and mappings are what
    // the datapath holds for the pod.
    let pod = record.and_then(|r| Attachment::recorded(r, conf.pod_attach));
    errors.note(
        Datapath::new(&conf.pin_root).detach(
            &host_ifname,
            record
                .and_then(|r| r.host_ifindex)
                .or(removal.as_ref().map(|r| r.index)),
            id,
            pod.as_ref(),
        ),
    );
    steps.done("datapath detach");
    errors.note(release());
    steps.done("ipam release");
    if let Some(r) = removal {
        errors.note(r.finish().await);
    }
    steps.done("veth delete wait");
    errors.finish()
}

/// The deletion of our host veth or netkit device (and with it the pod end
/// and everything on both), on a thread of its own.
///
/// The kernel answers a link deletion only after `rcu_barrier()` in
/// `netdev_run_todo` (`net/core/dev.c`): about 20 ms, most of a DEL, and
/// nothing of ours. The link is unregistered well before that, when its
/// `RTM_DELLINK` goes out, so DEL detaches the datapath and releases the
/// addresses in the meantime and waits for the answer last.
pub struct VethRemoval {
    /// The index the link had.
    pub index: u32,
    name: String,
    /// The deleting thread's answer: already here, or still to come.
    answer: Answer,
}

type Deleted = std::io::Result<()>;

enum Answer {
    Here(Result<Deleted, oneshot::Canceled>),
    Pending(oneshot::Receiver<Deleted>),
}

impl VethRemoval {
    /// Starts deleting link `host_ifname` and returns once it is unregistered
    /// (or the deletion failed); `None` if there is no such link. Only a pair
    /// device is ever deleted, whatever its name.
    pub async fn start(host_nl: &Netlink, host_ifname: &str) -> Result<Option<Self>, Error> {
        let Some(link) = host_nl.link_by_name(host_ifname).await? else {
            return Ok(None);
        };
        if !matches!(link.kind.as_deref(), Some("veth" | "netkit")) {
            return Err(Error::netlink(
                format!("delete {host_ifname}"),
                format!(
                    "it is a {} interface, not a veth or netkit device Sluice made",
                    link.kind.as_deref().unwrap_or("plain")
                ),
            ));
        }
        // Subscribed before the request: its notification cannot be missed.
        let mut events = LinkEvents::subscribe()?;
        let index = link.index;
        let (tx, mut rx) = oneshot::channel();
        // The new thread starts in this thread's namespace (the node's).
        std::thread::Builder::new()
            .name("sluice-link-del".into())
            .spawn(move || {
                let _ = tx.send(Blocking::open().and_then(|mut s| s.delete_link(index)));
            })
            .map_err(|e| Error::io(format!("starting the deletion of {host_ifname}"), e))?;
        let answer = tokio::select! {
            gone = events.removed(index) => if gone {
                Answer::Pending(rx)
            } else {
                // The subscription failed: the answer tells when it is gone.
                Answer::Here((&mut rx).await)
            },
            r = &mut rx => Answer::Here(r),
        };
        Ok(Some(Self {
            index,
            name: host_ifname.to_owned(),
            answer,
        }))
    }

    /// Waits for the kernel's answer to the deletion.
    pub async fn finish(self) -> Result<(), Error> {
        let answer = match self.answer {
            Answer::Here(a) => a,
            Answer::Pending(rx) => rx.await,
        };
        match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::netlink(
                format!("delete link {} (#{})", self.name, self.index),
                e,
            )),
            Err(oneshot::Canceled) => Err(Error::netlink(
                format!("delete link {} (#{})", self.name, self.index),
                "the deleting thread ended without an answer",
            )),
        }
    }
}
