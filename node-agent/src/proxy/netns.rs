//! The agent's own network namespace (the node's), as the cookie the socket
//! hooks compare with `bpf_get_netns_cookie`: a connect from it to a
//! Service without endpoints is refused at the socket; from a pod's it goes
//! on and the pod's tc program answers port unreachable (see the eBPF
//! crate's `lb::reject`).
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `SO_NETNS_COOKIE` (include/uapi/asm-generic/socket.h; Linux 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The cookie of this process's network namespace; `None` where the kernel
/// does not tell it (before 5.14).
pub(crate) fn own_cookie() -> Option<u64> {
    // SAFETY: plain syscall; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut len = super::udp_sockets::socklen::<u64>();
    // SAFETY: `cookie` and `len` are valid for the kernel to write.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    (rc == 0 && cookie != 0).then_some(cookie)
}

#[cfg(test)]
mod tests {
    /// The kernel gives one cookie per namespace: asked twice, the same.
    #[test]
    fn the_cookie_is_stable() {
        assert_eq!(super::own_cookie(), super::own_cookie());
    }
}
