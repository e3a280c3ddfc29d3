//! Forwarding of pod traffic that is not for a pod on this node: the kernel's FIB
//! decides (`bpf_fib_lookup`), the program sends the packet out of the egress
//! device itself (`bpf_redirect` / `bpf_redirect_neigh`) instead of walking the
//! host stack. Anything the FIB cannot forward goes to the kernel unchanged, so
//! ICMP errors, local delivery and policy routing keep working.
use core::{
    mem::{size_of, MaybeUninit},
    ptr::copy_nonoverlapping,
};

use aya_ebpf::{
    bindings::bpf_check_mtu_flags::BPF_MTU_CHK_SEGS,
    bindings::{
        bpf_fib_lookup as FibParams, bpf_redir_neigh, BPF_FIB_LKUP_RET_BLACKHOLE,
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NOT_FWDED, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_PROHIBIT, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LKUP_RET_UNREACHABLE,
    },
    helpers::{bpf_check_mtu, bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh},
    programs::TcContext,
    EbpfContext,
};
use sluice_common::reason;

use crate::{
    counters::count,
    kernel_nat,
    l3::{Headers, AF_INET, AF_INET6, L3},
    TCX_NEXT,
};

/// Forwards a packet from a pod by FIB lookup. `ifindex` is the ingress device.
/// Where the FIB would have it redirected, a packet of a flow the stack
/// translates (`kernel_nat`) goes to the stack instead, if `kernel_flows`.
#[inline(always)]
pub fn forward(ctx: &TcContext, h: &Headers, ifindex: u32, kernel_flows: bool) -> i32 {
    // Zero is a valid value for every field of the C struct. `tot_len` stays 0:
    // then the kernel checks the MTU with `is_skb_forwardable`, which knows
    // GSO; a GSO packet's header length would fail the plain check.
    let mut p = MaybeUninit::<FibParams>::uninit();
    // SAFETY: `p` is a writable FibParams; zeroed, every field is initialized.
    let p = unsafe {
        crate::mem::zero_words(p.as_mut_ptr());
        p.assume_init_mut()
    };
    p.ifindex = ifindex;
    // SAFETY: header pointers were bounds checked by `l3::parse`; the address
    // copies stay inside both 16-byte arrays.
    match h.l3 {
        L3::V4(ip) => unsafe {
            p.family = AF_INET;
            p.l4_protocol = (*ip).proto;
            p.__bindgen_anon_2.tos = (*ip).tos;
            p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes((*ip).src_addr);
            p.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes((*ip).dst_addr);
        },
        L3::V6(ip) => unsafe {
            p.family = AF_INET6;
            p.l4_protocol = (*ip).next_hdr;
            p.__bindgen_anon_2.flowinfo = u32::from_ne_bytes((*ip).vcf) & 0xffff_ff0f;
            // A copy, not an assignment: the assignment of the transmuted
            // array became a `memmove` call (see `zero_words`).
            copy_nonoverlapping(
                (*ip).src_addr.as_ptr(),
                (&raw mut p.__bindgen_anon_3.ipv6_src).cast::<u8>(),
                16,
            );
            copy_nonoverlapping(
                (*ip).dst_addr.as_ptr(),
                (&raw mut p.__bindgen_anon_4.ipv6_dst).cast::<u8>(),
                16,
            );
        },
    }
    // SAFETY: `p` is a valid bpf_fib_lookup of the size passed.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), p, size_of::<FibParams>() as i32, 0) } as u32;
    match rc {
        BPF_FIB_LKUP_RET_SUCCESS => {
            if h.ttl() <= 1 {
                count(reason::PASS_TTL);
                return TCX_NEXT;
            }
            if kernel_flows && kernel_nat::is_kernel_flow(ctx, h, true) {
                count(reason::FROM_POD_KERNEL_FLOW);
                return TCX_NEXT;
            }
            h.decrement_ttl();
            h.set_macs(p.dmac, p.smac);
            count(reason::FROM_POD_FIB_REDIRECT);
            kernel_nat::mark_forwarded(ctx);
            // SAFETY: plain helper call.
            unsafe { bpf_redirect(p.ifindex, 0) as i32 }
        }
        BPF_FIB_LKUP_RET_NO_NEIGH => {
            if h.ttl() <= 1 {
                count(reason::PASS_TTL);
                return TCX_NEXT;
            }
            // Without bpf_check_mtu (before 5.12) the kernel forwards the packet
            // itself: it resolves the neighbour and checks the MTU (the lookup
            // returns SUCCESS once the neighbour is known).
            if !crate::kernel::check_mtu() {
                count(reason::FROM_POD_FIB_PASS);
                return TCX_NEXT;
            }
            if kernel_flows && kernel_nat::is_kernel_flow(ctx, h, true) {
                count(reason::FROM_POD_KERNEL_FLOW);
                return TCX_NEXT;
            }
            // With tot_len 0 the kernel checks the MTU only on success; here
            // nobody has yet. Too big (GSO segments included): the kernel sends
            // "fragmentation needed" / "packet too big".
            let mut mtu: u32 = 0;
            // SAFETY: plain helper call with a valid out pointer.
            let rc = unsafe {
                bpf_check_mtu(
                    ctx.as_ptr(),
                    p.ifindex,
                    &mut mtu,
                    0,
                    u64::from(BPF_MTU_CHK_SEGS),
                )
            };
            if rc != 0 {
                count(reason::FROM_POD_FIB_FRAG_NEEDED);
                return TCX_NEXT;
            }
            h.decrement_ttl();
            // The lookup filled in the next hop (gateway or destination).
            // SAFETY: reading the union members the helper set for this family.
            let mut nh: bpf_redir_neigh = unsafe { core::mem::zeroed() };
            unsafe {
                if p.family == AF_INET {
                    nh.nh_family = u32::from(AF_INET);
                    nh.__bindgen_anon_1.ipv4_nh = p.__bindgen_anon_4.ipv4_dst;
                } else {
                    nh.nh_family = u32::from(AF_INET6);
                    nh.__bindgen_anon_1.ipv6_nh = p.__bindgen_anon_4.ipv6_dst;
                }
            }
            count(reason::FROM_POD_FIB_NEIGH);
            kernel_nat::mark_forwarded(ctx);
            // SAFETY: `nh` is a valid bpf_redir_neigh of the size passed.
            unsafe {
                bpf_redirect_neigh(p.ifindex, &mut nh, size_of::<bpf_redir_neigh>() as i32, 0)
                    as i32
            }
        }
        BPF_FIB_LKUP_RET_NOT_FWDED => {
            // One of the node's own addresses: kube-proxy may translate it
            // (a NodePort; IPVS's ClusterIPs are local addresses too).
            if kernel_flows {
                kernel_nat::note_client(ctx, h, ifindex);
            }
            count(reason::FROM_POD_NOT_FORWARDED);
            TCX_NEXT
        }
        BPF_FIB_LKUP_RET_FRAG_NEEDED => {
            count(reason::FROM_POD_FIB_FRAG_NEEDED);
            TCX_NEXT
        }
        BPF_FIB_LKUP_RET_BLACKHOLE | BPF_FIB_LKUP_RET_UNREACHABLE | BPF_FIB_LKUP_RET_PROHIBIT => {
            count(reason::FROM_POD_FIB_NO_ROUTE);
            TCX_NEXT
        }
        _ => {
            count(reason::FROM_POD_FIB_PASS);
            TCX_NEXT
        }
    }
}
