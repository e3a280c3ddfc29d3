//! hostPort: the mappings (`sl_ports`), translated flows (`sl_hp_ct`), the
//! node addresses wildcard mappings match (`sl_node_addrs`) and the socket
//! hooks' state (`sl_hp_sock`, `sl_hp_config`).

/// A hostPort mapping's key. `host_ip` 0.0.0.0: every node address (and
/// 127.0.0.1 for the node's own sockets). Port in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PortKey {
    pub host_ip: [u8; 4],
    pub host_port: u16,
    pub proto: u8,
    pub _pad: u8,
}

impl PortKey {
    /// The key of `host_ip` (0.0.0.0: every node address), `port` in host byte
    /// order, IP protocol number `proto`.
    #[inline(always)]
    pub const fn new(host_ip: [u8; 4], port: u16, proto: u8) -> Self {
        Self {
            host_ip,
            host_port: port.to_be(),
            proto,
            _pad: 0,
        }
    }

    /// The same key for every node address (a wildcard mapping).
    #[inline(always)]
    pub const fn any_address(&self) -> Self {
        Self {
            host_ip: [0; 4],
            ..*self
        }
    }

    /// The port in host byte order.
    pub const fn port(&self) -> u16 {
        u16::from_be(self.host_port)
    }
}

/// Where a hostPort goes. Port in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PortTarget {
    pub pod_ip: [u8; 4],
    pub pod_port: u16,
    /// [`port_flags`].
    pub flags: u16,
    /// Host veth of the pod: its owner is in `sl_ep_info`.
    pub pod_ifindex: u32,
}

pub mod port_flags {
    /// Added by an operator (`sluicectl ports add`), not by a CNI ADD.
    pub const OPERATOR: u16 = 1 << 0;
}

/// How a packet of a translated hostPort flow is rewritten (all of it: both
/// addresses and ports; ports in network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HpFlow {
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub _pad: u32,
}

/// A node socket and the pod address it was sent to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockKey {
    pub cookie: u64,
    pub pod_ip: [u8; 4],
    pub pod_port: u16,
    pub _pad: u16,
}

/// What the socket asked for (network byte order port).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockOrig {
    pub ip: [u8; 4],
    pub port: u16,
    pub _pad: u16,
}

/// hostPort settings, at index 0 of `sl_hp_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HostPortConfig {
    /// The node namespace's cookie (`SO_NETNS_COOKIE)`: the socket hooks act only
    /// on sockets there, whatever cgroup they run in.
    pub netns_cookie: u64,
    /// Non-zero once a mapping was added (until then the pod programs skip the
    /// flow lookup). Never reset while the datapath lives: concurrent ADDs and
    /// DELs could not keep a count exact.
    pub active: u32,
    pub _pad: u32,
}
