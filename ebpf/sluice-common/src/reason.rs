//! Why a program let a packet go, redirected it or dropped it: indexes of the
//! per-CPU `sl_counters` array, and their names (`sluicectl counters`, the
//! metrics). One list below defines the number, the name and whether the
//! reason is a drop. Append only: the index is the map layout.

/// Defines the reason constants, [`NAMES`], [`COUNT`] and [`is_drop`] from one
/// list of `drop|count NAME = index "name";` lines.
macro_rules! reasons {
    ($( $(#[doc = $doc:literal])* $kind:ident $konst:ident = $idx:literal $name:literal; )*) => {
        $( $(#[doc = $doc])* pub const $konst: u32 = $idx; )*

        /// Defined reasons.
        pub const COUNT: usize = [$($idx),*].len();

        /// Counter names, by index.
        pub const NAMES: [&str; COUNT] = [$($name),*];

        /// Whether the reason is a drop (the packet is discarded): those are also
        /// counted per endpoint and reported to `sluicectl monitor`.
        #[inline(always)]
        pub const fn is_drop(r: u32) -> bool {
            false $( || (reasons!(@drop $kind) && r == $konst) )*
        }

        // The list is in index order, and drops (only drops) are named `drop_...`.
        #[allow(clippy::cast_sign_loss, reason = "indexes are small and positive; try_from is not const")]
        const _: () = {
            let idx = [$($idx),*];
            let drop = [$(reasons!(@drop $kind)),*];
            let mut i = 0;
            while i < COUNT {
                assert!(idx[i] as usize == i, "reasons out of order");
                assert!(drop[i] == starts_with_drop(NAMES[i]), "drop reasons are named drop_");
                i += 1;
            }
        };
    };
    (@drop drop) => { true };
    (@drop count) => { false };
}

const fn starts_with_drop(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 5 && b[0] == b'd' && b[1] == b'r' && b[2] == b'o' && b[3] == b'p' && b[4] == b'_'
}

reasons! {
    /// from-pod: delivered into a pod on this node with `bpf_redirect_peer`.
    count FROM_POD_TO_LOCAL_POD = 0 "from_pod_to_local_pod";
    /// from-pod: forwarded by FIB lookup with `bpf_redirect` (neighbour known).
    count FROM_POD_FIB_REDIRECT = 1 "from_pod_fib_redirect";
    /// from-pod: forwarded by FIB lookup with `bpf_redirect_neigh`.
    count FROM_POD_FIB_NEIGH = 2 "from_pod_fib_neigh";
    /// from-pod: the FIB does not forward it: the node itself is the destination,
    /// or no route matches (`bpf_fib_lookup` maps `-ENETUNREACH` to `NOT_FWDED`, so the
    /// two cannot be told apart); the kernel delivers it or answers unreachable.
    count FROM_POD_NOT_FORWARDED = 3 "from_pod_not_forwarded";
    /// from-pod: the FIB could not forward for another reason (forwarding off,
    /// lightweight tunnel, ...); the kernel decides.
    count FROM_POD_FIB_PASS = 4 "from_pod_fib_pass";
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): passed to the kernel.
    count PASS_NOT_IP = 5 "pass_not_ip";
    /// TTL/hop limit would expire: passed so the kernel sends time-exceeded.
    count PASS_TTL = 6 "pass_ttl";
    /// Header shorter than it claims or truncated frame: dropped.
    drop DROP_MALFORMED = 7 "drop_malformed";
    /// uplink tc: delivered into a local pod.
    count UPLINK_TO_POD = 8 "uplink_to_pod";
    /// uplink tc: not for a pod, passed to the kernel.
    count UPLINK_PASS = 9 "uplink_pass";
    /// uplink XDP: redirected into a local pod.
    count XDP_TO_POD = 10 "xdp_to_pod";
    /// uplink XDP: handed to the tc program / kernel (not for a pod, or the pod
    /// is not ready for XDP frames, or a case XDP does not handle).
    count XDP_PASS_TO_TC = 11 "xdp_pass_to_tc";
    /// A redirect helper refused the packet: passed to the kernel instead.
    count PASS_REDIRECT_FAILED = 12 "pass_redirect_failed";
    /// IPv4 with options or fragments: routed without inspecting L4.
    count IPV4_OPTIONS_OR_FRAGMENT = 13 "ipv4_options_or_fragment";
    /// from-pod: destination is the sending pod itself (hairpin to self).
    count FROM_POD_TO_SELF = 14 "from_pod_to_self";
    /// to-pod (host veth egress): packets the kernel sent into a pod.
    count TO_POD_FROM_KERNEL = 15 "to_pod_from_kernel";
    /// from-pod: bigger than the egress MTU; the kernel sends "fragmentation
    /// needed" / "packet too big" (path MTU discovery).
    count FROM_POD_FIB_FRAG_NEEDED = 16 "from_pod_fib_frag_needed";
    /// from-pod: no route (unreachable, blackhole, prohibit); the kernel answers.
    count FROM_POD_FIB_NO_ROUTE = 17 "from_pod_fib_no_route";
    /// masquerade: a new flow got a NAT port.
    count MASQ_NEW_FLOW = 18 "masq_new_flow";
    /// masquerade: a packet leaving the node was source-translated.
    count MASQ_SNAT = 19 "masq_snat";
    /// masquerade: a reply was translated back and delivered (tc).
    count MASQ_DNAT = 20 "masq_dnat";
    /// masquerade: an ICMP error about a masqueraded flow was translated back.
    count MASQ_ICMP_ERROR = 21 "masq_icmp_error";
    /// masquerade: a later IPv4 fragment whose first fragment was not seen (out
    /// of order, or its flow could not be translated): dropped, it cannot be
    /// matched to a flow without the L4 header.
    drop DROP_MASQ_FRAGMENT = 22 "drop_masq_fragment";
    /// masquerade: a protocol without ports (not TCP, UDP or ICMP echo): dropped.
    drop DROP_MASQ_PROTO = 23 "drop_masq_proto";
    /// masquerade: every port tried for a new flow was taken: dropped.
    drop DROP_MASQ_NO_PORT = 24 "drop_masq_no_port";
    /// masquerade: the NAT maps are full and no flow could make room (the
    /// oldest are established TCP connections in use, which are never
    /// evicted): the new flow is dropped, existing flows are unaffected.
    drop DROP_MASQ_MAP_FULL = 25 "drop_masq_map_full";
    /// masquerade: flows deleted by the sweeper after their timeout.
    count NAT_EXPIRED = 26 "nat_expired";
    /// masquerade: a reply translated back in XDP.
    count XDP_MASQ_DNAT = 27 "xdp_masq_dnat";
    /// masquerade: a truncated L4 header on a flow to be translated: dropped.
    drop DROP_MASQ_MALFORMED = 28 "drop_masq_malformed";
    /// masquerade: a new connection from outside to a pod was tracked, so the
    /// pod's replies leave untranslated.
    count MASQ_INBOUND_FLOW = 29 "masq_inbound_flow";
    /// masquerade: a pod's TCP segment (not a SYN) to the outside without a flow
    /// (expired, flushed, or never seen): dropped rather than sent with the pod's
    /// address (kube-proxy drops conntrack INVALID likewise).
    drop DROP_MASQ_NO_FLOW = 30 "drop_masq_no_flow";
    /// masquerade: a later fragment of a translated datagram was translated
    /// like its first fragment.
    count MASQ_FRAGMENT = 31 "masq_fragment";
    /// hostPort: a packet to a mapped port arriving on the uplink was translated
    /// to the pod and delivered.
    count HOSTPORT_DNAT = 32 "hostport_dnat";
    /// hostPort: a pod's reply on a translated flow was translated back.
    count HOSTPORT_REPLY = 33 "hostport_reply";
    /// hostPort: a pod's packet to a node address and mapped port (hairpin) was
    /// translated to the target pod, from the node address.
    count HOSTPORT_HAIRPIN = 34 "hostport_hairpin";
    /// hostPort: a node socket's destination (connect, sendmsg) was rewritten to
    /// the pod.
    count HOSTPORT_SOCK = 35 "hostport_sock";
    /// hostPort: a hairpin flow found no free source port: dropped.
    drop DROP_HOSTPORT_NO_PORT = 36 "drop_hostport_no_port";
    /// bandwidth: a pod's packet over its egress limit: dropped.
    drop DROP_BW_EGRESS = 37 "drop_bw_egress";
    /// bandwidth: a packet to a pod over its ingress limit: dropped.
    drop DROP_BW_INGRESS = 38 "drop_bw_ingress";
    /// monitor: an event did not fit in the ring buffer (`sluicectl monitor`
    /// reads too slowly); the packet itself was handled as usual.
    count EVENTS_LOST = 39 "events_lost";
    /// from-pod: the source address is not one of the pod's (IPv6 link-local
    /// and unspecified sources excepted, which neighbour discovery needs):
    /// dropped, so a pod can neither impersonate another pod or the node nor
    /// slip past masquerade and hostPort translation with a forged address.
    drop DROP_SPOOFED = 40 "drop_spoofed";
    /// from-pod: IPv6 link-scope multicast the node does not listen to (the
    /// pod's MLD reports, router solicitations, duplicate address detection
    /// probes from `::`): consumed at the host device, so the node's stack
    /// never routes it; not a drop (every pod start sends some). Neighbour
    /// solicitations and advertisements from a specified source still pass.
    count FROM_POD_LINK_MULTICAST = 41 "from_pod_link_multicast";
    /// from-pod: the destination is in the Service ranges (`serviceCIDRs`,
    /// `sl_svc`): handed to the node's stack, where kube-proxy translates it.
    count FROM_POD_TO_SERVICE = 42 "from_pod_to_service";
    /// from-pod: a packet of a flow the node's stack translates
    /// (`sl_kflows`): handed to the stack, which undoes its translation.
    count FROM_POD_KERNEL_FLOW = 43 "from_pod_kernel_flow";
    /// uplink tc: a packet for a pod on a flow the node's stack translates:
    /// handed to the stack instead of delivered.
    count UPLINK_KERNEL_FLOW = 44 "uplink_kernel_flow";
    /// A flow the node's stack delivered into a pod or routed out of the
    /// uplink from one was remembered in `sl_kflows`.
    count KERNEL_FLOW_NEW = 45 "kernel_flow_new";
    /// from-pod: a pod's socket that sent to a Service address or to one of
    /// the node's own was remembered in `sl_kflows`: what the stack then
    /// routes out of the uplink from it is followed as the stack's flow.
    count KERNEL_FLOW_CLIENT = 46 "kernel_flow_client";
    /// masquerade: the flow table was full; a flow that never saw a reply
    /// (the oldest in a window of the recent ones) made room for a new one.
    count NAT_EVICT_UNREPLIED = 47 "nat_evict_unreplied";
    /// masquerade: the flow table was full; the least recently used replied
    /// flow that was not an established TCP connection made room.
    count NAT_EVICT_IDLE = 48 "nat_evict_idle";
    /// masquerade: a pod at its share of the table (`natPodShare`) replaced
    /// one of its own flows with a new one.
    count NAT_EVICT_POD_SHARE = 49 "nat_evict_pod_share";
    /// masquerade: a pod at its share of the table had no flow of its own to
    /// give up (all established, or none among the oldest): its new flow is
    /// dropped; other pods are unaffected.
    drop DROP_MASQ_POD_SHARE = 50 "drop_masq_pod_share";
    /// Services: a socket's connect (or datagram) to a Service was pointed
    /// at one of its backends (`lb_*` socket hooks).
    count LB_SOCK = 51 "lb_sock";
    /// Services: a connect (or datagram) to a Service with no endpoint: a
    /// pod's first packet answered with ICMP port unreachable (as
    /// kube-proxy's `REJECT`; the caller sees `ECONNREFUSED`), or, on the
    /// node itself and on kernels before 5.14, refused at the socket
    /// (`EPERM`).
    drop DROP_LB_NO_ENDPOINT = 52 "drop_lb_no_endpoint";
    /// Services from outside: a new flow from the uplink to a NodePort, an
    /// external IP or a load balancer IP was given a backend (`sl_lb_ct`).
    count LB_UPLINK_NEW = 53 "lb_uplink_new";
    /// Services from outside: a packet of such a flow (either way) was
    /// translated by its `sl_lb_ct` entry.
    count LB_UPLINK_FLOW = 54 "lb_uplink_flow";
    /// Services from outside: a new flow to a remote backend found no source
    /// port free on the node address (every port tried is another flow's).
    drop DROP_LB_NO_PORT = 55 "drop_lb_no_port";
    /// Services: a pod's new flow to a ClusterIP that no socket hook
    /// translated (a pod outside the hooks' cgroup) was given a backend in
    /// `from_pod`, its packets translated per packet (`sl_lb_ct`).
    count LB_PACKET_NEW = 56 "lb_packet_new";
    /// NetworkPolicy: a new flow into a pod isolated for ingress matched no
    /// rule of the policies that select it.
    drop DROP_POLICY_INGRESS = 57 "drop_policy_ingress";
    /// NetworkPolicy: a new flow out of a pod isolated for egress matched no
    /// rule.
    drop DROP_POLICY_EGRESS = 58 "drop_policy_egress";
    /// NetworkPolicy: a flow of a pod the agent has not compiled yet (policy
    /// on, no `sl_pol_pods` entry): refused both ways until it has.
    drop DROP_POLICY_PENDING = 59 "drop_policy_pending";
    /// NetworkPolicy: a new flow of a pod with policy was let in by a rule
    /// (or the direction is not isolated) and its verdict kept (`sl_pol_ct`).
    count POLICY_NEW = 60 "policy_new";
    /// NetworkPolicy audit mode: a new flow into a pod that enforcement
    /// would have dropped, let through.
    count POLICY_AUDIT_INGRESS = 61 "policy_audit_ingress";
    /// NetworkPolicy audit mode: a new flow out of a pod that enforcement
    /// would have dropped, let through.
    count POLICY_AUDIT_EGRESS = 62 "policy_audit_egress";
    /// Services from outside in native XDP: a packet of a flow to a backend
    /// on another node (or that backend's answer to the client) translated
    /// and sent back out from XDP (also counted as `lb_uplink_flow`).
    count XDP_LB_SEND = 63 "xdp_lb_send";
}

/// Slots in the array (room to append).
pub const MAX: u32 = 64;
