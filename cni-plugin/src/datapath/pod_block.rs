//! The pods' shared tc blocks (`podAttach: tc`): every host veth's clsact qdisc
//! joins the same two filter blocks of the node, one per direction
//! (`tc qdisc add dev X clsact ingress_block I egress_block E`), and the pod
//! programs are one `cls_bpf` filter on each block, not two per veth.
//!
//! Why: binding a qdisc's block walks a machine-wide list of every bound
//! block (`flow_indr_dev_setup_offload` -> `find_indir_dev`,
//! `net/core/flow_offload.c`), so a private pair of blocks per veth made each
//! ADD slower by the node's pod count (about 0.4 ms at 1,000 pods). A shared
//! block is on that list once.
//!
//! The kernel refuses filter changes addressed through a device whose block is
//! shared ("This filter block is shared", `__tcf_block_find`,
//! `net/sched/cls_api.c`); they go to the block (`tcm_ifindex` =
//! `TCM_IFINDEX_MAGIC_BLOCK`, `tcm_parent` = block index). Dumps through the
//! device still show the block's filters (`tc filter show dev X ingress`,
//! CHECK). A block lives while a qdisc holds it: the last pod's DEL frees it and
//! its filters, and the next ADD sets them again.
//!
//! Plain netlink requests ([`Blocking`]) on a socket of the calling thread's
//! namespace (the node's), as aya's own tc calls are.
use std::{io, os::fd::RawFd};

use rtnetlink::packet_core::DefaultNla;
use rtnetlink::{
    packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE},
    packet_route::{
        tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
        RouteNetlinkMessage,
    },
};
use sluice_maps::PinRoot;

use crate::netlink::Blocking;

// include/uapi/linux/rtnetlink.h (netlink-packet-route leaves them out).
const TCA_INGRESS_BLOCK: u16 = 13;
const TCA_EGRESS_BLOCK: u16 = 14;
/// Priority and handle of the pod filters on a block (as on a veth before).
const PRIORITY: u16 = 1;
const HANDLE: u32 = 1;
/// `ETH_P_ALL`, in network order in `tcm_info`'s low half.
const ETH_P_ALL: u16 = 0x0003;

/// The node's two pod blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Blocks {
    pub(super) ingress: u32,
    pub(super) egress: u32,
}

impl Blocks {
    /// The blocks of the datapath pinned at `root`: indices derived from its
    /// path, so every ADD of that datapath (and a new datapath loaded into the
    /// same pin root after a reboot) finds the same ones, and two datapaths in
    /// one namespace do not share programs. Block indices are chosen by whoever
    /// makes the block; ours sit in `0x51xxxxxx`, away from hand-made small ones.
    pub(super) fn of(root: &PinRoot) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let h = fnv1a(root.path().as_os_str().as_bytes());
        let base = 0x5100_0000 | (h & 0x00ff_fffe);
        Self {
            ingress: base,
            egress: base | 1,
        }
    }

    /// The block of the hook a pod program runs on.
    pub(super) fn of_hook(self, ingress: bool) -> u32 {
        if ingress {
            self.ingress
        } else {
            self.egress
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// A netlink route socket for tc requests, in the calling thread's namespace.
pub(super) struct Tc {
    socket: Blocking,
}

impl Tc {
    pub(super) fn open() -> io::Result<Self> {
        Ok(Self {
            socket: Blocking::open()?,
        })
    }

    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.socket.request(msg, flags)
    }

    /// Adds a clsact qdisc to link `ifindex` whose hooks are `blocks`.
    /// `Ok(false)`: the link has a clsact (or ingress) qdisc already.
    pub(super) fn add_clsact(&mut self, ifindex: u32, blocks: Blocks) -> io::Result<bool> {
        let mut msg = clsact_message(ifindex)?;
        msg.attributes.push(TcAttribute::Kind("clsact".into()));
        for (kind, index) in [
            (TCA_INGRESS_BLOCK, blocks.ingress),
            (TCA_EGRESS_BLOCK, blocks.egress),
        ] {
            msg.attributes.push(TcAttribute::Other(DefaultNla::new(
                kind,
                index.to_ne_bytes().to_vec(),
            )));
        }
        match self.request(
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes link `ifindex`'s clsact qdisc and with it its filters or its
    /// hold on shared blocks (`tc qdisc del dev X clsact`). `Ok(false)`: it had
    /// none (or the link is gone). The kind is named so that the kernel
    /// refuses to delete an `ingress` qdisc someone else made
    /// (`tc_get_qdisc`: EINVAL on a kind mismatch).
    pub(super) fn del_clsact(&mut self, ifindex: u32) -> io::Result<bool> {
        let mut msg = clsact_message(ifindex)?;
        msg.attributes.push(TcAttribute::Kind("clsact".into()));
        match self.request(RouteNetlinkMessage::DelQueueDiscipline(msg), 0) {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::EINVAL | libc::ENODEV)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Makes program `prog_fd` (`name`) the pod filter of `block`: created,
    /// or pointed at it in place (a filter is replaced atomically, so no
    /// packet of the block's pods finds none). With `create` false, a block or
    /// filter that does not exist is left so (`Ok(false)`).
    pub(super) fn set_filter(
        &mut self,
        block: u32,
        prog_fd: RawFd,
        name: &str,
        create: bool,
    ) -> io::Result<bool> {
        let mut msg = TcMessage::default();
        msg.header = block_header(block);
        msg.attributes.push(TcAttribute::Kind("bpf".into()));
        let fd = u32::try_from(prog_fd)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "negative program fd"))?;
        msg.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(fd)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(name.into())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        ]));
        let flags = if create {
            NLM_F_CREATE | NLM_F_REPLACE
        } else {
            NLM_F_REPLACE
        };
        match self.request(RouteNetlinkMessage::NewTrafficFilter(msg), flags) {
            Ok(()) => Ok(true),
            // No such block ("Block of given index was not found"), or no filter
            // at that priority without NLM_F_CREATE.
            Err(e) if !create && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// The header of a request about link `ifindex`'s clsact qdisc.
fn clsact_message(ifindex: u32) -> io::Result<TcMessage> {
    let index = i32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index too large"))?;
    let mut msg = TcMessage::with_index(index);
    msg.header.parent = TcHandle::CLSACT;
    msg.header.handle = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    Ok(msg)
}

/// The header of a filter request addressed to `block` (`tc filter ... block N
/// pref 1 handle 1 protocol all`).
fn block_header(block: u32) -> TcHeader {
    TcHeader {
        // TCM_IFINDEX_MAGIC_BLOCK is all ones; tcm_ifindex is signed.
        index: -1,
        parent: block.into(),
        handle: HANDLE.into(),
        info: (u32::from(PRIORITY) << 16) | u32::from(ETH_P_ALL.to_be()),
        ..TcHeader::default()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn blocks_follow_the_pin_root_and_stay_in_our_range() {
        let a = Blocks::of(&PinRoot::new(Path::new("/sys/fs/bpf/sluice")));
        let b = Blocks::of(&PinRoot::new(Path::new("/sys/fs/bpf/sluice")));
        let c = Blocks::of(&PinRoot::new(Path::new("/sys/fs/bpf/sluice-other")));
        assert_eq!(a, b);
        assert_ne!(a, c);
        for x in [a, c] {
            assert_eq!(x.ingress & 0xff00_0000, 0x5100_0000);
            assert_eq!(x.egress, x.ingress + 1);
            assert_eq!(x.of_hook(true), x.ingress);
            assert_eq!(x.of_hook(false), x.egress);
        }
    }

    #[test]
    fn a_block_filter_is_addressed_to_the_block() {
        let h = block_header(0x5100_0010);
        assert_eq!(h.index.cast_unsigned(), TcHeader::TCM_IFINDEX_MAGIC_BLOCK);
        assert_eq!(u32::from(h.parent), 0x5100_0010);
        // pref 1, protocol all (0x0003 in network order)
        // pref 1 in the high half; protocol all, ETH_P_ALL in network order
        // (bytes 00 03), in the low half.
        assert_eq!(h.info >> 16, 1);
        assert_eq!(
            u16::try_from(h.info & 0xffff).unwrap().to_ne_bytes(),
            [0x00, 0x03]
        );
    }
}
