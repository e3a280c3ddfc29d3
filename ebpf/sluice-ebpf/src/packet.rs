//! Bounds-checked access to packet headers, for tc and XDP alike.
use core::mem::size_of;

use aya_ebpf::programs::{TcContext, XdpContext};

/// Direct packet access: the verifier only allows a read or write at
/// `data + off` after a comparison against `data_end`.
pub trait Packet {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Bytes in the whole frame (for an skb also the parts not directly readable).
    fn frame_len(&self) -> usize;
}

impl Packet for TcContext {
    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }
    #[inline(always)]
    fn frame_len(&self) -> usize {
        self.len() as usize
    }
}

impl Packet for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }
    #[inline(always)]
    fn frame_len(&self) -> usize {
        XdpContext::data_end(self) - XdpContext::data(self)
    }
}

/// A pointer to a `T` at `off`, if the whole `T` lies inside the packet.
#[inline(always)]
pub fn ptr_at<T>(p: &impl Packet, off: usize) -> Option<*mut T> {
    let start = p.data();
    let end = p.data_end();
    if start + off + size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *mut T)
}

/// A `T` at `off` of an skb: read straight from the linear data when it lies
/// there, else copied out with `bpf_skb_load_bytes` (a header in a paged
/// fragment). The common case costs a bounds check instead of a helper call
/// per field. At least two bytes: for one byte at a variable offset LLVM turns
/// `data + off + 1 > data_end` into `data + off >= data_end`, from which the
/// verifier learns no readable range.
#[inline(always)]
pub fn read<T: Copy>(ctx: &TcContext, off: usize) -> Result<T, i64> {
    const { assert!(size_of::<T>() >= 2) };
    match ptr_at::<T>(ctx, off) {
        // SAFETY: bounds checked by ptr_at; packet data has no alignment.
        Some(p) => Ok(unsafe { p.cast_const().read_unaligned() }),
        None => ctx.load(off),
    }
}

/// Makes the first `len` bytes of a (possibly non-linear) skb directly readable
/// (`bpf_skb_pull_data`); a failure shows up as the bounds check failing later.
#[inline(always)]
pub fn pull(ctx: &TcContext, len: usize) {
    if ctx.data() + len > ctx.data_end() {
        let _ = ctx.pull_data(len as u32);
    }
}
