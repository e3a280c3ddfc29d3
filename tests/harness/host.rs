//! Namespaces beside the nodes: an external host a node's uplink is wired to
//! (see [`sluice_testbed::world`]). Only namespaces a test made are touched;
//! dropping a [`Host`] deletes its namespace and with it its end of every wire.
use std::path::{Path, PathBuf};

pub use sluice_testbed::netns::{ip, wire};
use sluice_testbed::Netns;

use crate::{exec, node::unique_name, Result};

/// A network namespace of its own (`slt<pid>h<n>`), with `lo` up, deleted when
/// dropped, also while a failed test unwinds.
pub struct Host {
    ns: Netns,
}

impl Host {
    pub fn new() -> Result<Self> {
        Ok(Self {
            ns: Netns::add(unique_name('h'))?,
        })
    }

    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// `/run/netns/<name>`.
    pub fn netns_path(&self) -> PathBuf {
        self.ns.path()
    }

    /// `ip -n <host> args...`, required to succeed.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        self.ns.ip(args)
    }

    /// Whether the kernel makes a netkit pair in this namespace.
    pub fn makes_netkit(&self) -> bool {
        self.ns.makes_netkit()
    }
}

/// `ethtool -K <dev> tx off` in the namespace at `netns` (one of the test's own):
/// the stack then finishes TCP/UDP checksums before the frame leaves `dev`. A
/// native-XDP veth on the other end drops the `CHECKSUM_PARTIAL` state a frame
/// from its peer carries, so a test of native XDP on a veth turns this off on
/// the sending side, as a physical NIC would deliver complete checksums.
pub fn tx_checksum_off(netns: &Path, dev: &str) -> Result<()> {
    exec::tool(Some(netns), "ethtool", &["-K", dev, "tx", "off"]).map(drop)
}

/// Turns GRO on for `dev` in `netns`: a veth receives what its peer's XDP
/// sends back (`XDP_TX`) or redirects to it only with NAPI on, which GRO
/// turns on (Linux 5.13 on; before, only an XDP program of its own).
pub fn gro_on(netns: &Path, dev: &str) -> Result<()> {
    exec::tool(Some(netns), "ethtool", &["-K", dev, "gro", "on"]).map(drop)
}
