//! Kernel features the loader found (see `sluice_common::kernel_features`):
//! a read-only global the loader writes before the programs are verified.
use sluice_common::kernel_features;

/// Written by the loader (`EbpfLoader::set_global`); 0 in the object.
#[no_mangle]
static SLUICE_KERNEL_FEATURES: u32 = 0;

#[inline(always)]
fn has(feature: u32) -> bool {
    // SAFETY: a read of a global; volatile so that the compiler keeps the load
    // the verifier resolves to the value the loader wrote.
    unsafe { core::ptr::read_volatile(&raw const SLUICE_KERNEL_FEATURES) & feature != 0 }
}

/// `bpf_check_mtu` is there (Linux 5.12).
#[inline(always)]
pub fn check_mtu() -> bool {
    has(kernel_features::CHECK_MTU)
}

/// `bpf_ktime_get_coarse_ns` is there (Linux 5.11).
#[inline(always)]
pub fn ktime_coarse() -> bool {
    has(kernel_features::KTIME_COARSE)
}

/// IPv6 masquerade is on this kernel (see
/// `sluice_common::kernel_features::MASQ6`).
#[inline(always)]
pub fn masq6() -> bool {
    has(kernel_features::MASQ6)
}

/// No NAT sweeper on this kernel: flows expire when met (see
/// `sluice_common::kernel_features::LAZY_EXPIRY`).
#[inline(always)]
pub fn lazy_expiry() -> bool {
    has(kernel_features::LAZY_EXPIRY)
}
