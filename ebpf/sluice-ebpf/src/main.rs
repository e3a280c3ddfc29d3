//! Sluice's datapath.
//!
//! - `from_pod` (tc ingress of a pod's host veth): to a pod on this node ->
//!   `bpf_redirect_peer` into it; otherwise FIB lookup and redirect out of the
//!   egress device, or pass to the kernel where the FIB says local.
//! - `to_pod` (tc egress of a host veth): what the kernel sends into a pod.
//! - `from_netkit_pod`, `to_netkit_pod`: the same on a netkit pod's host
//!   device, through netkit's own hooks.
//! - `pod_edt` (tc egress of a limited pod's own `eth0`, in its namespace): EDT
//!   departure times for the pod's egress limit, which `fq` there enforces.
//! - `uplink_in` (tc ingress of the node's uplink): packets for local pods go
//!   straight into them; Services from outside are translated (`lb::uplink`).
//! - `uplink_xdp` (XDP on the uplink): the same, earlier; what it does not
//!   handle is passed on to `uplink_in`.
//!
//! Nothing a program does not understand is dropped silently: it is passed to the
//! kernel with a counted reason, or dropped with one when the kernel would drop
//! it too (a truncated header).
#![no_std]
#![no_main]
// Atomic adds (bandwidth): the BPF target has no atomic read-modify-write types.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod bandwidth;
mod counters;
mod csum;
mod edt;
mod endpoint;
mod events;
mod forward;
mod hostport;
mod kernel;
mod kernel_nat;
mod l3;
mod l4;
mod lb;
mod maps;
mod mem;
mod nat;
mod packet;
mod policy;
mod proto;
mod sock_addr;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    macros::{cgroup_sock_addr, classifier, perf_event, xdp},
    programs::{PerfEventContext, SockAddrContext, TcContext, XdpContext},
};
use sluice_common::{config_flags, endpoint_flags, lb_flags, policy_dir, reason, IpKey};

use crate::{
    counters::count,
    events::note_drop,
    l3::{Headers, L3},
    maps::ENDPOINTS,
    packet::{ptr_at, pull},
};

/// tcx verdict that hands the packet to the next program, or to the kernel when
/// there is none (`TCX_NEXT`, the same value as `TC_ACT_UNSPEC` for cls_bpf).
pub const TCX_NEXT: i32 = -1;

/// Ethernet + the largest fixed IP header the programs read.
use proto::HEADERS_LEN;

/// `skb->pkt_type` of a frame addressed to this host.
const PACKET_HOST: u32 = 0;

#[inline(always)]
fn skb_field_ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: `skb` points at the context the kernel passed in.
    unsafe { (*ctx.skb.skb).ifindex }
}

#[inline(always)]
fn parse_tc(ctx: &TcContext) -> Result<Headers, i32> {
    pull(ctx, HEADERS_LEN);
    l3::parse(ctx).map_err(parse_verdict)
}

/// The tc verdict for a frame `l3::parse` refused, counted.
#[inline(always)]
fn parse_verdict(v: l3::Verdict) -> i32 {
    if v.drop {
        note_drop(v.reason, 0);
        TC_ACT_SHOT
    } else {
        count(v.reason);
        TCX_NEXT
    }
}

/// What `from_pod` learns of a frame's source address.
enum Source {
    /// An address of the pod behind the ingress device: its endpoint's flags.
    Own(u32),
    /// Not checked: IPv6 link-local and unspecified sources (router and
    /// neighbour solicitations, DAD and MLD use them), and frames the parser
    /// refuses (not IP: passed; malformed: dropped, after the counting).
    Unchecked,
    /// Someone else's address, or no pod's.
    Spoofed,
    /// IPv6 link-scope multicast from a link-local or unspecified source that
    /// the node does not listen to (see [`node_ignores`]).
    LinkMulticast,
}

/// Checks that the packet's source is an address of the pod behind `ifindex`
/// (the anti-spoofing check Cilium calls source IP verification).
#[inline(always)]
fn source(ctx: &TcContext, h: &Headers, ifindex: u32) -> Source {
    let key = h.src_key();
    // (An IPv4 key is v4-mapped: never link-local nor all zeros.)
    let a = &key.addr;
    let unspecified = *a == [0; 16];
    if (a[0] == 0xfe && a[1] & 0xc0 == 0x80) || unspecified {
        if node_ignores(ctx, h, unspecified) {
            return Source::LinkMulticast;
        }
        return Source::Unchecked;
    }
    // SAFETY: the map value is only read.
    match unsafe { ENDPOINTS.get(key) } {
        Some(ep) if ep.ifindex == ifindex => Source::Own(ep.flags),
        _ => Source::Spoofed,
    }
}

/// Whether an IPv6 frame from a link-local or unspecified source is multicast
/// of interface- or link-local scope (`ff01::/16`, `ff02::/16`, any flags:
/// RFC 4291 2.7) that the node's stack has no use for: MLD reports (behind a
/// hop-by-hop header, RFC 3810 5), router solicitations (routes come from the
/// CNI result) and duplicate address detection probes from `::`. Each would
/// make the node's IPv6 input look up a multicast route beside one per host
/// device. Neighbour solicitations and advertisements from a specified source
/// pass (`next header` ICMPv6, type 135 or 136, RFC 4861 4.3-4.4); so does
/// what the linear data does not hold.
#[inline(always)]
fn node_ignores(ctx: &TcContext, h: &Headers, unspecified_source: bool) -> bool {
    const ICMPV6: u8 = 58;
    const NEIGHBOUR_SOLICITATION: u8 = 135;
    const NEIGHBOUR_ADVERTISEMENT: u8 = 136;
    let L3::V6(ip) = h.l3 else {
        return false;
    };
    // SAFETY: bounds checked by `l3::parse`.
    let (dst0, dst1, next) = unsafe { ((*ip).dst_addr[0], (*ip).dst_addr[1], (*ip).next_hdr) };
    if dst0 != 0xff || !matches!(dst1 & 0x0f, 1 | 2) {
        return false;
    }
    if unspecified_source {
        return true;
    }
    if next != ICMPV6 {
        return true;
    }
    // The ICMPv6 type, right after the fixed header.
    let Some(kind) = ptr_at::<u8>(ctx, 14 + 40) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    !matches!(
        unsafe { *kind },
        NEIGHBOUR_SOLICITATION | NEIGHBOUR_ADVERTISEMENT
    )
}

/// The frame's destination address as an endpoint key, read straight from its
/// IPv4 or IPv6 header; `None` for other frames and for frames too short to
/// hold it.
#[inline(always)]
fn frame_dst(ctx: &TcContext) -> Option<IpKey> {
    pull(ctx, HEADERS_LEN);
    let eth = ptr_at::<[u8; 14]>(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    let et = unsafe { u16::from_be_bytes([(*eth)[12], (*eth)[13]]) };
    match et {
        // SAFETY: bounds checked by ptr_at.
        l3::ETH_P_IP => Some(IpKey::v4(unsafe { *ptr_at::<[u8; 4]>(ctx, 14 + 16)? })),
        // SAFETY: as above.
        l3::ETH_P_IPV6 => Some(IpKey::v6(unsafe { *ptr_at::<[u8; 16]>(ctx, 14 + 24)? })),
        _ => None,
    }
}

/// A tc program's verdict, with its drops reported (see `events`).
#[inline(always)]
fn tc_exit(ctx: &TcContext, verdict: i32, pod_ifindex: u32) -> i32 {
    if verdict == TC_ACT_SHOT {
        events::dropped(ctx, pod_ifindex);
    }
    verdict
}

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    let ifindex = skb_field_ifindex(&ctx);
    let v = from_pod_verdict(&ctx, ifindex, false);
    tc_exit(&ctx, v, ifindex)
}

/// `from_pod` on a netkit pod's peer hook: it runs in the pod device's
/// transmit with `skb->dev` already the host device, so `ifindex` is the same
/// key; the verdicts are netkit's, which share tc's values (`NETKIT_NEXT` -1,
/// `NETKIT_PASS` 0, `NETKIT_DROP` 2, `NETKIT_REDIRECT` 7; include/uapi/linux/if_link.h).
#[classifier]
pub fn from_netkit_pod(ctx: TcContext) -> i32 {
    let ifindex = skb_field_ifindex(&ctx);
    let v = from_pod_verdict(&ctx, ifindex, true);
    tc_exit(&ctx, v, ifindex)
}

/// `netkit`: the program runs on a netkit peer hook, not at tc ingress.
#[inline(always)]
fn from_pod_verdict(ctx: &TcContext, ifindex: u32, netkit: bool) -> i32 {
    // Parsed once: the source check, hostPort and routing read these headers.
    // A frame the parser refuses is counted and limited like any other first;
    // its verdict comes after that.
    pull(ctx, HEADERS_LEN);
    let parsed = l3::parse(ctx);
    let src = match &parsed {
        Ok(h) => source(ctx, h, ifindex),
        Err(_) => Source::Unchecked,
    };
    // Before any translation or limit: a forged source never gets further.
    // (endpoint flags for the counter, limited, spoofed)
    let (flags, limited, spoofed) = match src {
        Source::Own(flags) => (flags, flags & endpoint_flags::LIMITED != 0, false),
        // No endpoint to tell: the bucket lookup decides.
        Source::Unchecked => (0, true, false),
        Source::Spoofed => (0, false, true),
        Source::LinkMulticast => {
            endpoint::count_from_pod(ifindex, 0, ctx.len());
            count(reason::FROM_POD_LINK_MULTICAST);
            return TC_ACT_SHOT;
        }
    };
    // A spoofed packet counts as sent by the pod, then as a drop.
    endpoint::count_from_pod(ifindex, flags, ctx.len());
    if spoofed {
        note_drop(reason::DROP_SPOOFED, 0);
        return TC_ACT_SHOT;
    }
    // The pod's egress limit, before anything else is spent on the packet.
    if limited && !bandwidth::admit(ifindex, bandwidth::wire_len(ctx), false) {
        return TC_ACT_SHOT;
    }
    let h = match parsed {
        Ok(h) => h,
        Err(v) => return parse_verdict(v),
    };
    // NetworkPolicy, egress: the packet as the pod sent it (a Service's
    // backend chosen at the socket already; a reply to a flow from outside
    // matches its flow's entry before it is translated back).
    if matches!(src, Source::Own(_)) && policy::on() {
        let v = policy::check(ctx, u32::from(policy_dir::EGRESS), ifindex);
        if v != policy::PASS {
            return v;
        }
    }
    // hostPort replies and hairpin: rewritten first, then routed like the rest.
    // (parse again, translated)
    let mut t = hostport::from_pod(ctx, &h);
    // A local backend's reply to a Service flow from the uplink (see
    // `lb::uplink`), where the agent wrote an external frontend.
    if matches!(
        t,
        hostport::Translated::No | hostport::Translated::NoAfterCall
    ) && lb::uplink::config().is_some()
    {
        t = hostport::v6::translated(lb::uplink::from_pod(ctx));
    }
    let (reparse, translated) = match t {
        hostport::Translated::No => (false, false),
        // For the verifier's sake (see there).
        hostport::Translated::NoAfterCall => (true, false),
        // The rewrite's helpers (bpf_skb_store_bytes, bpf_l4_csum_replace)
        // invalidate the packet pointers.
        hostport::Translated::Yes => (true, true),
        hostport::Translated::Drop(verdict) => return verdict,
    };
    let h = if reparse {
        match parse_tc(ctx) {
            Ok(h) => h,
            Err(verdict) => return verdict,
        }
    } else {
        h
    };
    if h.v4_options_or_fragment() {
        count(reason::IPV4_OPTIONS_OR_FRAGMENT);
    }
    // SAFETY: the map value is only read.
    if let Some(ep) = unsafe { ENDPOINTS.get(h.dst_key()) } {
        // A pod reaching its own hostPort (hairpin) is delivered back into it.
        if ep.ifindex == ifindex && !translated {
            count(reason::FROM_POD_TO_SELF);
            return TCX_NEXT;
        }
        if h.ttl() <= 1 {
            count(reason::PASS_TTL);
            return TCX_NEXT;
        }
        // A reply on a flow the stack translated (a Service's endpoint here
        // answering a pod here): the stack undoes its translation.
        if !translated && kernel_nat::is_kernel_flow(ctx, &h, true) {
            count(reason::FROM_POD_KERNEL_FLOW);
            return TCX_NEXT;
        }
        // NetworkPolicy, ingress of the pod here (bpf_redirect_peer skips
        // the veth's egress, where to_pod would check).
        if policy::on() {
            let v = policy::check(ctx, u32::from(policy_dir::INGRESS), ep.ifindex);
            if v != policy::PASS {
                return v;
            }
        }
        if netkit {
            return endpoint::deliver_from_netkit(
                ctx,
                &h,
                ep,
                bandwidth::wire_len(ctx),
                reason::FROM_POD_TO_LOCAL_POD,
            );
        }
        return endpoint::deliver_tc(
            &h,
            ep,
            bandwidth::wire_len(ctx),
            reason::FROM_POD_TO_LOCAL_POD,
        );
    }
    if !translated {
        // Sluice's Services: a Service without endpoints answers (see
        // there), the packet counted and reported as it was.
        if let Some(r) = lb::reject::to_reject(ctx, &h) {
            note_drop(reason::DROP_LB_NO_ENDPOINT, 0);
            // Only a local endpoint missing: dropped (reported on exit).
            if !r.answer {
                return TC_ACT_SHOT;
            }
            events::dropped(ctx, ifindex);
            return lb::reject::reject(ctx, r, ifindex);
        }
        // Sluice's Services for a pod outside the hooks' cgroup: a new
        // flow to a ClusterIP is translated here (see there).
        if lb::uplink::config().is_some_and(|c| c.flags & lb_flags::PER_PACKET != 0) {
            let v = lb::packet::start(ctx);
            if v != hostport::v6::NOT_OURS {
                return v;
            }
        }
        // kube-proxy's Services: its rules are on the stack's path.
        if kernel_nat::to_service(&h) {
            kernel_nat::note_client(ctx, &h, ifindex);
            count(reason::FROM_POD_TO_SERVICE);
            return TCX_NEXT;
        }
    }
    // (forward hands the packets of flows the stack translates to the stack.)
    forward::forward(ctx, &h, ifindex, !translated)
}

/// tc egress of a limited pod's own `eth0` (in its namespace): EDT departure
/// times (see `edt`).
#[classifier]
pub fn pod_edt(ctx: TcContext) -> i32 {
    let (v, ifindex) = edt::stamp(&ctx);
    tc_exit(&ctx, v, ifindex)
}

#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    // Delivered by `from_netkit_pod`, which admitted and counted it already.
    if endpoint::take_delivered(&ctx) {
        return TCX_NEXT;
    }
    let ifindex = skb_field_ifindex(&ctx);
    kernel_nat::note_delivered(&ctx, ifindex);
    // The endpoint is not looked up here: the kernel's deliveries count by
    // ifindex.
    let v = to_pod_verdict(&ctx, ifindex, 0);
    tc_exit(&ctx, v, ifindex)
}

/// `to_pod` on a netkit pod's primary hook. netkit has made `skb->dev` the
/// pod's own device (an index in the pod's namespace) before its programs run,
/// so the pod's key, its host device's index, comes from the endpoint of the
/// packet's destination. Without one (a neighbour solicitation to a multicast
/// address), the packet passes uncounted.
#[classifier]
pub fn to_netkit_pod(ctx: TcContext) -> i32 {
    // Another pod's delivery first: it needs no lookup.
    if endpoint::take_delivered(&ctx) {
        return TCX_NEXT;
    }
    let Some((ifindex, flags)) = destination(&ctx) else {
        return TCX_NEXT;
    };
    kernel_nat::note_delivered(&ctx, ifindex);
    let v = to_pod_verdict(&ctx, ifindex, flags);
    tc_exit(&ctx, v, ifindex)
}

/// The host device index and the flags of the endpoint the packet is
/// addressed to.
#[inline(always)]
fn destination(ctx: &TcContext) -> Option<(u32, u32)> {
    let key = frame_dst(ctx)?;
    // SAFETY: the map value is only read.
    unsafe { ENDPOINTS.get(key) }.map(|ep| (ep.ifindex, ep.flags))
}

/// `flags`: the pod's endpoint flags, 0 when not looked up.
#[inline(always)]
fn to_pod_verdict(ctx: &TcContext, ifindex: u32, flags: u32) -> i32 {
    // NetworkPolicy, ingress, for what the kernel routes to the pod (from
    // the node itself, flows the stack translated).
    if policy::on() {
        let v = policy::check(ctx, u32::from(policy_dir::INGRESS), ifindex);
        if v != policy::PASS {
            return v;
        }
    }
    // The pod's ingress limit, for what the kernel routes to it (the datapath's
    // own deliveries check it in endpoint::deliver_*).
    if !bandwidth::admit(ifindex, bandwidth::wire_len(ctx), true) {
        return TC_ACT_SHOT;
    }
    endpoint::count_to_pod(ifindex, flags, ctx.len());
    count(reason::TO_POD_FROM_KERNEL);
    TCX_NEXT
}

#[classifier]
pub fn uplink_in(ctx: TcContext) -> i32 {
    let v = uplink_in_verdict(&ctx);
    tc_exit(&ctx, v, 0)
}

#[inline(always)]
fn uplink_in_verdict(ctx: &TcContext) -> i32 {
    // SAFETY: `skb` points at the context the kernel passed in.
    if unsafe { (*ctx.skb.skb).pkt_type } != PACKET_HOST {
        return TCX_NEXT;
    }
    pull(ctx, HEADERS_LEN);
    // Replies to masqueraded flows first: an exact 5-tuple beats a port mapping.
    if let Some(verdict) = nat::dnat(ctx) {
        return verdict;
    }
    // Services from outside (NodePorts, external and load balancer IPs):
    // called from here, its own frame beside this one's; below the calls
    // that follow, the chain passed the 512 bytes of stack.
    let v = lb::uplink::from_uplink(ctx);
    if v != hostport::v6::NOT_OURS {
        return v;
    }
    // With IPv6 masquerade a call of its own: inlined, its locals and those of
    // IPv6 masquerade's call exceeded the 512 bytes of stack the verifier allows
    // a chain of calls. Inline elsewhere, as before (see `nat::snat`).
    if kernel::masq6() {
        uplink_in_rest(ctx)
    } else {
        uplink_in_rest_inline(ctx)
    }
}

#[inline(never)]
fn uplink_in_rest(ctx: &TcContext) -> i32 {
    uplink_in_rest_inline(ctx)
}

/// [`uplink_in`] after masquerade and Services: hostPorts, then pods.
#[inline(always)]
fn uplink_in_rest_inline(ctx: &TcContext) -> i32 {
    if let Some(verdict) = hostport::from_uplink(ctx) {
        return verdict;
    }
    let h = match parse_tc(ctx) {
        Ok(h) => h,
        Err(verdict) => return verdict,
    };
    if h.v4_options_or_fragment() {
        count(reason::IPV4_OPTIONS_OR_FRAGMENT);
    }
    // SAFETY: the map value is only read.
    match unsafe { ENDPOINTS.get(h.dst_key()) } {
        Some(_) if kernel_nat::is_kernel_flow(ctx, &h, false) => {
            count(reason::UPLINK_KERNEL_FLOW);
            TCX_NEXT
        }
        Some(ep) if h.ttl() > 1 => {
            nat::note_inbound(ctx, &h, ep.ifindex);
            // NetworkPolicy: a pod with policy gets what comes from outside
            // through the kernel, whose routing passes `to_pod`'s check (a
            // call of the check here took `uplink_in` past 512 bytes of
            // stack on Linux 5.10). Noted inbound first all the same: with
            // masquerade on, the pod's replies must leave untranslated.
            if !policy::xdp_may_deliver(&h.dst_key()) {
                return TCX_NEXT;
            }
            endpoint::deliver_tc(&h, ep, bandwidth::wire_len(ctx), reason::UPLINK_TO_POD)
        }
        Some(_) => {
            count(reason::PASS_TTL);
            TCX_NEXT
        }
        None => {
            count(reason::UPLINK_PASS);
            TCX_NEXT
        }
    }
}

/// tc egress of the uplink: masquerade.
#[classifier]
pub fn uplink_out(ctx: TcContext) -> i32 {
    kernel_nat::note_routed(&ctx);
    let v = nat::snat(&ctx);
    tc_exit(&ctx, v, 0)
}

/// Fired once a second by a pinned perf event: expires idle NAT flows.
#[perf_event]
pub fn nat_sweep(_ctx: PerfEventContext) -> u32 {
    nat::sweep();
    0
}

/// The node's own sockets to a hostPort (see `hostport`). Always allow (1).
#[cgroup_sock_addr(connect4)]
pub fn hp_connect4(ctx: SockAddrContext) -> i32 {
    hostport::sock::connect4(&ctx);
    1
}

#[cgroup_sock_addr(sendmsg4)]
pub fn hp_sendmsg4(ctx: SockAddrContext) -> i32 {
    hostport::sock::connect4(&ctx);
    1
}

#[cgroup_sock_addr(recvmsg4)]
pub fn hp_recvmsg4(ctx: SockAddrContext) -> i32 {
    hostport::sock::restore4(&ctx);
    1
}

#[cgroup_sock_addr(getpeername4)]
pub fn hp_getpeername4(ctx: SockAddrContext) -> i32 {
    hostport::sock::restore4(&ctx);
    1
}

#[cgroup_sock_addr(connect6)]
pub fn hp_connect6(ctx: SockAddrContext) -> i32 {
    hostport::sock::connect6(&ctx);
    1
}

#[cgroup_sock_addr(sendmsg6)]
pub fn hp_sendmsg6(ctx: SockAddrContext) -> i32 {
    hostport::sock::connect6(&ctx);
    1
}

#[cgroup_sock_addr(recvmsg6)]
pub fn hp_recvmsg6(ctx: SockAddrContext) -> i32 {
    hostport::sock::restore6(&ctx);
    1
}

#[cgroup_sock_addr(getpeername6)]
pub fn hp_getpeername6(ctx: SockAddrContext) -> i32 {
    hostport::sock::restore6(&ctx);
    1
}

#[cgroup_sock_addr(connect4)]
pub fn hp_learn4(ctx: SockAddrContext) -> i32 {
    hostport::sock::learn4(&ctx);
    1
}

#[xdp]
pub fn uplink_xdp(ctx: XdpContext) -> u32 {
    let v = uplink_xdp_verdict(&ctx);
    if v == xdp_action::XDP_DROP {
        events::dropped(&ctx, 0);
    }
    v
}

#[inline(always)]
fn uplink_xdp_verdict(ctx: &XdpContext) -> u32 {
    let h = match l3::parse(ctx) {
        Ok(h) => h,
        // Malformed frames are left to tc and the kernel, which count and drop.
        Err(_) => {
            count(reason::XDP_PASS_TO_TC);
            return xdp_action::XDP_PASS;
        }
    };
    let Some(cfg) = maps::CONFIG.get(0) else {
        return xdp_action::XDP_PASS;
    };
    // Only frames addressed to the uplink itself; the rest is the kernel's.
    if cfg.uplink_mac != h.dst_mac() {
        return xdp_action::XDP_PASS;
    }
    let len = (ctx.data_end() - ctx.data()) as u32;
    // Replies to masqueraded flows, in native mode (see nat::dnat_xdp).
    if cfg.flags & config_flags::XDP_NATIVE != 0 {
        // Masquerade replies, then hostPorts, then Services from outside
        // (each counts its own).
        let pod = match nat::dnat_xdp(ctx, &h) {
            Some(pod) => Some((IpKey::v4(pod), true)),
            None => match hostport::from_uplink_xdp(ctx, &h) {
                Some(p) => Some((p, false)),
                None => match lb::uplink::from_uplink_xdp(ctx, &h) {
                    lb::uplink::Xdp::Pod(p) => Some((p, false)),
                    // Sent back out (a Service flow to another node).
                    lb::uplink::Xdp::Sent(v) => return v,
                    lb::uplink::Xdp::Pass => None,
                },
            },
        };
        if let Some((pod, masq)) = pod {
            // SAFETY: the map value is only read.
            return match unsafe { ENDPOINTS.get(pod) } {
                // A masquerade reply on a flow the stack translated too: tc
                // hands it to the stack (hostPort's flows never are).
                Some(_) if masq && kernel_nat::is_kernel_flow(ctx, &h, false) => {
                    count(reason::XDP_PASS_TO_TC);
                    xdp_action::XDP_PASS
                }
                Some(ep)
                    if ep.flags & endpoint_flags::XDP_READY != 0
                        && h.ttl() > 1
                        && len <= u32::from(cfg.pod_mtu) + 14
                        && policy::xdp_may_deliver(&pod) =>
                {
                    if masq {
                        count(reason::XDP_MASQ_DNAT);
                    }
                    endpoint::deliver_xdp(&h, ep, len, reason::XDP_TO_POD)
                }
                // Translated already; the kernel routes it to the pod.
                _ => xdp_action::XDP_PASS,
            };
        }
    }
    // SAFETY: the map value is only read.
    match unsafe { ENDPOINTS.get(h.dst_key()) } {
        Some(_) if kernel_nat::is_kernel_flow(ctx, &h, false) => {
            count(reason::XDP_PASS_TO_TC);
            xdp_action::XDP_PASS
        }
        Some(ep)
            if ep.flags & endpoint_flags::XDP_READY != 0
                && h.ttl() > 1
                && len <= u32::from(cfg.pod_mtu) + 14
                && policy::xdp_may_deliver(&h.dst_key()) =>
        {
            // What XDP passes on, tc counts.
            if h.v4_options_or_fragment() {
                count(reason::IPV4_OPTIONS_OR_FRAGMENT);
            }
            nat::note_inbound(ctx, &h, ep.ifindex);
            endpoint::deliver_xdp(&h, ep, len, reason::XDP_TO_POD)
        }
        _ => {
            count(reason::XDP_PASS_TO_TC);
            xdp_action::XDP_PASS
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach here; this only satisfies rustc.
    loop {}
}
