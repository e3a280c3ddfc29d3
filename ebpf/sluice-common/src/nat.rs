//! Masquerade: the flow table (`sl_nat_fwd`, `sl_nat_rev`), fragments
//! (`sl_nat_frag`) and settings (`sl_masq`, `sl_nonmasq`).

/// A flow: the pod-side tuple (forward key) or the tuple replies carry
/// (reverse key: remote -> masquerade address), of addresses `A` (`[u8; 4]`:
/// [`NatKey`], `[u8; 16]`: [`Nat6Key`]). Ports in network byte order; for ICMP
/// echo the identifier is the source port of requests (forward) and the
/// destination port of replies (reverse), the other port is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct NatKeyOf<A> {
    pub src_ip: A,
    pub dst_ip: A,
    pub src_port: u16,
    pub dst_port: u16,
    pub proto: u8,
    /// Zero. Two fields rather than `[u8; 3]`: the program side zeroed the
    /// array with a call to a byte-at-a-time `memset` in every key it built;
    /// two zero stores are two instructions. The layout is the same.
    pub _pad: u8,
    pub _pad2: u16,
}

/// An IPv6 address as the flow maps hold it, network byte order, 4-byte
/// aligned: with byte alignment the programs copied addresses a byte at a
/// time, and the spilled bytes overflowed the 512-byte BPF stack.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Addr6(pub [u8; 16]);

/// An IPv4 flow (`sl_nat_fwd`, `sl_nat_rev`, `sl_hp_ct`).
pub type NatKey = NatKeyOf<[u8; 4]>;
/// An IPv6 flow (`sl_nat6_fwd`, `sl_nat6_rev`).
pub type Nat6Key = NatKeyOf<Addr6>;

impl<A: Copy> NatKeyOf<A> {
    /// A flow key; ports (ICMP: identifiers) in network byte order as packets
    /// carry them.
    #[inline(always)]
    pub const fn new(src_ip: A, dst_ip: A, src_port: u16, dst_port: u16, proto: u8) -> Self {
        Self {
            src_ip,
            dst_ip,
            src_port,
            dst_port,
            proto,
            _pad: 0,
            _pad2: 0,
        }
    }

    /// The reverse key of this forward key for a flow that leaves with
    /// `nat_addr`:`nat_port`: the tuple its replies carry.
    #[inline(always)]
    pub const fn reverse(&self, nat_addr: A, nat_port: u16) -> Self {
        Self::new(self.dst_ip, nat_addr, self.dst_port, nat_port, self.proto)
    }
}

/// The state of a flow (value of the forward map): masqueraded (it has a reverse
/// entry), or with [`nat_flags::INBOUND`] opened from outside (no translation).
/// `P` pads the IPv4 form to a multiple of 8 bytes (`u32`); the IPv6 one needs
/// none (`()`), and a map value must not have implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatEntryOf<A, P> {
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
    pub nat_addr: A,
    pub _pad: P,
}

/// An IPv4 flow's state (value of `sl_nat_fwd`).
pub type NatEntry = NatEntryOf<[u8; 4], u32>;
/// An IPv6 flow's state (value of `sl_nat6_fwd`).
pub type Nat6Entry = NatEntryOf<Addr6, ()>;

pub mod nat_flags {
    /// Opened from outside (a routed pod address): the pod's packets of this flow
    /// are replies and leave untranslated; there is no reverse entry.
    pub const INBOUND: u8 = 1 << 0;
    /// The node's own ICMP echo, tracked so no pod flow takes its identifier.
    pub const NODE: u8 = 1 << 1;
    /// A packet came back the other way (a reply; for an inbound flow, the
    /// pod answered). A flow without it is the first a full table evicts,
    /// and an unreplied UDP flow expires after `udp_unreplied_secs`.
    pub const REPLIED: u8 = 1 << 2;
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
pub struct NatRevOf<A> {
    pub pod_ip: A,
    /// Network byte order (ICMP: the pod's identifier).
    pub pod_port: u16,
    pub _pad: u16,
}

/// Value of `sl_nat_rev`.
pub type NatRev = NatRevOf<[u8; 4]>;
/// Value of `sl_nat6_rev`.
pub type Nat6Rev = NatRevOf<Addr6>;

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

impl MasqConfig {
    /// How long a flow in `state` ([`nat_state`]) with `flags`
    /// ([`nat_flags`]) may stay idle, in ns: the datapath, the in-kernel
    /// sweeper and the node agent's sweeper all ask this. A UDP flow that
    /// never saw a reply gets `udp_unreplied_secs` when it is shorter (0:
    /// none), as conntrack gives an unreplied UDP entry 30 s and a replied one
    /// 120 s (`nf_conntrack_udp_timeout`, `_stream`).
    #[inline(always)]
    pub fn idle_timeout_ns(&self, state: u8, flags: u8, udp_unreplied_secs: u32) -> u64 {
        // All five loaded first: matching on the state to pick a field made
        // LLVM compute the field offset from the state, which the verifier
        // cannot bound.
        let (syn, est, closing, udp, icmp) = (
            self.tcp_syn_secs,
            self.tcp_established_secs,
            self.tcp_closing_secs,
            self.udp_secs,
            self.icmp_secs,
        );
        let secs = match state {
            nat_state::TCP_SYN => syn,
            nat_state::TCP_ESTABLISHED => est,
            nat_state::TCP_CLOSING => closing,
            nat_state::ICMP => icmp,
            _ if flags & nat_flags::REPLIED == 0
                && udp_unreplied_secs != 0
                && udp_unreplied_secs < udp =>
            {
                udp_unreplied_secs
            }
            _ => udp,
        };
        u64::from(secs) * 1_000_000_000
    }

    /// Whether a flow in `state` with `flags`, last seen at `last_seen_ns`, is
    /// past its idle timeout at `now` (all `CLOCK_MONOTONIC` ns).
    #[inline(always)]
    pub fn is_expired(
        &self,
        (state, flags): (u8, u8),
        udp_unreplied_secs: u32,
        last_seen_ns: u64,
        now: u64,
    ) -> bool {
        now.saturating_sub(last_seen_ns) > self.idle_timeout_ns(state, flags, udp_unreplied_secs)
    }
}

/// What keeps a full flow table open to every pod, at index 0 of
/// `sl_nat_limits` (written at ADD; all zero: no eviction, no share, one UDP
/// timeout). Apart from [`MasqConfig`] so that a datapath loaded before
/// keeps its map layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatLimits {
    /// Idle timeout of a UDP flow that never saw a reply, seconds (0: the
    /// UDP timeout).
    pub udp_unreplied_secs: u32,
    /// Flows (of both families) one pod may hold before its new ones replace
    /// its own (`natPodShare` of the table); 0: no share.
    pub pod_max_flows: u32,
    /// Slots of each recent-flow ring (`sl_nat_ring`, `sl_nat6_ring`): the
    /// size of the flow tables; 0: a full table refuses new flows.
    pub ring_slots: u32,
    /// Flows each table holds at most (`sl_nat_fwd`'s `max_entries`): a new
    /// flow makes room first when its table holds nearly this many.
    pub max_flows: u32,
}

/// Recent flows a full table looks at for one to evict, oldest first: the
/// first that never saw a reply, else the least recently used that is not an
/// established TCP connection.
pub const NAT_EVICT_WINDOW: u32 = 8;

/// Whether a flow may be evicted to make room, and how eagerly: 2 never
/// replied (a scan, a flood, a peer that is gone), 1 replied but not an
/// established TCP connection (UDP, ICMP, TCP closing), 0 never (established
/// TCP: cutting it would break a connection in use).
#[inline(always)]
pub const fn eviction_rank(state: u8, flags: u8) -> u8 {
    if state == nat_state::TCP_ESTABLISHED {
        0
    } else if flags & nat_flags::REPLIED == 0 {
        2
    } else {
        1
    }
}

/// Slots of `sl_nat_cursor`, per family: how many flows were written into
/// its ring (the next slot written is the oldest), and where the eviction
/// hand looks next (it moves past what it scanned, as a CLOCK hand).
/// Also the flows each table holds (added at a new flow, subtracted at a
/// removal, set by the node agent's recount).
pub mod nat_cursor {
    pub const WRITTEN_V4: u32 = 0;
    pub const WRITTEN_V6: u32 = 1;
    pub const HAND_V4: u32 = 2;
    pub const HAND_V6: u32 = 3;
    pub const FLOWS_V4: u32 = 4;
    pub const FLOWS_V6: u32 = 5;
    pub const MAX: u32 = 6;
}

/// NAT ports a new flow tries before it is dropped (`drop_masq_no_port`).
pub const NAT_PORT_TRIES: u32 = 32;

/// The index into the NAT port ranges (`range` ports) of try `i` for a flow
/// whose start is `h`: a hash of the pod's address, the destination and the
/// protocol plus the pod's source port. So the first try follows the pod's
/// own port choice: consecutive source ports take consecutive NAT ports, and
/// a NAT port to a server comes back to the same source port of the same pod,
/// not to another connection. A server keeps each connection it closed in
/// `TIME_WAIT` for 60 s and refuses a SYN for that address and port pair whose
/// timestamp comes from another connection (PAWS: Linux offsets timestamps per
/// connection): with NAT ports drawn at random, a pod making short
/// connections to one server met this on some of its new connections once a
/// batch of flows had expired (3 to 8 in 100 as measured), and each waited
/// 1 s for its SYN's retransmission (`TcpExtPAWSTimewait` on the server).
///
/// Later tries (a port another flow holds) go to the `i`-th triangular number
/// past the start (quadratic probing), not the `i`-th neighbour: runs of
/// taken ports merge as the range fills, and with neighbours some flows met
/// 32 taken ports in a row at half full. Cheap on purpose: a few more
/// registers in this loop spilled onto the 512-byte stack of the masquerade
/// path. `range` is at least 1.
#[inline(always)]
pub const fn nat_port_index(h: u32, i: u32, range: u32) -> u32 {
    // Below 2^32: h % range < 2^16 and i < 32.
    (h % range + i * (i + 1) / 2) % range
}

/// IPv6 masquerade settings, at index 0 of `sl_masq6`; ports and timeouts are
/// the IPv4 [`MasqConfig`]'s (one `ipMasq` setting for both families).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Masq6Config {
    /// The address masqueraded IPv6 flows leave with.
    pub addr: Addr6,
    /// The address before the last change (`::`: none), as in [`MasqConfig`].
    pub prev_addr: Addr6,
    /// [`masq_flags`] (`ENABLED`: IPv6 pod traffic is masqueraded).
    pub flags: u32,
}

pub mod masq_flags {
    /// `ipMasq: true`.
    pub const ENABLED: u32 = 1 << 0;
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;

    #[test]
    fn each_state_has_its_own_idle_timeout_and_expiry_is_strictly_after_it() {
        let cfg = MasqConfig {
            tcp_syn_secs: 1,
            tcp_established_secs: 2,
            tcp_closing_secs: 3,
            udp_secs: 4,
            icmp_secs: 5,
            ..MasqConfig::default()
        };
        let s = 1_000_000_000;
        for (state, secs) in [
            (nat_state::TCP_SYN, 1),
            (nat_state::TCP_ESTABLISHED, 2),
            (nat_state::TCP_CLOSING, 3),
            (nat_state::UDP, 4),
            (nat_state::ICMP, 5),
            // An unknown state is treated as UDP (the datapath's default).
            (0, 4),
        ] {
            let replied = nat_flags::REPLIED;
            assert_eq!(
                cfg.idle_timeout_ns(state, replied, 0),
                secs * s,
                "state {state}"
            );
            let seen = 10 * s;
            assert!(
                !cfg.is_expired((state, replied), 0, seen, seen + secs * s),
                "state {state}"
            );
            assert!(
                cfg.is_expired((state, replied), 0, seen, seen + secs * s + 1),
                "state {state}"
            );
        }
        // A flow stamped after `now` (another CPU's newer stamp) is not expired.
        assert!(!cfg.is_expired((nat_state::UDP, 0), 0, 20 * s, 10 * s));
    }

    #[test]
    fn an_unreplied_udp_flow_expires_sooner_and_only_udp() {
        let cfg = MasqConfig {
            tcp_syn_secs: 60,
            udp_secs: 120,
            icmp_secs: 30,
            ..MasqConfig::default()
        };
        let s = 1_000_000_000;
        assert_eq!(cfg.idle_timeout_ns(nat_state::UDP, 0, 30), 30 * s);
        assert_eq!(
            cfg.idle_timeout_ns(nat_state::UDP, nat_flags::REPLIED, 30),
            120 * s
        );
        // 0: off; longer than the UDP timeout: the UDP timeout.
        assert_eq!(cfg.idle_timeout_ns(nat_state::UDP, 0, 0), 120 * s);
        assert_eq!(cfg.idle_timeout_ns(nat_state::UDP, 0, 500), 120 * s);
        assert_eq!(cfg.idle_timeout_ns(nat_state::TCP_SYN, 0, 30), 60 * s);
        assert_eq!(cfg.idle_timeout_ns(nat_state::ICMP, 0, 10), 30 * s);
    }

    #[test]
    fn established_tcp_is_never_evicted_and_unreplied_flows_go_first() {
        use nat_flags::REPLIED;
        assert_eq!(eviction_rank(nat_state::TCP_ESTABLISHED, REPLIED), 0);
        assert_eq!(eviction_rank(nat_state::TCP_ESTABLISHED, 0), 0);
        assert_eq!(eviction_rank(nat_state::TCP_SYN, 0), 2);
        assert_eq!(eviction_rank(nat_state::UDP, 0), 2);
        assert_eq!(eviction_rank(nat_state::UDP, REPLIED), 1);
        assert_eq!(eviction_rank(nat_state::TCP_CLOSING, REPLIED), 1);
        assert_eq!(eviction_rank(nat_state::ICMP, REPLIED), 1);
    }

    /// A well-mixed stand-in for the programs' flow hash.
    fn hash(n: u32) -> u32 {
        let mut h = n.wrapping_mul(0x9e37_79b9);
        h ^= h >> 16;
        h = h.wrapping_mul(0x7feb_352d);
        h ^= h >> 15;
        h.wrapping_mul(0x846c_a68b)
    }

    /// Flows that found no free port in their tries, `flows` of them taking
    /// ports of a `range` in turn with `index`.
    fn failures(range: u32, flows: u32, index: impl Fn(u32, u32, u32) -> u32) -> u32 {
        let mut taken = vec![false; range as usize];
        let mut failed = 0;
        for n in 0..flows {
            let h = hash(n);
            match (0..NAT_PORT_TRIES)
                .map(|i| index(h, i, range) as usize)
                .find(|&x| !taken[x])
            {
                Some(x) => taken[x] = true,
                None => failed += 1,
            }
        }
        failed
    }

    #[test]
    fn tries_stay_in_the_range_and_differ() {
        for range in [1, 2, 3, 1000, 28_232, 36_000, 65_535] {
            for n in 0..2000 {
                let h = hash(n);
                let idx: Vec<u32> = (0..NAT_PORT_TRIES)
                    .map(|i| nat_port_index(h, i, range))
                    .collect();
                assert!(idx.iter().all(|&x| x < range), "{range}: {idx:?}");
                let mut d = idx.clone();
                d.sort_unstable();
                d.dedup();
                // Nearly all distinct (a tiny range has fewer ports).
                let distinct = u32::try_from(d.len()).unwrap();
                assert!(
                    distinct >= NAT_PORT_TRIES.min(range) * 3 / 4
                        || (range < NAT_PORT_TRIES && distinct >= range / 2),
                    "{range}: {idx:?}"
                );
            }
        }
    }

    /// A pod's consecutive source ports to one server take distinct NAT
    /// ports on the first try as long as the range has room for them (the
    /// kernel's 28,232 ephemeral ports into 36,000 NAT ports), so a NAT port
    /// comes back only to the source port that used it before.
    #[test]
    fn consecutive_source_ports_take_distinct_first_tries() {
        let (range, base) = (36_000, hash(7));
        let mut firsts: Vec<u32> = (32_768..61_000)
            .map(|sport| nat_port_index(base.wrapping_add(sport), 0, range))
            .collect();
        let n = firsts.len();
        firsts.sort_unstable();
        firsts.dedup();
        assert_eq!(firsts.len(), n);
    }

    /// How the tries fare as one destination's NAT ports fill (the ports
    /// are per destination: the reverse key holds the remote address and
    /// port; a full *table* of flows to many destinations takes one try).
    /// Measured by placing flows with the tries up to each fill, then
    /// counting, for 20,000 more flows, the tries each needed and those that
    /// found none (they fall back to the first candidate's holder, which
    /// gives its port up when idle: `nat::evict::reclaim_port`). Printed:
    /// `cargo test -p sluice-common tries_as -- --nocapture`.
    #[test]
    fn tries_as_one_destinations_ports_fill() {
        let range = 36_304; // the default ranges: 1024-32767 and 61000-65535
        let mut rows = Vec::new();
        for fill in [50u32, 75, 90, 95, 99] {
            let mut taken = vec![false; range as usize];
            let want = range * fill / 100;
            let (mut placed, mut n) = (0, 0u32);
            while placed < want {
                let h = hash(n);
                n += 1;
                if let Some(x) = (0..NAT_PORT_TRIES)
                    .map(|i| nat_port_index(h, i, range) as usize)
                    .find(|&x| !taken[x])
                {
                    taken[x] = true;
                    placed += 1;
                }
            }
            let (mut tries, mut found, mut failed) = (0u64, 0u64, 0u64);
            for m in 0..20_000 {
                let h = hash(1_000_000 + m);
                match (0..NAT_PORT_TRIES).find(|&i| !taken[nat_port_index(h, i, range) as usize]) {
                    Some(i) => {
                        tries += u64::from(i) + 1;
                        found += 1;
                    }
                    None => failed += 1,
                }
            }
            let mean = tries as f64 / found.max(1) as f64;
            let failed_pct = failed as f64 / 200.0;
            std::println!("{fill}% of one destination's ports taken: {mean:.2} tries on average, {failed_pct:.2}% find none in 32");
            rows.push((fill, mean, failed_pct));
        }
        // Up to three quarters full nearly every flow finds a port in a few
        // tries; past nine tenths the fallback carries a share of them.
        assert!(rows[0].1 < 3.0 && rows[0].2 == 0.0, "{rows:?}");
        assert!(rows[1].1 < 6.0 && rows[1].2 < 0.5, "{rows:?}");
        assert!(rows[2].2 < 10.0, "{rows:?}");
    }

    /// The bench's new-connections figure: 20,000 connections to one server
    /// within the closing timeout, 36,000 NAT ports. Every flow gets a port;
    /// neighbours as tries (what the programs did before) left some without.
    #[test]
    fn a_range_half_full_still_has_a_port_for_every_flow() {
        let (range, flows) = (36_000, 20_000);
        assert_eq!(failures(range, flows, nat_port_index), 0);
        let linear = failures(range, flows, |h, i, r| (h % r + i) % r);
        assert!(linear > 0, "linear probing: {linear} failures");
        // Nine tenths full: few fail.
        assert!(failures(range, 32_400, nat_port_index) < 100);
    }
}
