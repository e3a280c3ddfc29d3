//! ICMPv6 errors quoting a masqueraded packet (RFC 4443 3: destination
//! unreachable, packet too big, time exceeded, parameter problem), translated
//! back into the pod. Packet Too Big above all: without it a pod behind the
//! masquerade never learns a smaller path MTU and its large packets vanish.
use aya_ebpf::{
    bindings::{BPF_F_PSEUDO_HDR, TC_ACT_SHOT},
    helpers::bpf_csum_diff,
    programs::TcContext,
};
use sluice_common::{reason, Addr6, IpKey, Nat6Key};

use super::v6::{addrs, upper_layer};
use crate::proto::IP6_DST_OFF as DST_OFF;
use crate::{
    counters::count,
    endpoint::deliver_masq_reply as deliver,
    events::note_drop,
    l4::{ICMP6_ECHO, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP},
    maps::NAT6_REV,
};

/// Offset of the quoted packet in an ICMPv6 error (type, code, checksum and
/// four bytes: the MTU in Packet Too Big, the pointer in Parameter Problem).
const QUOTE: usize = 8;
/// Offsets in the quoted IPv6 header.
use crate::proto::{IP6_DST as DST, IP6_NEXT_HDR as NEXT_HDR, IP6_SRC as SRC, IPV6_LEN};

/// An ICMPv6 error sent to the masquerade address (`v6::dnat6` checked it) about
/// a packet that left with it: the outer
/// destination, the quoted source address and the quoted source port (echo
/// identifier) become the pod's, the ICMPv6 checksum follows all three (the
/// outer address through the pseudo header, RFC 4443 2.3). The quoted L4
/// checksum is left alone: quotes are often cut short and no receiver checks
/// it. A quote with extension headers is not translated (left to the kernel).
/// [`super::NOT_NAT`]: not an error about a masqueraded flow.
#[inline(never)]
pub(super) fn icmp6_error(ctx: &TcContext) -> i32 {
    let Some((_, nat_addr, next_hdr)) = addrs(ctx) else {
        return super::NOT_NAT;
    };
    let Ok((PROTO_ICMPV6, l4_off)) = upper_layer(ctx, next_hdr) else {
        return super::NOT_NAT;
    };
    let Some((rk, port_off)) = quoted_flow(ctx, &nat_addr, l4_off) else {
        return super::NOT_NAT;
    };
    // SAFETY: map values are only read.
    let Some(rev) = (unsafe { NAT6_REV.get(&rk) }).copied() else {
        return super::NOT_NAT;
    };
    let csum_off = l4_off + 2;
    // SAFETY: two 16-byte buffers the helper only reads, sizes multiples of 4.
    let diff = unsafe {
        bpf_csum_diff(
            (&raw const nat_addr).cast_mut().cast(),
            16,
            (&raw const rev.pod_ip).cast_mut().cast(),
            16,
            0,
        )
    };
    let ok = diff >= 0
        && ctx
            .l4_csum_replace(csum_off, 0, diff as u64, u64::from(BPF_F_PSEUDO_HDR))
            .is_ok()
        && ctx.l4_csum_replace(csum_off, 0, diff as u64, 0).is_ok()
        && ctx
            .l4_csum_replace(csum_off, u64::from(rk.dst_port), u64::from(rev.pod_port), 2)
            .is_ok()
        && ctx.store(DST_OFF, &rev.pod_ip, 0).is_ok()
        && ctx.store(l4_off + QUOTE + SRC, &rev.pod_ip, 0).is_ok()
        && ctx.store(port_off, &rev.pod_port, 0).is_ok();
    if !ok {
        note_drop(reason::DROP_MASQ_MALFORMED, 0);
        return TC_ACT_SHOT;
    }
    count(reason::MASQ_ICMP_ERROR);
    deliver(ctx, IpKey::v6(rev.pod_ip.0))
}

/// The reverse key of the flow the quoted packet belongs to (as a reply of
/// that flow would carry it) and the offset of the quoted source port, if the
/// quote left from `nat_addr`.
#[inline(always)]
fn quoted_flow(ctx: &TcContext, nat_addr: &Addr6, l4_off: usize) -> Option<(Nat6Key, usize)> {
    let ip = l4_off + QUOTE;
    let src: Addr6 = ctx.load(ip + SRC).ok()?;
    if src != *nat_addr {
        return None;
    }
    let dst: Addr6 = ctx.load(ip + DST).ok()?;
    let proto: u8 = ctx.load(ip + NEXT_HDR).ok()?;
    let l4 = ip + IPV6_LEN;
    match proto {
        PROTO_TCP | PROTO_UDP => {
            let sport: u16 = ctx.load(l4).ok()?;
            let dport: u16 = ctx.load(l4 + 2).ok()?;
            Some((Nat6Key::new(dst, src, dport, sport, proto), l4))
        }
        PROTO_ICMPV6 if ctx.load::<u8>(l4).ok()? == ICMP6_ECHO => {
            let id: u16 = ctx.load(l4 + 4).ok()?;
            Some((Nat6Key::new(dst, src, 0, id, proto), l4 + 4))
        }
        _ => None,
    }
}
