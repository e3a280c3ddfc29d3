//! Userspace helpers shared by the plugin and `sluicectl`.
extern crate std;
use std::{format, path::PathBuf, string::String, string::ToString};

/// The directory name of a network under [`crate::DEFAULT_PIN_BASE`]. bpffs
/// refuses names with a dot (EPERM from `bpf_lookup`, kernel/bpf/inode.c), which
/// network names may have: those get the dots replaced and a hash of the real
/// name appended, so distinct networks keep distinct directories.
pub fn pin_dir_name(network: &str) -> String {
    if network.contains('.') {
        let h = crate::fnv1a64(network.as_bytes());
        format!("{}-{:08x}", network.replace('.', "_"), h & 0xffff_ffff)
    } else {
        network.to_string()
    }
}

/// The default pin root of a network.
pub fn default_pin_root(network: &str) -> PathBuf {
    PathBuf::from(crate::DEFAULT_PIN_BASE).join(pin_dir_name(network))
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`,
/// Linux 5.14): the hostPort socket hooks act only on sockets whose namespace
/// has the cookie written in `sl_hp_config`.
/// `SLUICE_DISABLE_FEATURES=netns_cookie` makes it fail as before 5.14 (so the
/// fallback is tested on any kernel).
pub fn netns_cookie() -> std::io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    if std::env::var("SLUICE_DISABLE_FEATURES")
        .is_ok_and(|v| v.split(',').any(|f| f.trim() == "netns_cookie"))
    {
        return Err(std::io::Error::from_raw_os_error(libc::ENOPROTOOPT));
    }
    let s = std::net::UdpSocket::bind("0.0.0.0:0")
        .or_else(|_| std::net::UdpSocket::bind("127.0.0.1:0"))?;
    sockopt_u64(&s, SO_NETNS_COOKIE)
}

/// A 64-bit `SOL_SOCKET` option of a socket (`SO_COOKIE`, `SO_NETNS_COOKIE`).
pub fn sockopt_u64(s: &impl std::os::fd::AsRawFd, opt: libc::c_int) -> std::io::Result<u64> {
    let mut value: u64 = 0;
    // size_of::<u64>()
    let mut len: libc::socklen_t = 8;
    // SAFETY: a valid socket fd, an 8-byte out buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw mut value).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(value)
}

/// `CLOCK_MONOTONIC` in ns: the programs' clock (`bpf_ktime_get_ns`), with
/// which flows and token buckets are stamped.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup` on a unified
/// system, `/sys/fs/cgroup/unified` on a hybrid (v1 + v2) one. Socket hooks
/// attach to v2 cgroups only. Those two are asked with `statfs` first: the
/// mount table holds a namespace bind mount per pod (`/run/netns/...`), so
/// reading it costs an ADD more the more pods the node has.
pub fn cgroup2_mount() -> Option<PathBuf> {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let is_cgroup2 = |dir: &str| -> bool {
        let Ok(path) = std::ffi::CString::new(dir) else {
            return false;
        };
        // SAFETY: a NUL-terminated path and a zeroed out struct of the right type.
        #[allow(
            clippy::useless_conversion,
            reason = "f_type is an i64 here, a narrower type on other targets"
        )]
        unsafe {
            let mut st: libc::statfs = core::mem::zeroed();
            libc::statfs(path.as_ptr(), &raw mut st) == 0
                && i64::from(st.f_type) == CGROUP2_SUPER_MAGIC
        }
    };
    for dir in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if is_cgroup2(dir) {
            return Some(PathBuf::from(dir));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}
