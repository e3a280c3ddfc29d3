//! Replies to masqueraded flows in native XDP, before an skb exists.
use aya_ebpf::programs::XdpContext;
use sluice_common::NatKey;

use super::{
    config,
    family::V4,
    flow::{stale_reverse, touch},
    is_nat_addr,
};
use crate::{
    csum,
    l3::Headers,
    l4::{ICMP_ECHO_REPLY, PROTO_ICMP, PROTO_TCP, PROTO_UDP},
    maps::{NAT_FWD, NAT_REV},
    packet::ptr_at,
};

/// XDP: translates a TCP/UDP reply or ICMP echo reply to the masquerade address
/// back to the pod and returns the pod's endpoint to deliver to. Native XDP only:
/// there frames come from a NIC with complete checksums, which an incremental
/// update keeps right; a generic-XDP skb may carry a partial checksum, which it
/// would corrupt, so those go on to the tc program and its checksum helpers.
#[inline(always)]
pub fn dnat_xdp(ctx: &XdpContext, h: &Headers) -> Option<[u8; 4]> {
    let cfg = config()?;
    let v4 = h.v4_fields()?;
    let (ip, src, dst, proto) = (v4.hdr, v4.src, v4.dst, v4.proto);
    if !is_nat_addr(cfg, dst) || v4.fragment() {
        return None;
    }
    let l4_off = v4.l4_off();
    // Ports (or type/code and identifier) and the checksum, bounds checked.
    let hdr: *mut [u16; 4] = ptr_at(ctx, l4_off)?;
    // SAFETY: bounds checked by ptr_at.
    let w = unsafe { *hdr };
    let (sport, dport, port_idx, csum_ptr): (u16, u16, usize, *mut u16) = match proto {
        PROTO_TCP => {
            let c: *mut u16 = ptr_at(ctx, l4_off + 16)?;
            (w[0], w[1], 1, c)
        }
        PROTO_UDP => {
            let c: *mut u16 = ptr_at(ctx, l4_off + 6)?;
            (w[0], w[1], 1, c)
        }
        PROTO_ICMP => {
            // Echo reply: type 0, code 0; the identifier is the third word.
            if u16::from_be(w[0]) >> 8 != u16::from(ICMP_ECHO_REPLY) {
                return None;
            }
            let c: *mut u16 = ptr_at(ctx, l4_off + 2)?;
            (0, w[2], 2, c)
        }
        _ => return None,
    };
    let rk = NatKey::new(src, dst, sport, dport, proto);
    // SAFETY: map values are only read.
    let rev = *unsafe { NAT_REV.get(rk) }?;
    if stale_reverse::<V4>(cfg, &rk) {
        return None;
    }
    // A node echo's reply (see icmp::node_echo) is tc's: after XDP translated
    // it, tc would look its identifier up again.
    if rev.pod_ip == dst {
        return None;
    }
    let fk = NatKey::new(rev.pod_ip, src, rev.pod_port, sport, proto);
    if let Some(e) = NAT_FWD.get_ptr_mut(fk) {
        // The flags are byte 13 of the TCP header.
        let flags = if proto == PROTO_TCP {
            // SAFETY: bounds checked by ptr_at.
            ptr_at::<u8>(ctx, l4_off + 13).map_or(0, |f| unsafe { *f })
        } else {
            0
        };
        touch(e, proto, flags, true);
    }
    // SAFETY: every pointer was bounds checked by ptr_at / l3::parse.
    unsafe {
        let old_port = (*hdr)[port_idx];
        csum::l4_replace(csum_ptr, proto, (dst, rev.pod_ip), (old_port, rev.pod_port));
        (*hdr)[port_idx] = rev.pod_port;
        csum::set_dst_addr(ip, rev.pod_ip);
    }
    Some(rev.pod_ip)
}
