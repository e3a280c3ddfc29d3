//! Checksums by hand, for XDP (which has no checksum helpers), like Cilium's
//! `bpf/lib/csum.h`: RFC 1624 incremental updates. Only right for complete
//! checksums, which is why the XDP translations run in native mode only (a
//! generic-XDP skb may carry a partial one; tc and its helpers handle those).
use network_types::ip::Ipv4Hdr;
use sluice_common::Addr6;

use crate::l4::{PROTO_ICMP, PROTO_UDP};

/// RFC 1624 incremental update of a checksum `check` (as stored) when 16-bit words
/// `old` become `new` (as stored). Only valid for complete checksums.
#[inline(always)]
pub(crate) fn csum_update(check: u16, old: [u16; 3], new: [u16; 3]) -> u16 {
    let mut sum = u32::from(!check);
    let mut i = 0;
    while i < 3 {
        sum += u32::from(!old[i]) + u32::from(new[i]);
        i += 1;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The two 16-bit words of an address as stored.
#[inline(always)]
pub(crate) fn words(a: [u8; 4]) -> [u16; 2] {
    [
        u16::from_ne_bytes([a[0], a[1]]),
        u16::from_ne_bytes([a[2], a[3]]),
    ]
}

/// XDP: the L4 checksum at `csum` after the destination address `old_addr`
/// became `new_addr` and the port (destination port, or ICMP echo identifier)
/// `old_port` became `new_port`. ICMP's checksum has no pseudo header; a UDP
/// checksum 0 means none and stays 0, one that becomes 0 is sent as 0xffff.
///
/// Callers get `csum` from `ptr_at` on the path that uses it (SCTP has none):
/// a pointer chosen or spilled on a merged path is a scalar to 5.10's verifier.
///
/// # Safety
/// `csum` points into the frame and was bounds checked.
#[inline(always)]
pub(crate) unsafe fn l4_replace(
    csum: *mut u16,
    proto: u8,
    (old_addr, new_addr): ([u8; 4], [u8; 4]),
    (old_port, new_port): (u16, u16),
) {
    let (od, nd) = (words(old_addr), words(new_addr));
    // SAFETY: the caller's contract.
    unsafe {
        let cur = *csum;
        if proto == PROTO_UDP && cur == 0 {
            return;
        }
        let nc = if proto == PROTO_ICMP {
            csum_update(cur, [old_port, 0, 0], [new_port, 0, 0])
        } else {
            csum_update(cur, [od[0], od[1], old_port], [nd[0], nd[1], new_port])
        };
        *csum = if proto == PROTO_UDP && nc == 0 {
            0xffff
        } else {
            nc
        };
    }
}

/// XDP: the address at `field` of the IPv4 header at `ip` (its source or
/// destination) becomes `addr`, with the header checksum updated.
///
/// # Safety
/// `ip` points into the frame and was bounds checked; `field` is one of its
/// address fields.
#[inline(always)]
unsafe fn set_addr(ip: *mut Ipv4Hdr, field: *mut [u8; 4], addr: [u8; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        let (old, new) = (words(*field), words(addr));
        (*ip).check = csum_update(
            u16::from_ne_bytes((*ip).check),
            [old[0], old[1], 0],
            [new[0], new[1], 0],
        )
        .to_ne_bytes();
        *field = addr;
    }
}

/// XDP: the source address of the IPv4 header at `ip` becomes `addr`, with
/// the header checksum updated.
///
/// # Safety
/// `ip` points into the frame and was bounds checked.
#[inline(always)]
pub(crate) unsafe fn set_src_addr(ip: *mut Ipv4Hdr, addr: [u8; 4]) {
    // SAFETY: the caller's contract.
    unsafe { set_addr(ip, &raw mut (*ip).src_addr, addr) }
}

/// XDP: the destination address of the IPv4 header at `ip` becomes `addr`,
/// with the header checksum updated.
///
/// # Safety
/// `ip` points into the frame and was bounds checked.
#[inline(always)]
pub(crate) unsafe fn set_dst_addr(ip: *mut Ipv4Hdr, addr: [u8; 4]) {
    // SAFETY: the caller's contract.
    unsafe { set_addr(ip, &raw mut (*ip).dst_addr, addr) }
}

/// XDP, IPv6: the TCP or UDP checksum at `csum` after the destination address
/// `old_addr` became `new_addr` and the destination port `old_port` became
/// `new_port`: the pseudo header holds all eight words of the address (RFC
/// 8200 section 8.1). A UDP checksum 0 (none, which IPv6 does not allow) stays
/// 0; one that becomes 0 is sent as 0xffff.
///
/// # Safety
/// `csum` points into the frame and was bounds checked.
#[inline(always)]
pub(crate) unsafe fn l4_replace6(
    csum: *mut u16,
    proto: u8,
    (old_addr, new_addr): (&Addr6, &Addr6),
    (old_port, new_port): (u16, u16),
) {
    let w = |a: &Addr6, i: usize| u16::from_ne_bytes([a.0[i * 2], a.0[i * 2 + 1]]);
    // SAFETY: the caller's contract.
    unsafe {
        let cur = *csum;
        if proto == PROTO_UDP && cur == 0 {
            return;
        }
        // RFC 1624 as in `csum_update`, over nine words.
        let mut sum = u32::from(!cur) + u32::from(!old_port) + u32::from(new_port);
        let mut i = 0;
        while i < 8 {
            sum += u32::from(!w(old_addr, i)) + u32::from(w(new_addr, i));
            i += 1;
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let nc = !(sum as u16);
        *csum = if proto == PROTO_UDP && nc == 0 {
            0xffff
        } else {
            nc
        };
    }
}
