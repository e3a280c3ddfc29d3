//! IPv4 fragments: the first one carries the L4 header and is translated like
//! any packet of its flow, and remembered in `sl_nat_frag` (by the fields that
//! identify a datagram's fragments); the later ones carry no ports and are
//! translated from that entry.
use network_types::ip::Ipv4Hdr;
use sluice_common::{FragEntry, FragKey, FRAG_TIMEOUT_NS};

use aya_ebpf::programs::TcContext;

use super::flow::now;
use crate::{
    l4::{ETH_LEN, IP_CSUM},
    maps::NAT_FRAG,
};

/// A later fragment: no L4 header.
#[inline(always)]
pub(super) fn later_fragment(ip: &Ipv4Hdr) -> bool {
    u16::from_be_bytes(ip.frags) & 0x1fff != 0
}

#[inline(always)]
fn frag_key(ip: &Ipv4Hdr) -> FragKey {
    FragKey {
        src_ip: ip.src_addr,
        dst_ip: ip.dst_addr,
        id: u16::from_ne_bytes(ip.id),
        proto: ip.proto,
        _pad: 0,
    }
}

/// After the first fragment of a datagram (more fragments follow): the later
/// ones get `addr` too. Keyed by the fields as the first fragment arrived.
#[inline(always)]
pub(super) fn remember_fragments(ip: &Ipv4Hdr, addr: [u8; 4]) {
    if u16::from_be_bytes(ip.frags) & 0x2000 == 0 {
        return;
    }
    let e = FragEntry {
        addr,
        _pad: 0,
        created_ns: now(),
    };
    let _ = NAT_FRAG.insert(frag_key(ip), e, 0);
}

/// The address a later fragment's first fragment was translated to.
#[inline(always)]
pub(super) fn fragment_target(ip: &Ipv4Hdr) -> Option<[u8; 4]> {
    // SAFETY: the map value is only read.
    let e = unsafe { NAT_FRAG.get(frag_key(ip)) }?;
    (now().saturating_sub(e.created_ns) < FRAG_TIMEOUT_NS).then_some(e.addr)
}

/// Replaces the IPv4 address at `off` (source 12, destination 16 past the
/// Ethernet header) of a later fragment: only the IP header checksum covers it.
#[inline(always)]
pub(super) fn rewrite_addr(
    ctx: &TcContext,
    off: usize,
    old: [u8; 4],
    new: [u8; 4],
) -> Result<(), ()> {
    let (oa, na) = (
        u64::from(u32::from_ne_bytes(old)),
        u64::from(u32::from_ne_bytes(new)),
    );
    ctx.l3_csum_replace(IP_CSUM, oa, na, 4).map_err(|_| ())?;
    ctx.store(ETH_LEN + off, &new, 0).map_err(|_| ())
}
