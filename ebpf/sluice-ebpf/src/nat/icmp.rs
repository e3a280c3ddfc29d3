//! ICMP beyond echo flows: errors quoting a masqueraded packet, translated back
//! into the pod ([`icmp_error`]), and the node's own echo requests, which share
//! the identifier space with the pods' ([`node_echo`]).
use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use network_types::ip::Ipv4Hdr;
use sluice_common::{nat_state, reason, MasqConfig, NatKey};

use super::{
    family::{Family, FlowKey, V4},
    flow::{allocate, reserve, touch},
    is_nat_addr,
};
use crate::{
    counters::count,
    endpoint::deliver_masq_reply as deliver,
    events::note_drop,
    l4::{l4, rewrite, Rewrite, ETH_LEN, ICMP_ECHO, IP_CSUM, PROTO_ICMP, PROTO_TCP, PROTO_UDP},
    maps::NAT_REV,
};

/// The node's own ICMP echo requests. Echo identifiers are not split like ports
/// (ping sockets hand out all 65535), so a node ping could use a pod flow's NAT
/// identifier to the same destination and its reply would be delivered into the
/// pod. So node echoes are flows too, see [`node_echo_flow`].
#[inline(always)]
pub(super) fn node_echo(ctx: &TcContext, cfg: &MasqConfig, ip: &Ipv4Hdr) {
    let l4_off = ETH_LEN + usize::from(ip.vihl & 0x0f) * 4;
    let Ok(l4) = l4(ctx, PROTO_ICMP, l4_off, ICMP_ECHO) else {
        return;
    };
    let key = NatKey::new(ip.src_addr, ip.dst_addr, l4.sport, 0, PROTO_ICMP);
    let Some((nat_id, _)) = node_echo_flow::<V4>(cfg, &key) else {
        return;
    };
    if nat_id != l4.sport {
        let r = Rewrite {
            addr_off: ETH_LEN + 12,
            old_addr: ip.src_addr,
            new_addr: ip.src_addr,
            port_off: l4.sport_off,
            old_port: l4.sport,
            new_port: nat_id,
        };
        if rewrite(ctx, &l4, &r).is_ok() {
            count(reason::MASQ_SNAT);
        }
    }
}

/// The flow of a node's echo request `k` (source: the masquerade address,
/// IPv4 or IPv6), `pod_ifindex` 0: a free identifier is reserved as it is, one
/// a pod flow holds is translated like a pod's. Its NAT identifier and whether
/// the flow is new; `None`: no room in the maps, the echo leaves untracked
/// (node traffic is never dropped).
#[inline(always)]
pub(super) fn node_echo_flow<F: Family>(cfg: &MasqConfig, k: &FlowKey<F>) -> Option<(u16, bool)> {
    let new = F::fwd().get_ptr(k).is_none();
    if new && reserve::<F>(k).is_err() {
        let _ = allocate::<F>(k, cfg, k.src_ip, 0, nat_state::ICMP);
    }
    let e = F::fwd().get_ptr_mut(k)?;
    touch(e, k.proto, 0, false);
    // SAFETY: a live map value.
    Some((unsafe { (*e).nat_port }, new))
}

/// An ICMP error quoting a masqueraded packet (its inner source is the masquerade
/// address and NAT port): the inner source, the outer destination and the ICMP
/// checksum are rewritten to the pod's. The inner IP header checksum is updated
/// with it, which leaves the ICMP checksum unchanged for those two fields (a
/// header with a correct checksum always sums to 0xffff); the inner L4 checksum is
/// left alone, receivers do not check it.
#[inline(always)]
pub(super) fn icmp_error(ctx: &TcContext, cfg: &MasqConfig, l4_off: usize) -> Option<i32> {
    let inner_off = l4_off + 8;
    let inner: Ipv4Hdr = ctx.load(inner_off).ok()?;
    if !is_nat_addr(cfg, inner.src_addr) {
        return None;
    }
    let inner_l4 = inner_off + usize::from(inner.vihl & 0x0f) * 4;
    let (sport_off, rk) = match inner.proto {
        PROTO_TCP | PROTO_UDP => {
            let sport: u16 = ctx.load(inner_l4).ok()?;
            let dport: u16 = ctx.load(inner_l4 + 2).ok()?;
            (
                inner_l4,
                NatKey::new(inner.dst_addr, inner.src_addr, dport, sport, inner.proto),
            )
        }
        PROTO_ICMP => {
            let id: u16 = ctx.load(inner_l4 + 4).ok()?;
            (
                inner_l4 + 4,
                NatKey::new(inner.dst_addr, inner.src_addr, 0, id, PROTO_ICMP),
            )
        }
        _ => return None,
    };
    // SAFETY: map values are only read.
    let rev = *unsafe { NAT_REV.get(rk) }?;
    let (old_a, new_a) = (
        u64::from(u32::from_ne_bytes(inner.src_addr)),
        u64::from(u32::from_ne_bytes(rev.pod_ip)),
    );
    let ok = ctx.l3_csum_replace(inner_off + 10, old_a, new_a, 4).is_ok()
        && ctx.store(inner_off + 12, &rev.pod_ip, 0).is_ok()
        && ctx
            .l4_csum_replace(
                l4_off + 2,
                u64::from(rk.dst_port),
                u64::from(rev.pod_port),
                2,
            )
            .is_ok()
        && ctx.store(sport_off, &rev.pod_port, 0).is_ok()
        && ctx.l3_csum_replace(IP_CSUM, old_a, new_a, 4).is_ok()
        && ctx.store(ETH_LEN + 16, &rev.pod_ip, 0).is_ok();
    if !ok {
        note_drop(reason::DROP_MASQ_MALFORMED, 0);
        return Some(TC_ACT_SHOT);
    }
    count(reason::MASQ_ICMP_ERROR);
    Some(deliver(ctx, sluice_common::IpKey::v4(rev.pod_ip)))
}
