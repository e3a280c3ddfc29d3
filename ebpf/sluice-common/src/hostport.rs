//! hostPort: the mappings (`sl_ports`), translated flows (`sl_hp_ct`), the
//! node addresses wildcard mappings match (`sl_node_addrs`) and the socket
//! hooks' state (`sl_hp_sock`, `sl_hp_config`).

use crate::Addr6;

/// A hostPort mapping's key for addresses `A` (`[u8; 4]`: `sl_ports`,
/// [`Addr6`]: `sl_ports6`). `host_ip` all zeroes: every node address (and
/// 127.0.0.1 or `::1` for the node's own sockets). Port in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PortKeyOf<A> {
    pub host_ip: A,
    pub host_port: u16,
    pub proto: u8,
    pub _pad: u8,
}

/// An IPv4 mapping's key (`sl_ports`).
pub type PortKey = PortKeyOf<[u8; 4]>;
/// An IPv6 mapping's key (`sl_ports6`).
pub type PortKey6 = PortKeyOf<Addr6>;

impl<A: Copy + Default> PortKeyOf<A> {
    /// The key of `host_ip` (zeroes: every node address), `port` in host byte
    /// order, IP protocol number `proto`.
    #[inline(always)]
    pub fn new(host_ip: A, port: u16, proto: u8) -> Self {
        Self {
            host_ip,
            host_port: port.to_be(),
            proto,
            _pad: 0,
        }
    }

    /// The same key for every node address (a wildcard mapping).
    #[inline(always)]
    pub fn any_address(&self) -> Self {
        Self {
            host_ip: A::default(),
            ..*self
        }
    }

    /// The port in host byte order.
    pub const fn port(&self) -> u16 {
        u16::from_be(self.host_port)
    }
}

/// The address types the generic hostPort structs are used with: with them the
/// structs have no implicit padding (the size tests check it), so they are
/// plain data for the maps.
pub trait HpAddr: Copy + Default + PartialEq + 'static {}
impl HpAddr for [u8; 4] {}
impl HpAddr for Addr6 {}

/// Where a hostPort goes. Port in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PortTargetOf<A> {
    pub pod_ip: A,
    pub pod_port: u16,
    /// [`port_flags`].
    pub flags: u16,
    /// Host veth of the pod: its owner is in `sl_ep_info`.
    pub pod_ifindex: u32,
}

pub type PortTarget = PortTargetOf<[u8; 4]>;
pub type PortTarget6 = PortTargetOf<Addr6>;

pub mod port_flags {
    /// Added by an operator (`sluicectl ports add`), not by a CNI ADD.
    pub const OPERATOR: u16 = 1 << 0;
}

/// How a packet of a translated hostPort flow is rewritten (all of it: both
/// addresses and ports; ports in network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HpFlowOf<A> {
    pub src_ip: A,
    pub dst_ip: A,
    pub src_port: u16,
    pub dst_port: u16,
    pub _pad: u32,
}

/// `sl_hp_ct`'s values.
pub type HpFlow = HpFlowOf<[u8; 4]>;
/// `sl_hp_ct6`'s values.
pub type HpFlow6 = HpFlowOf<Addr6>;

/// A node socket and the pod address it was sent to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockKey {
    pub cookie: u64,
    pub pod_ip: [u8; 4],
    pub pod_port: u16,
    pub _pad: u16,
}

/// [`SockKey`] of an IPv6 socket (its own type: the IPv6 address leaves four
/// bytes of padding, spelled out so that no uninitialised byte is hashed).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockKey6 {
    pub cookie: u64,
    pub pod_ip: Addr6,
    pub pod_port: u16,
    pub _pad: u16,
    pub _pad2: u32,
}

/// What the socket asked for (network byte order port).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockOrigOf<A> {
    pub ip: A,
    pub port: u16,
    pub _pad: u16,
}

pub type SockOrig = SockOrigOf<[u8; 4]>;
pub type SockOrig6 = SockOrigOf<Addr6>;

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
