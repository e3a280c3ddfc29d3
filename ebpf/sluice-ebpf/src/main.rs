//! Sluice's datapath: TC programs attached to each pod's host-side veth.
//!
//! `from_pod` runs on tc ingress of the host veth (packets the pod sent),
//! `to_pod` on tc egress (packets going into the pod).
#![no_std]
#![no_main]

mod endpoint;
mod maps;

use aya_ebpf::{macros::classifier, programs::TcContext};

/// tcx verdict that hands the packet to the next program, or to the kernel when
/// there is none (`TCX_NEXT`, the same value as `TC_ACT_UNSPEC` for cls_bpf).
const TCX_NEXT: i32 = -1;

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    endpoint::count_from_pod(&ctx);
    TCX_NEXT
}

#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    endpoint::count_to_pod(&ctx);
    TCX_NEXT
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach here; this only satisfies rustc.
    loop {}
}
