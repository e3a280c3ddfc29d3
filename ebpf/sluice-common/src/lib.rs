//! Map key and value types shared by the Sluice eBPF programs and userspace.
//!
//! Every type here is `#[repr(C)]` with explicit padding so that both sides agree on
//! the byte layout. Changing a type, a map name or a map's key/value size is a layout
//! change: bump [`LAYOUT_VERSION`] so that the plugin and `sluicectl` notice a pinned
//! datapath of another layout instead of misreading it.
#![no_std]

/// Version of the map layout below. Stored in the pinned `sl_meta` map.
pub const LAYOUT_VERSION: u32 = 1;

/// Default base of the pin roots: one directory per network below it.
pub const DEFAULT_PIN_BASE: &str = "/sys/fs/bpf/sluice";

/// Sub-directories of a network's pin root.
pub mod pin_dirs {
    /// Pinned maps (pinned by name by the loader).
    pub const MAPS: &str = "maps";
    /// Pinned programs, reused by every ADD after the first.
    pub const PROGS: &str = "progs";
    /// Pinned tcx/XDP links, one per attachment point.
    pub const LINKS: &str = "links";
}

/// Names of the maps, as they appear in the object, in bpffs and in `bpftool map`.
/// The kernel keeps 15 characters of a map name.
pub mod map_names {
    /// [`crate::IpKey`] -> [`crate::Endpoint`]: every pod address on this node.
    pub const ENDPOINTS: &str = "sl_endpoints";
    /// host veth ifindex -> [`crate::EndpointStats`] (per CPU).
    pub const ENDPOINT_STATS: &str = "sl_ep_stats";
    /// host veth ifindex -> [`crate::EndpointInfo`]: who owns the endpoint (userspace only).
    pub const ENDPOINT_INFO: &str = "sl_ep_info";
    /// index 0 -> [`crate::DatapathMeta`].
    pub const META: &str = "sl_meta";
    /// [`crate::reason`] -> packets (per CPU).
    pub const COUNTERS: &str = "sl_counters";
    /// index 0 -> [`crate::NodeConfig`].
    pub const CONFIG: &str = "sl_config";
    /// index 0 -> [`crate::MasqConfig`].
    pub const MASQ: &str = "sl_masq";
    /// LPM trie of IPv4 prefixes never masqueraded (`nonMasqueradeCIDRs`).
    pub const NON_MASQ: &str = "sl_nonmasq";
    /// Pod-side [`crate::NatKey`] -> [`crate::NatEntry`]: every masqueraded flow.
    pub const NAT_FWD: &str = "sl_nat_fwd";
    /// Outside [`crate::NatKey`] -> [`crate::NatRev`]: how replies find the pod.
    pub const NAT_REV: &str = "sl_nat_rev";
    /// [`crate::FragKey`] -> [`crate::FragEntry`]: fragmented datagrams of
    /// masqueraded flows being translated (LRU).
    pub const NAT_FRAG: &str = "sl_nat_frag";
    /// [`crate::PortKey`] -> [`crate::PortTarget`]: hostPort mappings.
    pub const PORTS: &str = "sl_ports";
    /// (LRU) [`crate::NatKey`] as a packet from a pod carries it ->
    /// [`crate::HpFlow`]: how translated hostPort flows (replies, hairpin) are
    /// rewritten.
    pub const HP_CT: &str = "sl_hp_ct";
    /// IPv4 address -> 1: the node's own addresses (wildcard hostPorts match them).
    pub const NODE_ADDRS: &str = "sl_node_addrs";
    /// (LRU) [`crate::SockKey`] -> [`crate::SockOrig`]: what node sockets asked
    /// for before the socket hooks rewrote it.
    pub const HP_SOCK: &str = "sl_hp_sock";
    /// index 0 -> [`crate::HostPortConfig`].
    pub const HP_CONFIG: &str = "sl_hp_config";
    /// host veth ifindex -> [`crate::BwState`]: a pod's bandwidth limits and their
    /// token buckets.
    pub const BANDWIDTH: &str = "sl_bw";
    /// Ring buffer of [`crate::Event`]s (drops, new flows) for `sluicectl monitor`.
    pub const EVENTS: &str = "sl_events";
    /// [`crate::monitor_slot`] -> u64: whether events and debug lines are on.
    pub const MONITOR: &str = "sl_monitor";
    /// [`crate::EpDropKey`] -> packets (per CPU): drops per endpoint and reason.
    pub const EP_DROPS: &str = "sl_ep_drops";
    /// Per-CPU scratch: the reason and endpoint of the packet being dropped,
    /// handed from the drop site to the program's exit (see `events`).
    pub const SCRATCH: &str = "sl_scratch";
}

/// Names of the programs in the object (and of their pins under `progs/`).
pub mod prog_names {
    /// tc ingress of a host veth: packets coming from the pod.
    pub const FROM_POD: &str = "from_pod";
    /// tc egress of a host veth: packets going to the pod.
    pub const TO_POD: &str = "to_pod";
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
}

/// Why a program let a packet go, redirected it or dropped it: indexes of the
/// per-CPU `sl_counters` array. Append only (the index is the map layout).
pub mod reason {
    /// from-pod: delivered into a pod on this node with `bpf_redirect_peer`.
    pub const FROM_POD_TO_LOCAL_POD: u32 = 0;
    /// from-pod: forwarded by FIB lookup with `bpf_redirect` (neighbour known).
    pub const FROM_POD_FIB_REDIRECT: u32 = 1;
    /// from-pod: forwarded by FIB lookup with `bpf_redirect_neigh`.
    pub const FROM_POD_FIB_NEIGH: u32 = 2;
    /// from-pod: the FIB does not forward it: the node itself is the destination,
    /// or no route matches (`bpf_fib_lookup` maps -ENETUNREACH to NOT_FWDED, so the
    /// two cannot be told apart); the kernel delivers it or answers unreachable.
    pub const FROM_POD_NOT_FORWARDED: u32 = 3;
    /// from-pod: the FIB could not forward for another reason (forwarding off,
    /// lightweight tunnel, ...); the kernel decides.
    pub const FROM_POD_FIB_PASS: u32 = 4;
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): passed to the kernel.
    pub const PASS_NOT_IP: u32 = 5;
    /// TTL/hop limit would expire: passed so the kernel sends time-exceeded.
    pub const PASS_TTL: u32 = 6;
    /// Header shorter than it claims or truncated frame: dropped.
    pub const DROP_MALFORMED: u32 = 7;
    /// uplink tc: delivered into a local pod.
    pub const UPLINK_TO_POD: u32 = 8;
    /// uplink tc: not for a pod, passed to the kernel.
    pub const UPLINK_PASS: u32 = 9;
    /// uplink XDP: redirected into a local pod.
    pub const XDP_TO_POD: u32 = 10;
    /// uplink XDP: handed to the tc program / kernel (not for a pod, or the pod
    /// is not ready for XDP frames, or a case XDP does not handle).
    pub const XDP_PASS_TO_TC: u32 = 11;
    /// A redirect helper refused the packet: passed to the kernel instead.
    pub const PASS_REDIRECT_FAILED: u32 = 12;
    /// IPv4 with options or fragments: routed without inspecting L4.
    pub const IPV4_OPTIONS_OR_FRAGMENT: u32 = 13;
    /// from-pod: destination is the sending pod itself (hairpin to self).
    pub const FROM_POD_TO_SELF: u32 = 14;
    /// to-pod (host veth egress): packets the kernel sent into a pod.
    pub const TO_POD_FROM_KERNEL: u32 = 15;
    /// from-pod: bigger than the egress MTU; the kernel sends "fragmentation
    /// needed" / "packet too big" (path MTU discovery).
    pub const FROM_POD_FIB_FRAG_NEEDED: u32 = 16;
    /// from-pod: no route (unreachable, blackhole, prohibit); the kernel answers.
    pub const FROM_POD_FIB_NO_ROUTE: u32 = 17;
    /// masquerade: a new flow got a NAT port.
    pub const MASQ_NEW_FLOW: u32 = 18;
    /// masquerade: a packet leaving the node was source-translated.
    pub const MASQ_SNAT: u32 = 19;
    /// masquerade: a reply was translated back and delivered (tc).
    pub const MASQ_DNAT: u32 = 20;
    /// masquerade: an ICMP error about a masqueraded flow was translated back.
    pub const MASQ_ICMP_ERROR: u32 = 21;
    /// masquerade: a later IPv4 fragment whose first fragment was not seen (out
    /// of order, or its flow could not be translated): dropped, it cannot be
    /// matched to a flow without the L4 header.
    pub const DROP_MASQ_FRAGMENT: u32 = 22;
    /// masquerade: a protocol without ports (not TCP, UDP or ICMP echo): dropped.
    pub const DROP_MASQ_PROTO: u32 = 23;
    /// masquerade: every port tried for a new flow was taken: dropped.
    pub const DROP_MASQ_NO_PORT: u32 = 24;
    /// masquerade: the NAT maps are full: the new flow is dropped, existing
    /// flows are unaffected.
    pub const DROP_MASQ_MAP_FULL: u32 = 25;
    /// masquerade: flows deleted by the sweeper after their timeout.
    pub const NAT_EXPIRED: u32 = 26;
    /// masquerade: a reply translated back in XDP.
    pub const XDP_MASQ_DNAT: u32 = 27;
    /// masquerade: a truncated L4 header on a flow to be translated: dropped.
    pub const DROP_MASQ_MALFORMED: u32 = 28;
    /// masquerade: a new connection from outside to a pod was tracked, so the
    /// pod's replies leave untranslated.
    pub const MASQ_INBOUND_FLOW: u32 = 29;
    /// masquerade: a pod's TCP segment (not a SYN) to the outside without a flow
    /// (expired, flushed, or never seen): dropped rather than sent with the pod's
    /// address (kube-proxy drops conntrack INVALID likewise).
    pub const DROP_MASQ_NO_FLOW: u32 = 30;
    /// masquerade: a later fragment of a translated datagram was translated
    /// like its first fragment.
    pub const MASQ_FRAGMENT: u32 = 31;
    /// hostPort: a packet to a mapped port arriving on the uplink was translated
    /// to the pod and delivered.
    pub const HOSTPORT_DNAT: u32 = 32;
    /// hostPort: a pod's reply on a translated flow was translated back.
    pub const HOSTPORT_REPLY: u32 = 33;
    /// hostPort: a pod's packet to a node address and mapped port (hairpin) was
    /// translated to the target pod, from the node address.
    pub const HOSTPORT_HAIRPIN: u32 = 34;
    /// hostPort: a node socket's destination (connect, sendmsg) was rewritten to
    /// the pod.
    pub const HOSTPORT_SOCK: u32 = 35;
    /// hostPort: a hairpin flow found no free source port: dropped.
    pub const DROP_HOSTPORT_NO_PORT: u32 = 36;
    /// bandwidth: a pod's packet over its egress limit: dropped.
    pub const DROP_BW_EGRESS: u32 = 37;
    /// bandwidth: a packet to a pod over its ingress limit: dropped.
    pub const DROP_BW_INGRESS: u32 = 38;
    /// monitor: an event did not fit in the ring buffer (`sluicectl monitor`
    /// reads too slowly); the packet itself was handled as usual.
    pub const EVENTS_LOST: u32 = 39;
    /// from-pod: the source address is not one of the pod's (IPv6 link-local
    /// and unspecified sources excepted, which neighbour discovery needs):
    /// dropped, so a pod can neither impersonate another pod or the node nor
    /// slip past masquerade and hostPort translation with a forged address.
    pub const DROP_SPOOFED: u32 = 40;
    /// Slots in the array.
    pub const MAX: u32 = 64;

    /// Counter names, by index, for `sluicectl counters`.
    pub const NAMES: [&str; 41] = [
        "from_pod_to_local_pod",
        "from_pod_fib_redirect",
        "from_pod_fib_neigh",
        "from_pod_not_forwarded",
        "from_pod_fib_pass",
        "pass_not_ip",
        "pass_ttl",
        "drop_malformed",
        "uplink_to_pod",
        "uplink_pass",
        "xdp_to_pod",
        "xdp_pass_to_tc",
        "pass_redirect_failed",
        "ipv4_options_or_fragment",
        "from_pod_to_self",
        "to_pod_from_kernel",
        "from_pod_fib_frag_needed",
        "from_pod_fib_no_route",
        "masq_new_flow",
        "masq_snat",
        "masq_dnat",
        "masq_icmp_error",
        "drop_masq_fragment",
        "drop_masq_proto",
        "drop_masq_no_port",
        "drop_masq_map_full",
        "nat_expired",
        "xdp_masq_dnat",
        "drop_masq_malformed",
        "masq_inbound_flow",
        "drop_masq_no_flow",
        "masq_fragment",
        "hostport_dnat",
        "hostport_reply",
        "hostport_hairpin",
        "hostport_sock",
        "drop_hostport_no_port",
        "drop_bw_egress",
        "drop_bw_ingress",
        "events_lost",
        "drop_spoofed",
    ];

    /// Whether the reason is a drop (the packet is discarded): those are also
    /// counted per endpoint and reported to `sluicectl monitor`.
    pub const fn is_drop(r: u32) -> bool {
        matches!(
            r,
            DROP_MALFORMED
                | DROP_MASQ_FRAGMENT
                | DROP_MASQ_PROTO
                | DROP_MASQ_NO_PORT
                | DROP_MASQ_MAP_FULL
                | DROP_MASQ_MALFORMED
                | DROP_MASQ_NO_FLOW
                | DROP_HOSTPORT_NO_PORT
                | DROP_BW_EGRESS
                | DROP_BW_INGRESS
                | DROP_SPOOFED
        )
    }
}

/// Default sizes of the maps (entries).
pub mod map_sizes {
    pub const ENDPOINTS: u32 = 16_384;
    pub const ENDPOINT_STATS: u32 = 8_192;
    pub const ENDPOINT_INFO: u32 = 8_192;
    /// Default NAT flows (each map); config `natMaxFlows` changes it at load.
    pub const NAT_FLOWS: u32 = 65_536;
    pub const NON_MASQ: u32 = 256;
    /// Fragmented datagrams in flight (LRU: the oldest make room).
    pub const NAT_FRAGS: u32 = 8_192;
    /// hostPort mappings of the node (the issue asks for 10,000 at least).
    pub const PORTS: u32 = 65_536;
    /// Translated hostPort flows (LRU, like Cilium's conntrack maps).
    pub const HP_CT: u32 = 65_536;
    pub const NODE_ADDRS: u32 = 256;
    pub const HP_SOCK: u32 = 16_384;
    /// Pods with bandwidth limits.
    pub const BANDWIDTH: u32 = 8_192;
    /// (endpoint, drop reason) pairs with a count.
    pub const EP_DROPS: u32 = 16_384;
    /// Bytes of the event ring buffer (a power of two, a multiple of the page size).
    pub const EVENTS_BYTES: u32 = 256 * 1024;
}

/// An IPv4 flow: the pod-side tuple (forward key) or the tuple replies carry
/// (reverse key: remote -> masquerade address). Ports in network byte order; for
/// ICMP echo the identifier is the source port of requests (forward) and the
/// destination port of replies (reverse), the other port is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct NatKey {
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

impl NatKey {
    /// The reverse key of this forward key for a flow that leaves with
    /// `nat_addr`:`nat_port`: the tuple its replies carry.
    #[inline(always)]
    pub const fn reverse(&self, nat_addr: [u8; 4], nat_port: u16) -> NatKey {
        NatKey {
            src_ip: self.dst_ip,
            dst_ip: nat_addr,
            src_port: self.dst_port,
            dst_port: nat_port,
            proto: self.proto,
            _pad: [0; 3],
        }
    }
}

/// The state of a flow (value of the forward map): masqueraded (it has a reverse
/// entry), or with [`nat_flags::INBOUND`] opened from outside (no translation).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatEntry {
    /// The source port (ICMP: identifier) on the outside, network byte order.
    pub nat_port: u16,
    /// [`nat_state`].
    pub state: u8,
    /// [`nat_flags`].
    pub flags: u8,
    /// Host veth of the pod (for `sluicectl nat list`); 0 for the node's own.
    pub pod_ifindex: u32,
    /// `bpf_ktime_get_coarse_ns` of the last packet either way.
    pub last_seen_ns: u64,
    pub created_ns: u64,
    /// The address the flow leaves with: it keeps it when `masqueradeAddress`
    /// changes, and its reverse key is made with it.
    pub nat_addr: [u8; 4],
    pub _pad: u32,
}

pub mod nat_flags {
    /// Opened from outside (a routed pod address): the pod's packets of this flow
    /// are replies and leave untranslated; there is no reverse entry.
    pub const INBOUND: u8 = 1 << 0;
    /// The node's own ICMP echo, tracked so no pod flow takes its identifier.
    pub const NODE: u8 = 1 << 1;
}

pub mod nat_state {
    /// TCP: SYN seen, no reply yet.
    pub const TCP_SYN: u8 = 1;
    /// TCP: traffic both ways.
    pub const TCP_ESTABLISHED: u8 = 2;
    /// TCP: FIN or RST seen.
    pub const TCP_CLOSING: u8 = 3;
    pub const UDP: u8 = 4;
    pub const ICMP: u8 = 5;
}

/// Where replies of a masqueraded flow go (value of the reverse map).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatRev {
    pub pod_ip: [u8; 4],
    /// Network byte order (ICMP: the pod's identifier).
    pub pod_port: u16,
    pub _pad: u16,
}

/// The fields that identify the fragments of one IPv4 datagram (RFC 791 3.2:
/// source, destination, protocol, identification), as the packet carries them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FragKey {
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    /// Network byte order.
    pub id: u16,
    pub proto: u8,
    pub _pad: u8,
}

/// How the later fragments of a datagram are translated: the address that
/// replaces the source (leaving) or destination (arriving) one. The ports are in
/// the first fragment only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragEntry {
    pub addr: [u8; 4],
    pub _pad: u32,
    /// When the first fragment passed; entries older than
    /// [`FRAG_TIMEOUT_NS`] (the kernel's default `ipfrag_time`) are ignored and
    /// swept.
    pub created_ns: u64,
}

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
    /// The node namespace's cookie (SO_NETNS_COOKIE): the socket hooks act only
    /// on sockets there, whatever cgroup they run in.
    pub netns_cookie: u64,
    /// Non-zero once a mapping was added (until then the pod programs skip the
    /// flow lookup). Never reset while the datapath lives: concurrent ADDs and
    /// DELs could not keep a count exact.
    pub active: u32,
    pub _pad: u32,
}

/// One direction's limit and its token bucket (bytes; `rate` 0: no limit).
/// A packet passes when the bucket holds its length in tokens; one bigger than
/// the burst passes on a full bucket (which then goes below zero), so a 64 KiB
/// GSO packet is never stuck behind a smaller burst.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Bucket {
    /// Bytes per second.
    pub rate: u64,
    /// Bytes the bucket holds at most.
    pub burst: u64,
    /// Nanoseconds to fill the bucket from its lowest (a packet bigger than the
    /// burst leaves it at `burst - len`, at worst [`bw_limits::MAX_DEFICIT`]
    /// below zero) to full: refills are capped at it, which also keeps
    /// `elapsed * rate` from overflowing.
    pub fill_ns: u64,
    /// Tokens now (bytes), changed by the programs.
    pub tokens: i64,
    /// When tokens were last added (CLOCK_MONOTONIC ns).
    pub last_ns: u64,
    /// Packets passed and dropped by this limit.
    pub passed: u64,
    pub dropped: u64,
}

/// Limits userspace accepts (CNI `bandwidth` values, in bits).
pub mod bw_limits {
    /// 1 Tbit/s.
    pub const MAX_RATE_BITS: u64 = 1_000_000_000_000;
    /// 4 GiB (in bits): with it the programs' `elapsed * rate` stays below 2^64.
    pub const MAX_BURST_BITS: u64 = (u32::MAX as u64) * 8;
    /// A rate without a burst gets `rate x DEFAULT_BURST_NS`, at least
    /// [`MIN_DEFAULT_BURST`] bytes. Without a queue (no `sch_fq` for EDT) a
    /// limit can only drop, and a TCP sender that loses the tail of a window
    /// waits for its retransmission timer, 200 ms at least however short the
    /// RTT: a bucket smaller than that much traffic never makes the idle time up
    /// (measured at 100 Mbit/s: a 20 ms burst gave 10 Mbit/s, 100 ms 50, 300 ms
    /// 104). 300 ms keeps a single stream within 10% of the rate while the first
    /// second carries at most 1.3x the rate.
    pub const DEFAULT_BURST_NS: u64 = 300_000_000;
    /// Two 64 KiB GSO packets.
    pub const MIN_DEFAULT_BURST: u64 = 128 * 1024;
    /// How far below zero a packet can take a bucket (a GSO packet up to 256 KiB,
    /// BIG TCP included, passing a full bucket with a smaller burst).
    pub const MAX_DEFICIT: u64 = 256 * 1024;
}

impl Bucket {
    /// The bucket for `rate_bits` bits/s and `burst_bits` bits (CNI units), in
    /// bytes, full at `now_ns`; no rate: no limit.
    pub fn from_bits(rate_bits: Option<u64>, burst_bits: Option<u64>, now_ns: u64) -> Self {
        let Some(rate_bits) = rate_bits else {
            return Self::default();
        };
        let rate = if rate_bits / 8 == 0 { 1 } else { rate_bits / 8 };
        let burst = match burst_bits {
            Some(b) => {
                if b / 8 == 0 {
                    1
                } else {
                    b / 8
                }
            }
            None => {
                let d = (rate as u128 * bw_limits::DEFAULT_BURST_NS as u128 / 1_000_000_000) as u64;
                if d < bw_limits::MIN_DEFAULT_BURST {
                    bw_limits::MIN_DEFAULT_BURST
                } else {
                    d
                }
            }
        };
        let burst = if burst > u32::MAX as u64 {
            u32::MAX as u64
        } else {
            burst
        };
        Self {
            rate,
            burst,
            fill_ns: ((burst + bw_limits::MAX_DEFICIT) as u128 * 1_000_000_000 / rate as u128)
                as u64,
            tokens: burst as i64,
            last_ns: now_ns,
            passed: 0,
            dropped: 0,
        }
    }

    /// (rate bits/s, burst bits) as configured, or `None` without a limit.
    pub fn bits(&self) -> Option<(u64, u64)> {
        (self.rate != 0).then_some((self.rate * 8, self.burst * 8))
    }
}

/// A pod's limits, by direction as the CNI conventions name them: `egress` is
/// what the pod sends, `ingress` what it receives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BwState {
    pub egress: Bucket,
    pub ingress: Bucket,
}

/// 30 s, as `net.ipv4.ipfrag_time` defaults to.
pub const FRAG_TIMEOUT_NS: u64 = 30_000_000_000;

/// Masquerade settings, at index 0 of `sl_masq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MasqConfig {
    /// The address masqueraded flows leave with.
    pub addr: [u8; 4],
    /// [`masq_flags`].
    pub flags: u32,
    /// NAT ports, host byte order, inclusive: up to two ranges, disjoint from the
    /// node's `ip_local_port_range`, so they never collide with the node's own
    /// outgoing connections. An empty second range has `port2_min > port2_max`.
    pub port_min: u16,
    pub port_max: u16,
    pub port2_min: u16,
    pub port2_max: u16,
    /// Timeouts in seconds.
    pub tcp_syn_secs: u32,
    pub tcp_established_secs: u32,
    pub tcp_closing_secs: u32,
    pub udp_secs: u32,
    pub icmp_secs: u32,
    /// The address before the last change (0.0.0.0: none): replies to it are
    /// still translated, for the flows opened before.
    pub prev_addr: [u8; 4],
}

pub mod masq_flags {
    /// `ipMasq: true`.
    pub const ENABLED: u32 = 1 << 0;
}

/// An IP address as a map key: IPv6 as is, IPv4 as an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`), so one map serves both families.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IpKey {
    pub addr: [u8; 16],
}

impl IpKey {
    /// Key of an IPv4 address given in network byte order as four bytes.
    #[inline(always)]
    pub const fn v4(octets: [u8; 4]) -> Self {
        let [a, b, c, d] = octets;
        Self {
            addr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d],
        }
    }

    /// Key of an IPv6 address.
    #[inline(always)]
    pub const fn v6(octets: [u8; 16]) -> Self {
        Self { addr: octets }
    }

    /// The IPv4 address if this key holds one.
    pub fn as_v4(&self) -> Option<[u8; 4]> {
        let a = &self.addr;
        if a[..10].iter().all(|b| *b == 0) && a[10] == 0xff && a[11] == 0xff {
            Some([a[12], a[13], a[14], a[15]])
        } else {
            None
        }
    }
}

/// Where a pod address lives: the host side of its veth and the MACs on the wire.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// ifindex of the host-side veth (node namespace).
    pub ifindex: u32,
    /// [`endpoint_flags`].
    pub flags: u32,
    /// MAC of the pod's interface.
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth.
    pub host_mac: [u8; 6],
}

pub mod endpoint_flags {
    /// The endpoint's address is IPv6.
    pub const IPV6: u32 = 1 << 0;
    /// The pod end of the veth can take XDP frames (GRO on, so veth NAPI runs):
    /// the uplink's XDP program may redirect into it.
    pub const XDP_READY: u32 = 1 << 1;
}

/// Node-wide settings the programs read, at index 0 of `sl_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeConfig {
    /// ifindex of the uplink (0: none attached).
    pub uplink_ifindex: u32,
    /// [`config_flags`].
    pub flags: u32,
    /// MAC of the uplink: XDP only takes frames addressed to it.
    pub uplink_mac: [u8; 6],
    /// MTU of the pods' veths. XDP redirects only frames that fit: a bigger one is a
    /// GRO'd skb seen by generic XDP, which the redirect would drop (EMSGSIZE).
    pub pod_mtu: u16,
}

pub mod config_flags {
    /// `uplink_xdp` runs in the driver.
    pub const XDP_NATIVE: u32 = 1 << 1;
    /// `uplink_xdp` runs in generic (skb) mode.
    pub const XDP_GENERIC: u32 = 1 << 2;
    /// The config asked for native XDP (`xdp` resolved: `auto` made concrete).
    pub const XDP_WANT_NATIVE: u32 = 1 << 3;
    /// The config asked for generic XDP.
    pub const XDP_WANT_GENERIC: u32 = 1 << 4;
}

/// Packet and byte counters of one endpoint, per CPU. Userspace sums over CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EndpointStats {
    /// Packets the pod sent (seen on host veth ingress).
    pub from_pod_packets: u64,
    pub from_pod_bytes: u64,
    /// Packets sent to the pod (seen on host veth egress).
    pub to_pod_packets: u64,
    pub to_pod_bytes: u64,
}

impl core::ops::Add for EndpointStats {
    type Output = Self;

    /// Sum of two per-CPU values.
    fn add(self, o: Self) -> Self {
        Self {
            from_pod_packets: self.from_pod_packets.wrapping_add(o.from_pod_packets),
            from_pod_bytes: self.from_pod_bytes.wrapping_add(o.from_pod_bytes),
            to_pod_packets: self.to_pod_packets.wrapping_add(o.to_pod_packets),
            to_pod_bytes: self.to_pod_bytes.wrapping_add(o.to_pod_bytes),
        }
    }
}

/// Length of the container id kept in [`EndpointInfo`] (longer ids are cut).
pub const CONTAINER_ID_LEN: usize = 64;
/// Length of an interface name buffer (IFNAMSIZ).
pub const IFNAME_LEN: usize = 16;

/// Who owns an endpoint. Written by the plugin, read by `sluicectl`; the programs
/// never look at it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// `CNI_CONTAINERID`, NUL-padded (cut at [`CONTAINER_ID_LEN`]).
    pub container_id: [u8; CONTAINER_ID_LEN],
    /// `CNI_IFNAME`, NUL-padded.
    pub ifname: [u8; IFNAME_LEN],
    /// Host-side veth name, NUL-padded.
    pub host_ifname: [u8; IFNAME_LEN],
    /// Inode of the pod's network namespace (0 if unknown).
    pub netns_ino: u64,
    /// Seconds since the epoch when ADD created the endpoint.
    pub created_unix: u64,
}

impl Default for EndpointInfo {
    fn default() -> Self {
        Self {
            container_id: [0; CONTAINER_ID_LEN],
            ifname: [0; IFNAME_LEN],
            host_ifname: [0; IFNAME_LEN],
            netns_ino: 0,
            created_unix: 0,
        }
    }
}

/// Identity of the loaded datapath, at index 0 of the `sl_meta` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DatapathMeta {
    /// [`LAYOUT_VERSION`] of the maps.
    pub layout_version: u32,
    pub _pad: u32,
    /// Hash of the eBPF object the pinned programs were loaded from.
    pub object_hash: u64,
    /// Seconds since the epoch of that load.
    pub loaded_unix: u64,
}

/// Slots of the `sl_monitor` array (each written by one party, so writers never
/// race on a shared struct).
pub mod monitor_slot {
    /// `bpf_ktime_get_ns` until which events go to the ring buffer; a running
    /// `sluicectl monitor` pushes it forward every second, so a killed monitor
    /// stops the events within [`EVENTS_LEASE_NS`].
    pub const EVENTS_UNTIL_NS: u32 = 0;
    /// Non-zero: the programs write aya-log debug lines (config `"debug": true`,
    /// written by every ADD).
    pub const DEBUG: u32 = 1;
    /// Slots in the array.
    pub const MAX: u32 = 2;
    /// How far ahead a monitor sets [`EVENTS_UNTIL_NS`].
    pub const EVENTS_LEASE_NS: u64 = 3_000_000_000;
}

/// Kinds of [`Event`].
pub mod event_kind {
    /// A packet was dropped; `reason` says why.
    pub const DROP: u8 = 1;
    /// A pod's flow to the outside got a NAT address and port.
    pub const NAT_NEW: u8 = 2;
    /// A connection from outside to a pod was tracked (replies leave untranslated).
    pub const NAT_INBOUND: u8 = 3;
    /// A new hostPort flow was translated to a pod.
    pub const HOSTPORT_NEW: u8 = 4;
}

/// One datapath event in the `sl_events` ring buffer. Addresses are IPv4 in the
/// first four bytes when `family` is 4; ports in host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    pub ts_ns: u64,
    /// [`event_kind`].
    pub kind: u8,
    /// 4, 6, or 0 when the packet could not be parsed.
    pub family: u8,
    pub proto: u8,
    pub _pad: u8,
    /// [`reason`] (drops) or the counter the event also bumped.
    pub reason: u32,
    /// The pod's host veth, 0 when not attributable to a pod.
    pub ifindex: u32,
    /// Frame length (drops).
    pub len: u32,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    /// Translated address and port (NAT and hostPort events).
    pub nat_addr: [u8; 4],
    pub nat_port: u16,
    pub _pad2: u16,
    pub _pad3: u32,
}

/// Key of `sl_ep_drops`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EpDropKey {
    pub ifindex: u32,
    pub reason: u32,
}

/// Value of `sl_scratch`: what the drop site leaves for the program's exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropNote {
    pub reason: u32,
    pub ifindex: u32,
}

/// Userspace helpers shared by the plugin and `sluicectl`.
#[cfg(feature = "user")]
pub mod user {
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

    /// The cookie of the calling thread's network namespace (SO_NETNS_COOKIE,
    /// Linux 5.14): the hostPort socket hooks act only on sockets whose namespace
    /// has the cookie written in `sl_hp_config`.
    pub fn netns_cookie() -> std::io::Result<u64> {
        const SO_NETNS_COOKIE: libc::c_int = 71;
        let s = std::net::UdpSocket::bind("0.0.0.0:0")
            .or_else(|_| std::net::UdpSocket::bind("127.0.0.1:0"))?;
        let mut cookie: u64 = 0;
        let mut len = core::mem::size_of::<u64>() as libc::socklen_t;
        // SAFETY: a valid socket fd, an 8-byte out buffer and its length.
        let rc = unsafe {
            libc::getsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                SO_NETNS_COOKIE,
                (&raw mut cookie).cast(),
                &raw mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(cookie)
    }

    /// CLOCK_MONOTONIC in ns: the programs' clock (`bpf_ktime_get_ns`), with
    /// which flows and token buckets are stamped.
    pub fn monotonic_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
        u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(ts.tv_nsec).unwrap_or(0)
    }

    /// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup` on a unified
    /// system, `/sys/fs/cgroup/unified` on a hybrid (v1 + v2) one. Socket hooks
    /// attach to v2 cgroups only.
    pub fn cgroup2_mount() -> Option<PathBuf> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        mounts.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| PathBuf::from(dir))
        })
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all types are repr(C), Copy, have no padding bytes and every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for super::IpKey {}
    unsafe impl aya::Pod for super::Endpoint {}
    unsafe impl aya::Pod for super::EndpointStats {}
    unsafe impl aya::Pod for super::EndpointInfo {}
    unsafe impl aya::Pod for super::DatapathMeta {}
    unsafe impl aya::Pod for super::NodeConfig {}
    unsafe impl aya::Pod for super::NatKey {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::NatRev {}
    unsafe impl aya::Pod for super::MasqConfig {}
    unsafe impl aya::Pod for super::FragKey {}
    unsafe impl aya::Pod for super::FragEntry {}
    unsafe impl aya::Pod for super::PortKey {}
    unsafe impl aya::Pod for super::PortTarget {}
    unsafe impl aya::Pod for super::HpFlow {}
    unsafe impl aya::Pod for super::SockKey {}
    unsafe impl aya::Pod for super::SockOrig {}
    unsafe impl aya::Pod for super::HostPortConfig {}
    unsafe impl aya::Pod for super::BwState {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::EpDropKey {}
    unsafe impl aya::Pod for super::DropNote {}
}

/// FNV-1a, 64 bits: a small stable hash (object identity, host veth names).
pub const fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < data.len() {
        h ^= data[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// Copies `s` into a NUL-padded buffer, cutting it at `N` bytes.
pub fn to_cbuf<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = if s.len() < N { s.len() } else { N };
    out[..n].copy_from_slice(&s[..n]);
    out
}

/// The bytes of a NUL-padded buffer up to the first NUL.
pub fn from_cbuf(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    &buf[..end]
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn ipv4_keys_are_mapped_ipv6() {
        let k = IpKey::v4([10, 1, 2, 3]);
        assert_eq!(
            k.addr,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3]
        );
        assert_eq!(k.as_v4(), Some([10, 1, 2, 3]));
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        v6[15] = 1;
        assert_eq!(IpKey::v6(v6).as_v4(), None);
    }

    #[test]
    fn layouts_have_no_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<IpKey>(), 16);
        assert_eq!(size_of::<Endpoint>(), 4 + 4 + 6 + 6);
        assert_eq!(size_of::<EndpointStats>(), 32);
        assert_eq!(size_of::<EndpointInfo>(), 64 + 16 + 16 + 8 + 8);
        assert_eq!(size_of::<DatapathMeta>(), 24);
        assert_eq!(size_of::<NodeConfig>(), 16);
        assert_eq!(reason::NAMES.len() as u32, reason::DROP_SPOOFED + 1);
        assert_eq!(
            size_of::<Event>(),
            8 + 4 + 4 + 4 + 4 + 16 + 16 + 4 + 4 + 4 + 4
        );
        assert_eq!(size_of::<EpDropKey>(), 8);
        assert_eq!(size_of::<DropNote>(), 8);
        assert_eq!(size_of::<Bucket>(), 56);
        assert_eq!(size_of::<BwState>(), 112);
        assert_eq!(size_of::<PortKey>(), 8);
        assert_eq!(size_of::<PortTarget>(), 12);
        assert_eq!(size_of::<HpFlow>(), 16);
        assert_eq!(size_of::<SockKey>(), 16);
        assert_eq!(size_of::<SockOrig>(), 8);
        assert_eq!(size_of::<HostPortConfig>(), 16);
        assert_eq!(size_of::<FragKey>(), 12);
        assert_eq!(size_of::<FragEntry>(), 16);
        assert_eq!(size_of::<NatKey>(), 16);
        assert_eq!(size_of::<NatEntry>(), 32);
        assert_eq!(size_of::<NatRev>(), 8);
        assert_eq!(size_of::<MasqConfig>(), 40);
    }

    #[test]
    fn drop_reasons_are_named_drop() {
        for (i, name) in reason::NAMES.iter().enumerate() {
            assert_eq!(
                reason::is_drop(i as u32),
                name.starts_with("drop_"),
                "{name}"
            );
        }
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn cbuf_roundtrip_and_cut() {
        let b: [u8; 4] = to_cbuf(b"ab");
        assert_eq!(b, [b'a', b'b', 0, 0]);
        assert_eq!(from_cbuf(&b), b"ab");
        let cut: [u8; 2] = to_cbuf(b"abc");
        assert_eq!(from_cbuf(&cut), b"ab");
    }
}
