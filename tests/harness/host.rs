//! Namespaces beside the nodes: an external host a node's uplink is wired to, and
//! the veth "wires" between namespaces. Only namespaces a test made are touched;
//! dropping a [`Host`] deletes its namespace and with it its end of every wire.
use std::path::{Path, PathBuf};

use crate::{
    exec,
    node::{add_netns, netns_path, unique_name},
    Result,
};

/// A network namespace of its own (`slt<pid>h<n>`), with `lo` up, deleted when
/// dropped, also while a failed test unwinds.
pub struct Host {
    name: String,
}

impl Host {
    pub fn new() -> Result<Self> {
        let host = Self {
            name: unique_name('h'),
        };
        add_netns(&host.name)?;
        Ok(host)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn netns_path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// `ip -n <host> args...`, required to succeed.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        ip(&self.name, args)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if netns_path(&self.name).exists() {
            if let Err(e) = exec::tool(None, "ip", &["netns", "del", &self.name]) {
                eprintln!("cleanup: deleting netns {}: {e}", self.name);
            }
        }
    }
}

/// `ip -n <netns> args...`, required to succeed.
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

/// `ethtool -K <dev> tx off` in the namespace at `netns` (one of the test's own):
/// the stack then finishes TCP/UDP checksums before the frame leaves `dev`. A
/// native-XDP veth on the other end drops the `CHECKSUM_PARTIAL` state a frame
/// from its peer carries, so a test of native XDP on a veth turns this off on
/// the sending side, as a physical NIC would deliver complete checksums.
pub fn tx_checksum_off(netns: &Path, dev: &str) -> Result<()> {
    exec::tool(Some(netns), "ethtool", &["-K", dev, "tx", "off"]).map(drop)
}
