//! The few bpf(2) commands aya does not expose: opening a pin as an fd
//! (`BPF_OBJ_GET`) and pinning one (`BPF_OBJ_PIN`), netkit links
//! (`BPF_LINK_CREATE`), pointing a link at another program (`BPF_LINK_UPDATE`)
//! and detaching a link now (`BPF_LINK_DETACH`).
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use crate::error::Error;

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_DETACH: libc::c_long = 34;

/// bpf(2) with a zeroed `union bpf_attr` whose leading words are `words`.
fn bpf_cmd(cmd: libc::c_long, words: &[u64]) -> std::io::Result<i64> {
    let mut attr = [0u64; 16];
    attr[..words.len()].copy_from_slice(words);
    // SAFETY: a valid bpf_attr of the size passed; any pointer in `words` is the
    // caller's and outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// One attr word holding two `__u32` fields in memory order.
fn u32_pair(first: u32, second: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&first.to_ne_bytes());
    b[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(b)
}

/// A new fd of the BPF object pinned at `path` (`BPF_OBJ_GET`).
pub(super) fn obj_get(path: &Path) -> Result<OwnedFd, Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| Error::datapath(format!("open pin {}", path.display()), e))?;
    // `pathname` is the first word of the attr.
    let fd = bpf_cmd(BPF_OBJ_GET, &[c.as_ptr() as u64])
        .map_err(|e| Error::datapath(format!("open pin {}", path.display()), e))?;
    let fd = RawFd::try_from(fd)
        .map_err(|e| Error::datapath(format!("open pin {}", path.display()), e))?;
    // SAFETY: BPF_OBJ_GET returned a new fd that only this owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// netkit's hooks (`enum bpf_attach_type`, Linux 6.7): the primary device's
/// own transmit, and its peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NetkitHook {
    Primary = 54,
    Peer = 55,
}

/// A netkit link of program `prog_fd` on the hook of the netkit pair whose
/// primary (host) device is `ifindex` (`BPF_LINK_CREATE`; aya 0.14 has no
/// netkit links). Appended after any program already there.
pub(super) fn netkit_link_create(
    prog_fd: RawFd,
    ifindex: u32,
    hook: NetkitHook,
) -> std::io::Result<OwnedFd> {
    // link_create: prog_fd, target_ifindex, attach_type, flags (u32 each); the
    // netkit part (relative_fd, expected_revision) stays zero.
    let fd = bpf_cmd(
        BPF_LINK_CREATE,
        &[
            u32_pair(prog_fd.cast_unsigned(), ifindex),
            u32_pair(hook as u32, 0),
        ],
    )?;
    let fd = RawFd::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: BPF_LINK_CREATE returned a new fd that only this owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins the BPF object `fd` at `path` (`BPF_OBJ_PIN`).
pub(super) fn obj_pin(fd: &OwnedFd, path: &Path) -> Result<(), Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| Error::datapath(format!("pin {}", path.display()), e))?;
    // obj_pin: pathname (a pointer), bpf_fd, file_flags.
    bpf_cmd(
        BPF_OBJ_PIN,
        &[
            c.as_ptr() as u64,
            u32_pair(fd.as_raw_fd().cast_unsigned(), 0),
        ],
    )
    .map(drop)
    .map_err(|e| Error::datapath(format!("pin {}", path.display()), e))
}

/// Points the link pinned at `link_path` at program `prog_fd` in place
/// (`BPF_LINK_UPDATE`, Linux 5.7; aya has no update for cgroup links).
pub(super) fn link_update(link_path: &Path, prog_fd: RawFd) -> std::io::Result<()> {
    let link_fd = obj_get(link_path).map_err(std::io::Error::other)?;
    // link_update: link_fd, new_prog_fd (u32 each, in the first word).
    // File descriptors are never negative.
    let word = u32_pair(link_fd.as_raw_fd().cast_unsigned(), prog_fd.cast_unsigned());
    bpf_cmd(BPF_LINK_UPDATE, &[word]).map(drop)
}

/// Detaches the link pinned at `link_path` now (`BPF_LINK_DETACH`, Linux 5.9),
/// rather than when its last reference goes.
pub(super) fn link_detach(link_path: &Path) -> std::io::Result<()> {
    let fd = obj_get(link_path).map_err(std::io::Error::other)?;
    // `link_fd` is the first word of the attr.
    bpf_cmd(
        BPF_LINK_DETACH,
        &[u32_pair(fd.as_raw_fd().cast_unsigned(), 0)],
    )
    .map(drop)
}
