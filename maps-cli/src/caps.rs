//! The capabilities write commands need. Pinned maps are opened through bpffs
//! file permissions, and writing a map through its fd needs no capability at
//! all, so a root process stripped of its capabilities (a container's root, a
//! `setpriv --bounding-set` shell) could otherwise change the datapath. Writes
//! change how the node handles packets: they need `CAP_NET_ADMIN`, and `CAP_BPF`
//! (or `CAP_SYS_ADMIN`, which implied it before Linux 5.8), as `tc` and `bpftool`
//! would.
use anyhow::{bail, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// `struct __user_cap_header_struct` / `__user_cap_data_struct` (linux/capability.h).
#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The effective capability set of this process, as a 64-bit mask.
fn effective() -> Result<u64> {
    let mut h = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget(2) with a v3 header and room for its two data structs.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut h, d.as_mut_ptr()) };
    if rc != 0 {
        bail!(
            "reading this process's capabilities: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(u64::from(d[0].effective) | (u64::from(d[1].effective) << 32))
}

fn has(mask: u64, cap: u32) -> bool {
    mask & (1 << cap) != 0
}

/// What a mask lacks for a write, by name; empty when it has enough.
fn missing_for_write(mask: u64) -> Vec<&'static str> {
    let mut out = Vec::new();
    if !has(mask, CAP_NET_ADMIN) {
        out.push("CAP_NET_ADMIN");
    }
    if !has(mask, CAP_BPF) && !has(mask, CAP_SYS_ADMIN) {
        out.push("CAP_BPF (or CAP_SYS_ADMIN)");
    }
    out
}

/// Refuses a write (`what`) unless the process may change the datapath.
pub(crate) fn require_write(what: &str) -> Result<()> {
    let missing = missing_for_write(effective()?);
    if !missing.is_empty() {
        bail!(
            "{what} changes the datapath and needs {}; this process lacks it (run as root with full capabilities)",
            missing.join(" and ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_need_net_admin_and_bpf_or_sys_admin() {
        let all = u64::MAX;
        assert!(missing_for_write(all).is_empty());
        assert_eq!(missing_for_write(0).len(), 2);
        assert!(missing_for_write((1 << CAP_NET_ADMIN) | (1 << CAP_BPF)).is_empty());
        assert!(missing_for_write((1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)).is_empty());
        assert_eq!(
            missing_for_write(1 << CAP_BPF),
            vec!["CAP_NET_ADMIN"],
            "BPF alone does not allow changing packet handling"
        );
    }
}
