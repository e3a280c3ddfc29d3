//! Network namespaces under `/run/netns` (as `ip netns` keeps them), owned by a
//! [`Netns`] value that deletes its namespace when dropped, and the veth
//! "wires" between them. Only namespaces the caller made are touched.
use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use crate::{err, exec, Result};

/// `/run/netns/<name>`: what `CNI_NETNS` and `nsenter --net=` get.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Makes namespace `name` with `lo` up, not owned by any value (the caller
/// deletes it with [`delete`]). A namespace of that name can only be a leftover
/// of a dead run that used the same name, and is deleted first.
pub fn add(name: &str) -> Result<()> {
    if netns_path(name).exists() {
        let _ = exec::tool(None, "ip", &["netns", "del", name]);
    }
    exec::tool(None, "ip", &["netns", "add", name])?;
    exec::tool(None, "ip", &["-n", name, "link", "set", "lo", "up"]).map(drop)
}

/// Deletes namespace `name` (and with it its end of every wire) if it exists.
pub fn delete(name: &str) -> Result<()> {
    if netns_path(name).exists() {
        exec::tool(None, "ip", &["netns", "del", name])?;
    }
    Ok(())
}

/// `ip -n <netns> args...`, required to succeed; its stdout.
pub fn ip(netns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", netns];
    all.extend_from_slice(args);
    exec::tool(None, "ip", &all)
}

/// A veth pair from `a_if` in namespace `a` to `b_if` in namespace `b`, both
/// ends up with the given addresses (`ip/prefix`). It goes away with either
/// namespace.
pub fn wire(a: &str, a_if: &str, a_addr: &str, b: &str, b_if: &str, b_addr: &str) -> Result<()> {
    ip(
        a,
        &[
            "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b,
        ],
    )?;
    for (ns, dev, addr) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        ip(ns, &["addr", "add", addr, "dev", dev])?;
        ip(ns, &["link", "set", dev, "up"])?;
    }
    Ok(())
}

/// Whether something listens on TCP or UDP `port` inside the namespace at
/// `netns` (`ss`; no probe connection, which a one-shot server would take for
/// its client).
pub fn listening(netns: &Path, port: u16) -> Result<bool> {
    let out = exec::tool(Some(netns), "ss", &["-Hltun", &format!("sport = :{port}")])?;
    Ok(!out.trim().is_empty())
}

/// Waits until something listens on `port` inside `netns`, at most `limit`.
pub fn wait_listening(netns: &Path, port: u16, limit: Duration) -> Result<()> {
    let start = Instant::now();
    while !listening(netns, port)? {
        if start.elapsed() > limit {
            return Err(err!(
                "nothing listens on port {port} in {} after {limit:?}",
                netns.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A network namespace of its own, with `lo` up, deleted when dropped (also
/// while a failed test unwinds).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Makes namespace `name` (see [`add`]).
    pub fn add(name: impl Into<String>) -> Result<Self> {
        let ns = Self { name: name.into() };
        // From here on, Drop deletes whatever was made.
        add(&ns.name)?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// `ip -n <name> args...`, required to succeed; its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        ip(&self.name, args)
    }

    /// Whether the kernel makes a netkit pair here (Linux 6.7+ with
    /// `CONFIG_NETKIT`, built in or loadable); the pair made stays in this
    /// namespace, gone with it. Debian 12's iproute2 predates netkit: it sends
    /// the kind but takes no netkit options such as a peer name, so the kernel
    /// names the peer `nk%d` and the primary must not be `nk0`.
    pub fn makes_netkit(&self) -> bool {
        self.ip(&["link", "add", "probe0", "type", "netkit"])
            .is_ok()
    }

    /// `nsenter --net=<path> -- program`, to be given arguments and run: in the
    /// namespace without remounting /sys (`ip netns exec` does), so bpffs and
    /// the cgroup mounts stay visible.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = delete(&self.name) {
            eprintln!("cleanup: deleting netns {}: {e}", self.name);
        }
    }
}
