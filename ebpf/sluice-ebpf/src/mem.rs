//! Zeroing without `memset` (see [`zero_words`]).

/// Zeroes the `T` at `t` with volatile 4-byte stores. bpf-linker has LLVM
/// expand `memcpy` inline but leaves `memset` (and `memmove`) as calls to a
/// byte-at-a-time loop: `mem::zeroed` of the 64-byte FIB parameters cost a
/// 64-round loop per forwarded packet, and an `Event::default()` one call
/// deeper than the 512 bytes of stack a chain may use allow under `uplink_in`
/// on 5.10. (Linking with
/// `--disable-expand-memcpy-in-order` instead made 6.1's verifier refuse
/// `uplink_in`, see docs/kernels.md.)
///
/// # Safety
/// `t` points to a writable `T`.
#[inline(always)]
pub unsafe fn zero_words<T>(t: *mut T) {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(4) && core::mem::align_of::<T>() >= 4) };
    let w = t.cast::<u32>();
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 4 {
        // SAFETY: the caller's contract; i stays inside the `T`.
        unsafe { w.add(i).write_volatile(0) };
        i += 1;
    }
}
