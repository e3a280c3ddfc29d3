//! Kubernetes Services translated by Sluice itself (the agent's Service
//! mode, instead of kube-proxy): the frontends (`sl_lb_svc`: a Service
//! address, port and protocol), their backends (`sl_lb_be`: slot `0..count`
//! of a Service's id), and the sockets the hooks pointed at a backend
//! (`sl_lb_sock`: `recvmsg`/`getpeername` show the Service address again).
//!
//! Both families share the maps: addresses are [`IpKey`]s (IPv4 as
//! IPv4-mapped IPv6); ports are in network byte order.
//!
//! The agent writes a Service's backends before the frontend that names
//! their count, and lowers the count before it removes a slot, so a hook
//! never picks a slot that is not there (Cilium orders its writes the same).
use crate::IpKey;

/// A Service frontend: a ClusterIP (or external, load balancer) address, a
/// port and a protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SvcKey {
    pub addr: IpKey,
    /// Network byte order.
    pub port: u16,
    /// `IPPROTO_TCP`, `IPPROTO_UDP` (SCTP is left to the stack).
    pub proto: u8,
    /// [`svc_scope`]: who the frontend is for.
    pub scope: u8,
}

impl SvcKey {
    /// A frontend for the node's own connections (the socket hooks).
    #[inline(always)]
    pub const fn new(addr: IpKey, port: u16, proto: u8) -> Self {
        Self {
            addr,
            port,
            proto,
            scope: svc_scope::NODE,
        }
    }

    /// The same frontend for traffic arriving on the uplink.
    #[inline(always)]
    pub const fn external(self) -> Self {
        Self {
            scope: svc_scope::EXTERNAL,
            ..self
        }
    }
}

/// Values of [`SvcKey::scope`]. A NodePort, an external IP or a load
/// balancer IP has a frontend of each scope: `externalTrafficPolicy: Local`
/// gives the uplink's only this node's endpoints, while the node's own
/// clients (pods, processes) keep every endpoint, as kube-proxy does.
pub mod svc_scope {
    /// Connections made on the node (looked up by the socket hooks).
    pub const NODE: u8 = 0;
    /// Packets from the uplink (looked up by `uplink_in`).
    pub const EXTERNAL: u8 = 1;
}

/// What a frontend leads to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SvcValue {
    /// The Service port's id: the first half of its backends' keys, and its
    /// counters' index.
    pub id: u32,
    /// Backends in slots `0..count`; 0: the Service has no endpoint, and a
    /// connection to it is refused.
    pub count: u32,
    /// [`svc_flags`].
    pub flags: u32,
    /// `sessionAffinity: ClientIP`: a client keeps its backend this long
    /// after its last new connection (seconds); 0: none.
    pub affinity_secs: u32,
}

/// Bits of [`SvcValue::flags`].
pub mod svc_flags {
    /// The backends in the slots are terminating ones (no ready endpoint is
    /// left; kube-proxy then uses the serving terminating endpoints).
    pub const TERMINATING: u32 = 1;
    /// A frontend whose Service port has no endpoint at all (not only none
    /// on this node): its opening packets are answered with port
    /// unreachable, as kube-proxy's `REJECT` rules in `KUBE-SERVICES` (a
    /// ClusterIP, from a pod or routed from outside) and
    /// `KUBE-EXTERNAL-SERVICES` (from outside) answer them; without it an
    /// empty frontend (a `Local` traffic policy, no local endpoint) drops
    /// them, as kube-proxy does.
    pub const REJECT: u32 = 2;
}

/// A backend slot of a Service port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct BackendKey {
    pub id: u32,
    pub slot: u32,
}

/// One endpoint of a Service port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Backend {
    pub addr: IpKey,
    /// Network byte order.
    pub port: u16,
    /// Zero.
    pub _pad: u16,
}

/// A client of a Service port with session affinity: the port's id and the
/// client's network namespace (its cookie: a pod, or the node itself; the
/// socket hooks run before the socket has a source address).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    pub netns_cookie: u64,
    pub id: u32,
    /// Zero.
    pub _pad: u32,
}

/// The backend a client of a Service port with affinity keeps.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Affinity {
    /// `bpf_ktime_get_ns` of its last new connection.
    pub last_ns: u64,
    /// The slot it had, and what was in it (a slot rewritten since holds
    /// another backend: then a new one is picked).
    pub slot: u32,
    /// Zero.
    pub _pad: u32,
    pub backend: Backend,
    /// Zero (no implicit padding at the end).
    pub _pad2: u32,
}

/// A socket a hook pointed at a backend: its cookie and the backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LbSockKey {
    pub cookie: u64,
    pub addr: IpKey,
    /// Network byte order.
    pub port: u16,
    /// Zero (two fields: no implicit padding).
    pub _pad: u16,
    pub _pad2: u32,
}

/// The Service address and port the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LbSockOrig {
    pub addr: IpKey,
    /// Network byte order.
    pub port: u16,
    /// Zero.
    pub _pad: u16,
}

/// Index 0 of `sl_lb_cfg`: what the hooks know of the node (the agent
/// writes it with the frontends).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LbConfig {
    /// The node's own network namespace, as its cookie (`SO_NETNS_COOKIE`,
    /// Linux 5.14); 0: not known. A connect to a Service without endpoints
    /// from the node's namespace (or from any, while this is 0) is refused
    /// at the socket (`EPERM`); from a pod's it goes on untranslated and the
    /// pod's tc program answers with port unreachable, as kube-proxy's
    /// `REJECT` rule does (`ECONNREFUSED`).
    pub node_netns: u64,
    /// [`lb_flags`].
    pub flags: u32,
    /// The node's IPv4 address a flow from the uplink to a backend on
    /// another node leaves with (source NAT, `externalTrafficPolicy:
    /// Cluster`) when it was not sent to a node address; zeros: none.
    pub snat4: [u8; 4],
}

/// Bits of [`LbConfig::flags`].
pub mod lb_flags {
    /// Some frontend is a NodePort (the unspecified address): a connect to a
    /// node address looks for one. Without it that lookup is skipped.
    pub const NODE_PORTS: u32 = 1;
    /// Some Service port has no endpoint: `from_pod` looks a pod's opening
    /// packets up among the frontends (to answer port unreachable). Without
    /// it a pod's UDP datagrams and TCP SYNs pay no hash lookup for it.
    pub const EMPTY_SERVICES: u32 = 2;
    /// Some frontend is an external one ([`super::svc_scope::EXTERNAL`]):
    /// `uplink_in` looks packets up among them and in `sl_lb_ct`, and
    /// `from_pod` looks replies up in `sl_lb_ct`. Without it neither pays a
    /// lookup.
    pub const EXTERNAL: u32 = 4;
    /// The socket hooks' cgroup is not the whole node's: a pod's packets to
    /// a ClusterIP that no hook translated (a pod outside that cgroup) are
    /// translated per flow in `from_pod` (`sl_lb_ct`), and so every packet a
    /// pod sends pays one `sl_lb_ct` lookup. The agent sets it only when
    /// its hooks are not on the cgroup root.
    pub const PER_PACKET: u32 = 8;
}
