//! The registry of programs: every program's name (in the object and under
//! `progs/`) and where it attaches.

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgKind {
    /// tc ingress of a pod's host veth.
    PodIngress,
    /// A netkit pod's hook for what the pod sends (`BPF_NETKIT_PEER`, on the
    /// host device; the program runs in the pod device's transmit).
    PodNetkit,
    /// A netkit pod's hook for what goes to it (`BPF_NETKIT_PRIMARY`: the host
    /// device's transmit).
    PodNetkitPrimary,
    /// tc egress of a pod's host veth.
    PodEgress,
    /// tc egress of the pod's own `eth0`, inside its namespace (EDT).
    PodDevice,
    /// tc ingress of the node's uplink.
    UplinkIngress,
    /// tc egress of the node's uplink.
    UplinkEgress,
    /// XDP on the node's uplink.
    UplinkXdp,
    /// A CPU-clock perf event (the NAT sweeper).
    PerfEvent,
    /// A cgroup socket-address hook.
    SockAddr(SockHook),
}

/// The cgroup `sock_addr` attach points of the socket hooks (hostPort, Services).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockHook {
    Connect4,
    SendMsg4,
    RecvMsg4,
    GetPeerName4,
    Connect6,
    SendMsg6,
    RecvMsg6,
    GetPeerName6,
}

/// One program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgSpec {
    pub name: &'static str,
    pub kind: ProgKind,
}

/// Names of the programs in the object (and of their pins under `progs/`).
pub mod prog_names {
    /// tc ingress of a host veth: packets coming from the pod.
    pub const FROM_POD: &str = "from_pod";
    /// tc egress of a host veth: packets going to the pod.
    pub const TO_POD: &str = "to_pod";
    /// `from_pod` for a netkit pod (`BPF_NETKIT_PEER`): the same checks, but
    /// another pod on the node is reached with `bpf_redirect`, as
    /// `bpf_redirect_peer` only works from tc ingress.
    pub const FROM_NETKIT_POD: &str = "from_netkit_pod";
    /// `to_pod` for a netkit pod (`BPF_NETKIT_PRIMARY`). netkit has switched
    /// `skb->dev` to the pod's device when it runs, so the pod is found by
    /// the packet's destination instead.
    pub const TO_NETKIT_POD: &str = "to_netkit_pod";
    /// tc egress of a pod's own `eth0` (in its namespace, with `fq` as its
    /// root qdisc): EDT departure times for the pod's egress limit.
    pub const POD_EDT: &str = "pod_edt";
    /// tc ingress of the node's uplink.
    pub const UPLINK_IN: &str = "uplink_in";
    /// tc egress of the node's uplink (masquerade).
    pub const UPLINK_OUT: &str = "uplink_out";
    /// Perf-event program that deletes expired NAT flows, once a second.
    pub const NAT_SWEEP: &str = "nat_sweep";
    /// XDP on the node's uplink.
    pub const UPLINK_XDP: &str = "uplink_xdp";
    /// cgroup/connect4: node sockets connecting to a hostPort go to the pod.
    pub const HP_CONNECT4: &str = "hp_connect4";
    /// cgroup/sendmsg4: the same for unconnected UDP.
    pub const HP_SENDMSG4: &str = "hp_sendmsg4";
    /// cgroup/recvmsg4: UDP answers appear to come from the hostPort.
    pub const HP_RECVMSG4: &str = "hp_recvmsg4";
    /// cgroup/getpeername4: the peer is the address the socket connected to.
    pub const HP_GETPEERNAME4: &str = "hp_getpeername4";
    /// The same four for IPv6 sockets (`[::1]:hostPort`, the node's IPv6
    /// addresses).
    pub const HP_CONNECT6: &str = "hp_connect6";
    pub const HP_SENDMSG6: &str = "hp_sendmsg6";
    pub const HP_RECVMSG6: &str = "hp_recvmsg6";
    pub const HP_GETPEERNAME6: &str = "hp_getpeername6";
    /// cgroup/connect4, attached for a moment to the plugin's own cgroup on
    /// kernels without `SO_NETNS_COOKIE`: records the netns cookie of a socket
    /// connecting to [`super::LEARN_ADDR`].
    pub const HP_LEARN4: &str = "hp_learn4";
    /// cgroup/connect4: a socket connecting to a Service (the agent's Service
    /// mode) goes to one of its backends.
    pub const LB_CONNECT4: &str = "lb_connect4";
    /// cgroup/sendmsg4: the same for each datagram of unconnected UDP.
    pub const LB_SENDMSG4: &str = "lb_sendmsg4";
    /// cgroup/recvmsg4: a backend's answer appears to come from the Service.
    pub const LB_RECVMSG4: &str = "lb_recvmsg4";
    /// cgroup/getpeername4: the peer is the Service the socket connected to.
    pub const LB_GETPEERNAME4: &str = "lb_getpeername4";
    /// The same four for IPv6 sockets.
    pub const LB_CONNECT6: &str = "lb_connect6";
    pub const LB_SENDMSG6: &str = "lb_sendmsg6";
    pub const LB_RECVMSG6: &str = "lb_recvmsg6";
    pub const LB_GETPEERNAME6: &str = "lb_getpeername6";
}

/// Where `hp_learn4` looks: a UDP connect here (no packet is sent) records the
/// socket's netns cookie in `sl_hp_learn`. 127.0.0.254, port 9 (discard).
pub const LEARN_ADDR: ([u8; 4], u16) = ([127, 0, 0, 254], 9);

const fn prog(name: &'static str, kind: ProgKind) -> ProgSpec {
    ProgSpec { name, kind }
}

/// The pod programs, attached to every pod's host veth.
pub const POD: [ProgSpec; 2] = [
    prog(prog_names::FROM_POD, ProgKind::PodIngress),
    prog(prog_names::TO_POD, ProgKind::PodEgress),
];

/// The programs of a netkit pod, attached through netkit's own hooks on its
/// host device: what the pod sends, what goes to it.
pub const POD_NETKIT: [ProgSpec; 2] = [
    prog(prog_names::FROM_NETKIT_POD, ProgKind::PodNetkit),
    prog(prog_names::TO_NETKIT_POD, ProgKind::PodNetkitPrimary),
];

/// The EDT program, attached to a limited pod's own `eth0`.
pub const POD_DEVICE: ProgSpec = prog(prog_names::POD_EDT, ProgKind::PodDevice);

/// The uplink's tc programs.
pub const UPLINK_TC: [ProgSpec; 2] = [
    prog(prog_names::UPLINK_IN, ProgKind::UplinkIngress),
    prog(prog_names::UPLINK_OUT, ProgKind::UplinkEgress),
];

/// The hostPort socket hooks.
pub const SOCK_HOOKS: [ProgSpec; 8] = [
    prog(
        prog_names::HP_CONNECT4,
        ProgKind::SockAddr(SockHook::Connect4),
    ),
    prog(
        prog_names::HP_SENDMSG4,
        ProgKind::SockAddr(SockHook::SendMsg4),
    ),
    prog(
        prog_names::HP_RECVMSG4,
        ProgKind::SockAddr(SockHook::RecvMsg4),
    ),
    prog(
        prog_names::HP_GETPEERNAME4,
        ProgKind::SockAddr(SockHook::GetPeerName4),
    ),
    prog(
        prog_names::HP_CONNECT6,
        ProgKind::SockAddr(SockHook::Connect6),
    ),
    prog(
        prog_names::HP_SENDMSG6,
        ProgKind::SockAddr(SockHook::SendMsg6),
    ),
    prog(
        prog_names::HP_RECVMSG6,
        ProgKind::SockAddr(SockHook::RecvMsg6),
    ),
    prog(
        prog_names::HP_GETPEERNAME6,
        ProgKind::SockAddr(SockHook::GetPeerName6),
    ),
];

/// The Service socket hooks (the agent attaches them in its Service mode).
pub const LB_HOOKS: [ProgSpec; 8] = [
    prog(
        prog_names::LB_CONNECT4,
        ProgKind::SockAddr(SockHook::Connect4),
    ),
    prog(
        prog_names::LB_SENDMSG4,
        ProgKind::SockAddr(SockHook::SendMsg4),
    ),
    prog(
        prog_names::LB_RECVMSG4,
        ProgKind::SockAddr(SockHook::RecvMsg4),
    ),
    prog(
        prog_names::LB_GETPEERNAME4,
        ProgKind::SockAddr(SockHook::GetPeerName4),
    ),
    prog(
        prog_names::LB_CONNECT6,
        ProgKind::SockAddr(SockHook::Connect6),
    ),
    prog(
        prog_names::LB_SENDMSG6,
        ProgKind::SockAddr(SockHook::SendMsg6),
    ),
    prog(
        prog_names::LB_RECVMSG6,
        ProgKind::SockAddr(SockHook::RecvMsg6),
    ),
    prog(
        prog_names::LB_GETPEERNAME6,
        ProgKind::SockAddr(SockHook::GetPeerName6),
    ),
];

/// Every program of the object, in load order.
pub const ALL: [ProgSpec; 26] = [
    POD[0],
    POD[1],
    POD_NETKIT[0],
    POD_NETKIT[1],
    POD_DEVICE,
    UPLINK_TC[0],
    UPLINK_TC[1],
    prog(prog_names::UPLINK_XDP, ProgKind::UplinkXdp),
    prog(prog_names::NAT_SWEEP, ProgKind::PerfEvent),
    SOCK_HOOKS[0],
    SOCK_HOOKS[1],
    SOCK_HOOKS[2],
    SOCK_HOOKS[3],
    SOCK_HOOKS[4],
    SOCK_HOOKS[5],
    SOCK_HOOKS[6],
    SOCK_HOOKS[7],
    prog(
        prog_names::HP_LEARN4,
        ProgKind::SockAddr(SockHook::Connect4),
    ),
    LB_HOOKS[0],
    LB_HOOKS[1],
    LB_HOOKS[2],
    LB_HOOKS[3],
    LB_HOOKS[4],
    LB_HOOKS[5],
    LB_HOOKS[6],
    LB_HOOKS[7],
];
