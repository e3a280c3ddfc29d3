//! The destination of a cgroup `sock_addr` hook's socket, as the hooks of
//! hostPort and Services read and write it.
use aya_ebpf::programs::SockAddrContext;
use sluice_common::Addr6;

/// The destination of an IPv6 socket's connect/sendmsg (`user_ip6`, network
/// byte order words).
#[inline(always)]
pub fn user_ip6(ctx: &SockAddrContext) -> Addr6 {
    // SAFETY: the kernel passes a valid bpf_sock_addr; `user_ip6` is read as
    // the four 4-byte words the verifier allows.
    let w = unsafe { (*ctx.sock_addr).user_ip6 };
    let mut a = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let b = w[i].to_ne_bytes();
        a[i * 4] = b[0];
        a[i * 4 + 1] = b[1];
        a[i * 4 + 2] = b[2];
        a[i * 4 + 3] = b[3];
        i += 1;
    }
    Addr6(a)
}

/// Writes `a` as the socket's destination (`user_ip6`, word by word).
#[inline(always)]
pub fn set_user_ip6(ctx: &SockAddrContext, a: &Addr6) {
    let mut i = 0;
    while i < 4 {
        let w = u32::from_ne_bytes([a.0[i * 4], a.0[i * 4 + 1], a.0[i * 4 + 2], a.0[i * 4 + 3]]);
        // SAFETY: a writable field of the connect6/sendmsg6/recvmsg6/
        // getpeername6 hooks, written as 4-byte words.
        unsafe { (*ctx.sock_addr).user_ip6[i] = w };
        i += 1;
    }
}
