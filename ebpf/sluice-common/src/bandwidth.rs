//! Bandwidth limits: one token bucket per direction and pod (`sl_bw`).

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
    /// When tokens were last added (`CLOCK_MONOTONIC` ns).
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
    /// A bucket holds at least `rate x DEFAULT_BURST_NS` (and at least
    /// [`MIN_DEFAULT_BURST`] bytes) whatever its burst: a rate without a burst
    /// gets that as its burst, a smaller burst is kept as configured and the
    /// datapath uses the larger depth ([`super::Bucket::depth`]). Without a
    /// queue (no `sch_fq` for EDT) a limit can only drop, and a TCP sender that
    /// loses the tail of a window waits for its retransmission timer, 200 ms at
    /// least however short the RTT: a bucket smaller than that much traffic
    /// never makes the idle time up (measured at 100 Mbit/s: a 20 ms bucket gave
    /// 10 Mbit/s, 100 ms 50, 300 ms 104; at 200 Mbit/s the 10 ms users of the
    /// reference plugin configure gave 10 Mbit/s). 300 ms keeps a single stream
    /// within 10% of the rate while the first second carries at most 1.3x the
    /// rate. The reference's tbf qdisc queues instead of dropping, which is why
    /// a 10 ms bucket is enough there.
    pub const DEFAULT_BURST_NS: u64 = 300_000_000;
    /// Two 64 KiB GSO packets.
    pub const MIN_DEFAULT_BURST: u64 = 128 * 1024;
    /// How far below zero a packet can take a bucket (a GSO packet up to 256 KiB,
    /// BIG TCP included, passing a full bucket with a smaller burst).
    pub const MAX_DEFICIT: u64 = 256 * 1024;
}

impl Bucket {
    /// The bucket for `rate_bits` bits/s and `burst_bits` bits (CNI units), in
    /// bytes, full (at its [`Self::depth`]) at `now_ns`; no rate: no limit.
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
            None => Self::tcp_depth(rate),
        };
        let burst = if burst > u64::from(u32::MAX) {
            u64::from(u32::MAX)
        } else {
            burst
        };
        let depth = Self::depth_for(rate, burst);
        Self {
            rate,
            burst,
            // At most (4 GiB + 256 KiB) x 1e9 ns: fits.
            fill_ns: u64::try_from(
                u128::from(depth + bw_limits::MAX_DEFICIT) * 1_000_000_000 / u128::from(rate),
            )
            .unwrap_or(u64::MAX),
            // At most 4 GiB: fits.
            tokens: depth.cast_signed(),
            last_ns: now_ns,
            passed: 0,
            dropped: 0,
        }
    }

    /// The least depth (bytes) of a bucket of `rate` bytes/s: what a single TCP
    /// stream needs to keep the rate through a policer (see
    /// [`bw_limits::DEFAULT_BURST_NS`]), at most 4 GiB. In u64 only: the eBPF
    /// programs compute it too.
    #[inline(always)]
    pub const fn tcp_depth(rate: u64) -> u64 {
        // rate <= 1 Tbit/s (1.25e11 B/s): x 300 fits in 64 bits.
        let d = rate * (bw_limits::DEFAULT_BURST_NS / 1_000_000) / 1000;
        if d < bw_limits::MIN_DEFAULT_BURST {
            bw_limits::MIN_DEFAULT_BURST
        } else if d > u32::MAX as u64 {
            u32::MAX as u64
        } else {
            d
        }
    }

    /// The depth the datapath gives a bucket of `rate` bytes/s and `burst`
    /// bytes: the burst, or [`Self::tcp_depth`] if that is larger.
    #[inline(always)]
    pub const fn depth_for(rate: u64, burst: u64) -> u64 {
        let floor = Self::tcp_depth(rate);
        if burst > floor {
            burst
        } else {
            floor
        }
    }

    /// See [`Self::depth_for`].
    #[inline(always)]
    pub const fn depth(&self) -> u64 {
        Self::depth_for(self.rate, self.burst)
    }

    /// (rate bits/s, burst bits) as configured, or `None` without a limit.
    pub fn bits(&self) -> Option<(u64, u64)> {
        (self.rate != 0).then_some((self.rate * 8, self.burst * 8))
    }

    /// The depth in bits (see [`Self::depth`]), or `None` without a limit.
    pub fn depth_bits(&self) -> Option<u64> {
        (self.rate != 0).then_some(self.depth() * 8)
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

/// A pod's EDT egress clock (`sl_edt`, keyed like `sl_bw` by the host veth's
/// ifindex): present when the pod's `eth0` has an `fq` qdisc and the `pod_edt`
/// program, which then shapes its egress instead of `from_pod`'s bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EdtSlot {
    /// The departure time given to the pod's last packet (`CLOCK_MONOTONIC` ns).
    pub last_ns: u64,
    /// The pod's `eth0` ifindex in its own namespace: only packets leaving by
    /// it use this clock (a pod sending with another pod's address must not
    /// spend that pod's rate).
    pub pod_ifindex: u32,
    pub _pad: u32,
}

/// How far ahead of now EDT may schedule a packet; later ones are dropped
/// (Cilium's default drop horizon; `fq`'s own is 10 s).
pub const EDT_HORIZON_NS: u64 = 2_000_000_000;
/// Packets `fq` on a pod's `eth0` holds in all and per flow (`limit`,
/// `flow_limit`; its defaults are 10,000 and 100). A sender's socket buffer
/// normally bounds what it queues (the packets stay charged to it until they
/// leave), but `fq` drops what exceeds a flow's limit *after* the program charged
/// it to the pod's clock, which then runs ahead of what leaves: the flow limit
/// is raised to the total so that only the horizon drops.
pub const EDT_FQ_LIMIT: u32 = 10_000;
