//! Address ranges and range sets (host-local's `Range` and `RangeSet`): pure address
//! arithmetic, no I/O. Addresses are compared as integers (IPv4 as `u32`, IPv6 as
//! `u128`, both widened to `u128`); families never mix.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

/// One pool: the addresses from `range_start` to `range_end` (both inclusive) of
/// `subnet`, handing out everything except the gateway (and, for IPv4, the network and
/// broadcast addresses). Built and validated by [`super::config`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    /// The subnet with its host bits clear; its prefix length goes into results.
    pub subnet: IpNetwork,
    pub range_start: IpAddr,
    pub range_end: IpAddr,
    pub gateway: IpAddr,
}

/// Ranges from which one address is allocated; all of one family, none overlapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<Range>,
}

/// The address as an integer.
pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address `value` in the family of `like`; IPv4 keeps the low 32 bits.
pub(crate) fn from_u128(value: u128, like: IpAddr) -> IpAddr {
    match like {
        // An IPv4 value is below 2^32.
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(value).unwrap_or(u32::MAX))),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

pub(crate) fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

impl Range {
    /// The default `rangeStart` and `gateway`: the network address + 1.
    pub fn default_start(subnet: &IpNetwork) -> IpAddr {
        let net = subnet.network();
        from_u128(to_u128(net).wrapping_add(1), net)
    }

    /// The default `rangeEnd`: the broadcast address - 1 for IPv4, the last address
    /// of the subnet for IPv6 (host-local's `lastIP`).
    pub fn default_end(subnet: &IpNetwork) -> IpAddr {
        let last = subnet.broadcast();
        match last {
            IpAddr::V4(_) => from_u128(to_u128(last).wrapping_sub(1), last),
            IpAddr::V6(_) => last,
        }
    }

    /// Whether `ip` lies in the subnet and between start and end (host-local `Contains`).
    pub fn contains(&self, ip: IpAddr) -> bool {
        same_family(ip, self.range_start)
            && self.subnet.contains(ip)
            && to_u128(self.range_start) <= to_u128(ip)
            && to_u128(ip) <= to_u128(self.range_end)
    }

    /// Whether `ip` is never handed out: the gateway and, for IPv4, the network and
    /// broadcast addresses (an explicit `rangeStart`/`rangeEnd` may include them).
    pub fn is_excluded(&self, ip: IpAddr) -> bool {
        ip == self.gateway
            || (ip.is_ipv4() && (ip == self.subnet.network() || ip == self.subnet.broadcast()))
    }

    /// Whether `ip` can be allocated from this range.
    pub fn is_allocatable(&self, ip: IpAddr) -> bool {
        self.contains(ip) && !self.is_excluded(ip)
    }

    /// Whether the two ranges share an address (different families never do).
    pub fn overlaps(&self, other: &Range) -> bool {
        same_family(self.range_start, other.range_start)
            && to_u128(self.range_start) <= to_u128(other.range_end)
            && to_u128(other.range_start) <= to_u128(self.range_end)
    }

    /// How many addresses this range can hand out (saturating at `u128::MAX`).
    pub fn capacity(&self) -> u128 {
        let (start, end) = (to_u128(self.range_start), to_u128(self.range_end));
        if end < start {
            return 0;
        }
        let total = (end - start).saturating_add(1);
        let mut excluded = vec![self.gateway];
        if self.subnet.is_ipv4() {
            excluded.push(self.subnet.network());
            excluded.push(self.subnet.broadcast());
        }
        excluded.sort();
        excluded.dedup();
        let inside = excluded.iter().filter(|ip| self.contains(**ip)).count() as u128;
        total.saturating_sub(inside)
    }
}

impl fmt::Display for Range {
    /// `10.0.0.2-10.0.0.254 (10.0.0.0/24)`: host-local's `start-end`, plus the subnet.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{} ({})",
            self.range_start, self.range_end, self.subnet
        )
    }
}

impl RangeSet {
    /// A set of already validated ranges, in iteration order.
    pub fn new(ranges: Vec<Range>) -> Self {
        Self { ranges }
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    pub fn is_ipv4(&self) -> bool {
        self.ranges.first().is_some_and(|r| r.subnet.is_ipv4())
    }

    /// The range that contains `ip`, if any.
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    /// Whether `ip` can be allocated from this set.
    pub fn is_allocatable(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some_and(|r| !r.is_excluded(ip))
    }

    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.ranges
            .iter()
            .any(|a| other.ranges.iter().any(|b| a.overlaps(b)))
    }

    /// How many addresses the whole set can hand out (saturating).
    pub fn capacity(&self) -> u128 {
        self.ranges
            .iter()
            .fold(0u128, |n, r| n.saturating_add(r.capacity()))
    }

    /// The next allocatable address after `after`, in range order, wrapping from the
    /// end of the last range to the start of the first. Starts at the first range's
    /// start when `after` is `None` or outside the set. `None` when the set has no
    /// allocatable address at all.
    pub fn next_after(&self, after: Option<IpAddr>) -> Option<IpAddr> {
        if self.capacity() == 0 {
            return None;
        }
        let n = self.ranges.len();
        let position = after.and_then(|ip| {
            let idx = self.ranges.iter().position(|r| r.contains(ip))?;
            Some((idx, to_u128(ip)))
        });
        let (mut idx, mut cur) = match position {
            Some((i, v)) => self.step(i, v),
            None => (0, to_u128(self.ranges.first()?.range_start)),
        };
        // Each range holds at most three excluded addresses, so a full cycle over the
        // ranges finds an allocatable address within 4 steps per range.
        for _ in 0..=4 * n {
            let range = self.ranges.get(idx)?;
            let ip = from_u128(cur, range.range_start);
            if !range.is_excluded(ip) {
                return Some(ip);
            }
            (idx, cur) = self.step(idx, cur);
        }
        None
    }

    /// The position after `cur` in range `idx`: the next address, or the start of the
    /// next range (wrapping) once `cur` is the range end.
    fn step(&self, idx: usize, cur: u128) -> (usize, u128) {
        match self.ranges.get(idx) {
            Some(r) if cur < to_u128(r.range_end) => (idx, cur + 1),
            _ => {
                let next = (idx + 1) % self.ranges.len().max(1);
                let start = self.ranges.get(next).map_or(0, |r| to_u128(r.range_start));
                (next, start)
            }
        }
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A range with host-local's defaults for whatever is `None`.
    pub(crate) fn range(subnet: &str, start: Option<&str>, end: Option<&str>) -> Range {
        let subnet: IpNetwork = subnet.parse().unwrap();
        Range {
            subnet,
            range_start: start.map_or_else(|| Range::default_start(&subnet), ip),
            range_end: end.map_or_else(|| Range::default_end(&subnet), ip),
            gateway: Range::default_start(&subnet),
        }
    }

    #[test]
    fn defaults_match_host_local() {
        let r = range("192.0.2.0/24", None, None);
        assert_eq!(r.range_start, ip("192.0.2.1"));
        assert_eq!(r.range_end, ip("192.0.2.254"));
        assert_eq!(r.gateway, ip("192.0.2.1"));
        let r = range("192.0.2.0/25", None, None);
        assert_eq!(r.range_end, ip("192.0.2.126"));
        let r = range("2001:db8:1::/64", None, None);
        assert_eq!(r.range_start, ip("2001:db8:1::1"));
        assert_eq!(r.range_end, ip("2001:db8:1::ffff:ffff:ffff:ffff"));
    }

    #[test]
    fn contains_respects_start_end_and_family() {
        let r = range("192.0.2.0/24", Some("192.0.2.40"), Some("192.0.2.50"));
        assert!(!r.contains(ip("192.0.3.0")));
        assert!(!r.contains(ip("192.0.2.39")));
        assert!(r.contains(ip("192.0.2.40")));
        assert!(r.contains(ip("192.0.2.50")));
        assert!(!r.contains(ip("192.0.2.51")));
        assert!(!r.contains(ip("::ffff:192.0.2.45")));
        let r6 = range(
            "2001:db8:1::/64",
            Some("2001:db8:1::40"),
            Some("2001:db8:1::50"),
        );
        assert!(!r6.contains(ip("2001:db8:1::39")));
        assert!(r6.contains(ip("2001:db8:1::40")));
        assert!(r6.contains(ip("2001:db8:1::50")));
        assert!(!r6.contains(ip("2001:db8:2::40")));
        assert!(!r6.contains(ip("192.0.2.45")));
    }

    #[test]
    fn overlap_cases() {
        let cases = [
            (
                range("10.0.0.0/24", None, None),
                range("10.0.1.0/24", None, None),
                false,
            ),
            (
                range("0.0.0.0/24", None, None),
                range("::/24", None, None),
                false,
            ),
            (
                range("10.0.0.0/24", None, None),
                range("10.0.0.0/24", None, None),
                true,
            ),
            (
                range("10.0.0.0/20", None, None),
                range("10.0.1.0/24", None, None),
                true,
            ),
            (
                range("10.0.0.0/24", None, Some("10.0.0.127")),
                range("10.0.0.0/24", Some("10.0.0.128"), None),
                false,
            ),
            (
                range("10.0.0.0/24", None, Some("10.0.0.127")),
                range("10.0.0.0/24", Some("10.0.0.127"), None),
                true,
            ),
        ];
        for (a, b, want) in cases {
            assert_eq!(a.overlaps(&b), want, "{a} vs {b}");
            assert_eq!(b.overlaps(&a), want, "{b} vs {a}");
        }
    }

    #[test]
    fn excludes_gateway_network_and_broadcast_for_v4_only() {
        let r = range("10.0.0.0/29", Some("10.0.0.0"), Some("10.0.0.7"));
        assert!(r.is_excluded(ip("10.0.0.0")));
        assert!(r.is_excluded(ip("10.0.0.1")));
        assert!(r.is_excluded(ip("10.0.0.7")));
        assert!(r.is_allocatable(ip("10.0.0.2")));
        assert_eq!(r.capacity(), 5);
        let r6 = range("fd00::/125", Some("fd00::"), Some("fd00::7"));
        assert!(r6.is_allocatable(ip("fd00::")));
        assert!(r6.is_allocatable(ip("fd00::7")));
        assert!(!r6.is_allocatable(ip("fd00::1")));
        assert_eq!(r6.capacity(), 7);
    }

    #[test]
    fn capacity_saturates_for_huge_v6() {
        let r = range("::/0", Some("::"), None);
        assert_eq!(r.capacity(), u128::MAX - 1);
        let set = RangeSet::new(vec![r.clone(), r]);
        assert_eq!(set.capacity(), u128::MAX);
    }

    #[test]
    fn iterates_in_order_skipping_gateway_and_wraps() {
        let set = RangeSet::new(vec![range("192.168.1.0/29", None, None)]);
        let mut seen = vec![];
        let mut cur = None;
        for _ in 0..6 {
            cur = set.next_after(cur);
            seen.push(cur.unwrap().to_string());
        }
        assert_eq!(
            seen,
            [
                "192.168.1.2",
                "192.168.1.3",
                "192.168.1.4",
                "192.168.1.5",
                "192.168.1.6",
                "192.168.1.2"
            ]
        );
        // From the middle, and from an address outside the set.
        assert_eq!(
            set.next_after(Some(ip("192.168.1.3"))),
            Some(ip("192.168.1.4"))
        );
        assert_eq!(
            set.next_after(Some(ip("10.9.9.9"))),
            Some(ip("192.168.1.2"))
        );
    }

    #[test]
    fn iterates_across_ranges_and_rolls_over() {
        let set = RangeSet::new(vec![
            range("10.0.0.0/30", None, None),
            range("10.0.1.0/30", None, None),
            range("10.0.2.0/30", None, None),
        ]);
        assert_eq!(set.next_after(None), Some(ip("10.0.0.2")));
        assert_eq!(set.next_after(Some(ip("10.0.0.2"))), Some(ip("10.0.1.2")));
        assert_eq!(set.next_after(Some(ip("10.0.2.2"))), Some(ip("10.0.0.2")));
        assert_eq!(set.capacity(), 3);
    }

    #[test]
    fn a_range_of_only_excluded_addresses_is_skipped_or_empty() {
        let only_gw = range("10.0.0.0/24", Some("10.0.0.1"), Some("10.0.0.1"));
        assert_eq!(RangeSet::new(vec![only_gw.clone()]).next_after(None), None);
        let set = RangeSet::new(vec![only_gw, range("10.0.1.0/30", None, None)]);
        assert_eq!(set.next_after(None), Some(ip("10.0.1.2")));
        assert_eq!(set.next_after(Some(ip("10.0.1.2"))), Some(ip("10.0.1.2")));
    }

    #[test]
    fn ipv6_iteration_uses_full_width() {
        let set = RangeSet::new(vec![range(
            "2001:db8::/64",
            Some("2001:db8::ffff:ffff:ffff:fffe"),
            None,
        )]);
        assert_eq!(
            set.next_after(Some(ip("2001:db8::ffff:ffff:ffff:fffe"))),
            Some(ip("2001:db8::ffff:ffff:ffff:ffff"))
        );
        assert_eq!(
            set.next_after(Some(ip("2001:db8::ffff:ffff:ffff:ffff"))),
            Some(ip("2001:db8::ffff:ffff:ffff:fffe"))
        );
    }
}
