//! Allocation over range sets and a [`Store`], as host-local does it: one address per
//! range set; a requested address goes to the set that contains it; every other set
//! gets the next free address after its last reserved one (round robin, wrapping),
//! never the gateway. Callers hold the store lock.
use std::collections::HashSet;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::range::RangeSet;
use super::store::{Reservation, Store};
use crate::cni::AttachmentId;
use crate::error::Error;

/// One reserved address and what a result needs about its range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub range_set: usize,
    /// The address with the prefix length of its subnet.
    pub address: IpNetwork,
    pub gateway: IpAddr,
}

/// Whether [`allocate`] looks for addresses `id` holds already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Duplicates {
    /// Read every reservation and refuse when `id` holds one (host-local's
    /// behaviour; costs one file read per address in use).
    Refuse,
    /// The caller knows `id` holds none: the plugin's ADD refuses an
    /// attachment that has a record, and writes the record with the addresses
    /// right after reserving them, so that a DEL finds them.
    CheckedByCaller,
}

/// Reserves one address per range set for `id`, using `requested` where given.
/// On error, whatever this call reserved is released again. Which addresses
/// are taken is asked address by address from the last one reserved on, not
/// read from a listing of every reservation: an ADD costs the same on a node
/// with 20 pods or 1,000.
pub fn allocate<S: Store + ?Sized>(
    store: &mut S,
    sets: &[RangeSet],
    id: &AttachmentId,
    requested: &[IpAddr],
    duplicates: Duplicates,
) -> Result<Vec<Allocation>, Error> {
    let wanted = assign_requested(sets, requested)?;
    if duplicates == Duplicates::Refuse {
        refuse_duplicate(sets, &store.reservations()?, id)?;
    }
    let mut done: Vec<Allocation> = Vec::with_capacity(sets.len());
    for (idx, (set, want)) in sets.iter().zip(wanted).enumerate() {
        let got = match want {
            Some(ip) => reserve_requested(store, set, idx, id, ip),
            None => reserve_next(store, set, idx, id),
        };
        match got {
            Ok(a) => done.push(a),
            Err(e) => {
                for a in &done {
                    let _ = store.release(a.address.ip());
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// The indexes of the range sets that have no free address left.
pub fn exhausted_sets<S: Store + ?Sized>(
    store: &S,
    sets: &[RangeSet],
) -> Result<Vec<usize>, Error> {
    let existing = store.reserved_ips()?;
    Ok(sets
        .iter()
        .enumerate()
        .filter(|(_, set)| {
            let used = existing
                .iter()
                .filter(|ip| set.is_allocatable(**ip))
                .count();
            used as u128 >= set.capacity()
        })
        .map(|(i, _)| i)
        .collect())
}

/// Matches each requested address to the one range set that contains it.
fn assign_requested(sets: &[RangeSet], requested: &[IpAddr]) -> Result<Vec<Option<IpAddr>>, Error> {
    let mut out: Vec<Option<IpAddr>> = vec![None; sets.len()];
    let mut seen = HashSet::new();
    for ip in requested.iter().map(std::net::IpAddr::to_canonical) {
        if !seen.insert(ip) {
            continue;
        }
        let found = sets
            .iter()
            .enumerate()
            .find_map(|(i, s)| s.range_for(ip).map(|r| (i, s, r)));
        let Some((idx, set, range)) = found else {
            return Err(unavailable(
                ip,
                format!("not in any configured range ({})", describe(sets)),
            ));
        };
        if range.is_excluded(ip) {
            let what = if ip == range.gateway {
                "the gateway"
            } else {
                "the network or broadcast address"
            };
            return Err(unavailable(ip, format!("is {what} of range {range}")));
        }
        match out.get_mut(idx) {
            Some(Some(prev)) => {
                return Err(unavailable(
                    ip,
                    format!(
                        "range set {idx} ({set}) already gets requested IP {prev}; \
                         one address is allocated per range set"
                    ),
                ))
            }
            Some(slot) => *slot = Some(ip),
            None => {}
        }
    }
    Ok(out)
}

/// host-local refuses a second allocation for an attachment that already holds an
/// address in these ranges (the spec forbids duplicate allocation).
fn refuse_duplicate(
    sets: &[RangeSet],
    existing: &[Reservation],
    id: &AttachmentId,
) -> Result<(), Error> {
    match existing
        .iter()
        .find(|r| r.belongs_to(id) && sets.iter().any(|s| s.contains(r.ip)))
    {
        Some(r) => Err(unavailable(
            r.ip,
            format!("already allocated to {r}; duplicate allocation is not allowed"),
        )),
        None => Ok(()),
    }
}

fn reserve_requested<S: Store + ?Sized>(
    store: &mut S,
    set: &RangeSet,
    idx: usize,
    id: &AttachmentId,
    ip: IpAddr,
) -> Result<Allocation, Error> {
    if let Some(owner) = store.owner_of(ip)? {
        return Err(unavailable(ip, format!("already reserved by {owner}")));
    }
    if !store.reserve(id, ip, idx)? {
        let owner = store
            .owner_of(ip)?
            .map_or_else(|| "someone else".to_string(), |o| o.to_string());
        return Err(unavailable(ip, format!("already reserved by {owner}")));
    }
    allocation(set, idx, ip)
}

/// The first free address after the set's last reserved one, wrapping around
/// (host-local's order). Each candidate is looked up on its own (one `lstat`
/// on disk) before the reservation is tried, which a race may still lose.
fn reserve_next<S: Store + ?Sized>(
    store: &mut S,
    set: &RangeSet,
    idx: usize,
    id: &AttachmentId,
) -> Result<Allocation, Error> {
    let capacity = set.capacity();
    // A last address outside the set (ranges changed) restarts at the beginning.
    let mut cur = store.last_reserved(idx)?.filter(|ip| set.contains(*ip));
    let mut tried: u128 = 0;
    while tried < capacity {
        let Some(ip) = set.next_after(cur) else {
            break;
        };
        cur = Some(ip);
        tried += 1;
        if store.is_reserved(ip)? {
            continue;
        }
        if store.reserve(id, ip, idx)? {
            return allocation(set, idx, ip);
        }
    }
    Err(Error::IpamExhausted {
        ranges: format!("range set {idx}: {set}"),
    })
}

fn allocation(set: &RangeSet, idx: usize, ip: IpAddr) -> Result<Allocation, Error> {
    let range = set
        .range_for(ip)
        .ok_or_else(|| unavailable(ip, format!("not in range set {idx} ({set})")))?;
    let address =
        IpNetwork::new(ip, range.subnet.prefix()).map_err(|e| unavailable(ip, e.to_string()))?;
    Ok(Allocation {
        range_set: idx,
        address,
        gateway: range.gateway,
    })
}

fn unavailable(ip: IpAddr, reason: String) -> Error {
    Error::IpamUnavailable {
        ip: ip.to_string(),
        reason,
    }
}

fn describe(sets: &[RangeSet]) -> String {
    let parts: Vec<String> = sets
        .iter()
        .enumerate()
        .map(|(i, s)| format!("range set {i}: {s}"))
        .collect();
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::range::tests::{ip, range};
    use crate::ipam::range::Range;
    use crate::ipam::store::tests::att;
    use crate::ipam::store::MemStore;

    fn set(subnets: &[&str]) -> RangeSet {
        RangeSet::new(subnets.iter().map(|s| range(s, None, None)).collect())
    }

    fn next(store: &mut MemStore, sets: &[RangeSet], id: &str) -> Result<String, Error> {
        let a = allocate(store, sets, &att(id, "eth0"), &[], Duplicates::Refuse)?;
        Ok(a[0].address.ip().to_string())
    }

    /// A store holding `taken` (by "other") and remembering `last` for set 0.
    fn store_with(taken: &[&str], last: Option<&str>) -> MemStore {
        let mut s = MemStore::default();
        for t in taken {
            assert!(s.reserve(&att("other", "eth0"), ip(t), 9).unwrap());
        }
        if let Some(l) = last {
            s.set_last_reserved(0, ip(l));
        }
        s
    }

    #[test]
    fn round_robin_cases_from_host_local() {
        // (subnets of the set, addresses already taken, last reserved, expected)
        type Case<'a> = (&'a [&'a str], &'a [&'a str], Option<&'a str>, &'a str);
        let cases: &[Case] = &[
            (&["10.0.0.0/29"], &[], None, "10.0.0.2"),
            (&["2001:db8:1::0/64"], &[], None, "2001:db8:1::2"),
            (&["10.0.0.0/30"], &[], None, "10.0.0.2"),
            (&["10.0.0.0/29"], &["10.0.0.2"], None, "10.0.0.3"),
            (&["10.0.0.0/29"], &[], Some("10.0.0.5"), "10.0.0.6"),
            (
                &["10.0.0.0/29"],
                &["10.0.0.4", "10.0.0.5"],
                Some("10.0.0.3"),
                "10.0.0.6",
            ),
            (
                &["10.0.0.0/29"],
                &["10.0.0.6"],
                Some("10.0.0.5"),
                "10.0.0.2",
            ),
            (
                &["10.0.0.0/29"],
                &["10.0.0.2"],
                Some("10.0.0.128"),
                "10.0.0.3",
            ),
            (
                &["10.0.0.0/29"],
                &["10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6"],
                Some("10.0.0.3"),
                "10.0.0.3",
            ),
            (&["10.0.0.0/30", "10.0.1.0/30"], &[], None, "10.0.0.2"),
            (
                &["10.0.0.0/30", "10.0.1.0/30"],
                &[],
                Some("10.0.0.2"),
                "10.0.1.2",
            ),
            (
                &["10.0.0.0/30", "10.0.1.0/30", "10.0.2.0/30"],
                &[],
                Some("10.0.2.2"),
                "10.0.0.2",
            ),
        ];
        for (subnets, taken, last, want) in cases {
            let mut s = store_with(taken, *last);
            let got = next(&mut s, &[set(subnets)], "ID").unwrap();
            assert_eq!(got, *want, "{subnets:?} taken={taken:?} last={last:?}");
        }
    }

    #[test]
    fn skips_gateway_and_broadcast_then_exhausts_with_a_clear_error() {
        let sets = [set(&["192.168.1.0/29"])];
        let mut s = MemStore::default();
        for i in 2..7 {
            assert_eq!(
                next(&mut s, &sets, &format!("ID{i}")).unwrap(),
                format!("192.168.1.{i}")
            );
        }
        let e = next(&mut s, &sets, "ID8").unwrap_err();
        assert_eq!(e.code(), 102, "{e}");
        assert_eq!(
            e.to_string(),
            "no free IP address in range set 0: 192.168.1.1-192.168.1.6 (192.168.1.0/29)"
        );
        assert_eq!(exhausted_sets(&s, &sets).unwrap(), [0]);
        assert!(s.get_by_id(&att("ID8", "eth0")).unwrap().is_empty());
    }

    #[test]
    fn explicit_network_and_broadcast_bounds_are_still_skipped() {
        let sets = [RangeSet::new(vec![range(
            "10.0.0.0/30",
            Some("10.0.0.0"),
            Some("10.0.0.3"),
        )])];
        let mut s = MemStore::default();
        assert_eq!(next(&mut s, &sets, "a").unwrap(), "10.0.0.2");
        assert_eq!(next(&mut s, &sets, "b").unwrap_err().code(), 102);
    }

    #[test]
    fn honours_range_start_end_and_a_gateway_inside_the_range() {
        let mut r = range("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.13"));
        r.gateway = ip("10.0.0.11");
        let sets = [RangeSet::new(vec![r])];
        let mut s = MemStore::default();
        let got: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|id| next(&mut s, &sets, id).unwrap())
            .collect();
        assert_eq!(got, ["10.0.0.10", "10.0.0.12", "10.0.0.13"]);
        assert_eq!(next(&mut s, &sets, "d").unwrap_err().code(), 102);
    }

    #[test]
    fn continues_after_the_last_reserved_and_wraps() {
        let sets = [set(&["10.0.0.0/29"])];
        let mut s = MemStore::default();
        assert_eq!(next(&mut s, &sets, "a").unwrap(), "10.0.0.2");
        assert_eq!(next(&mut s, &sets, "b").unwrap(), "10.0.0.3");
        s.release_by_id(&att("a", "eth0")).unwrap();
        // The just-freed .2 is not reused while later addresses are free.
        assert_eq!(next(&mut s, &sets, "c").unwrap(), "10.0.0.4");
        assert_eq!(next(&mut s, &sets, "d").unwrap(), "10.0.0.5");
        assert_eq!(next(&mut s, &sets, "e").unwrap(), "10.0.0.6");
        // The end is reached: wrap to the start.
        assert_eq!(next(&mut s, &sets, "f").unwrap(), "10.0.0.2");
        s.release_by_id(&att("d", "eth0")).unwrap();
        assert_eq!(next(&mut s, &sets, "g").unwrap(), "10.0.0.5");
    }

    #[test]
    fn dual_stack_gives_one_address_per_set_with_prefix_and_gateway() {
        let sets = [set(&["10.1.0.0/16"]), set(&["fd00:1::/64"])];
        let mut s = MemStore::default();
        let a = allocate(&mut s, &sets, &att("c", "eth0"), &[], Duplicates::Refuse).unwrap();
        assert_eq!(
            a,
            [
                Allocation {
                    range_set: 0,
                    address: "10.1.0.2/16".parse().unwrap(),
                    gateway: ip("10.1.0.1"),
                },
                Allocation {
                    range_set: 1,
                    address: "fd00:1::2/64".parse().unwrap(),
                    gateway: ip("fd00:1::1"),
                },
            ]
        );
        assert_eq!(s.last_reserved(0).unwrap(), Some(ip("10.1.0.2")));
        assert_eq!(s.last_reserved(1).unwrap(), Some(ip("fd00:1::2")));
    }

    #[test]
    fn ipv6_exhaustion_of_a_small_range() {
        let sets = [RangeSet::new(vec![range(
            "2001:db8::/64",
            Some("2001:db8::fffe"),
            Some("2001:db8::ffff"),
        )])];
        let mut s = MemStore::default();
        assert_eq!(next(&mut s, &sets, "a").unwrap(), "2001:db8::fffe");
        assert_eq!(next(&mut s, &sets, "b").unwrap(), "2001:db8::ffff");
        let e = next(&mut s, &sets, "c").unwrap_err();
        assert!(
            e.to_string().contains("2001:db8::fffe-2001:db8::ffff"),
            "{e}"
        );
    }

    #[test]
    fn requested_addresses() {
        let sets = [set(&["10.0.0.0/24"]), set(&["fd00::/64"])];
        let mut s = MemStore::default();
        let a = allocate(
            &mut s,
            &sets,
            &att("c1", "eth0"),
            &[ip("fd00::50"), ip("10.0.0.50")],
            Duplicates::Refuse,
        )
        .unwrap();
        let ips: Vec<String> = a.iter().map(|a| a.address.to_string()).collect();
        assert_eq!(ips, ["10.0.0.50/24", "fd00::50/64"]);

        // Only one set requested: the other allocates as usual.
        let a = allocate(
            &mut s,
            &sets,
            &att("c2", "eth0"),
            &[ip("fd00::7")],
            Duplicates::Refuse,
        )
        .unwrap();
        assert_eq!(a[0].address.ip(), ip("10.0.0.51"), "continues after .50");
        assert_eq!(a[1].address.ip(), ip("fd00::7"));

        // IPv4-mapped IPv6 is read as IPv4, as host-local canonicalizes it.
        let a = allocate(
            &mut s,
            &sets,
            &att("c3", "eth0"),
            &[ip("::ffff:10.0.0.99")],
            Duplicates::Refuse,
        )
        .unwrap();
        assert_eq!(a[0].address.ip(), ip("10.0.0.99"));
    }

    #[test]
    fn bad_requests_name_the_address_and_reserve_nothing() {
        let sets = [set(&["10.0.0.0/24"]), set(&["fd00::/64"])];
        let mut s = MemStore::default();
        let owned = [ip("10.0.0.50"), ip("fd00::50")];
        allocate(
            &mut s,
            &sets,
            &att("owner-ctr", "eth0"),
            &owned,
            Duplicates::Refuse,
        )
        .unwrap();
        let before = s.reservations().unwrap();
        let cases: &[(&[&str], &str, &str)] = &[
            (
                &["192.168.0.5"],
                "192.168.0.5",
                "not in any configured range",
            ),
            (&["10.0.0.50"], "10.0.0.50", "owner-ctr"),
            (&["fd00::9", "10.0.0.50"], "10.0.0.50", "owner-ctr"),
            // Set 0 succeeds first, then set 1 fails: set 0 is rolled back.
            (&["10.0.0.9", "fd00::50"], "fd00::50", "owner-ctr"),
            (&["10.0.0.1"], "10.0.0.1", "gateway"),
            (&["10.0.0.255"], "10.0.0.255", "not in any configured range"),
            (
                &["10.0.0.7", "10.0.0.8"],
                "10.0.0.8",
                "already gets requested IP 10.0.0.7",
            ),
        ];
        for (req, bad_ip, why) in cases {
            let req: Vec<IpAddr> = req.iter().map(|r| ip(r)).collect();
            let e =
                allocate(&mut s, &sets, &att("new", "eth0"), &req, Duplicates::Refuse).unwrap_err();
            assert_eq!(e.code(), 103, "{e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("requested IP {bad_ip} ")), "{msg}");
            assert!(msg.contains(why), "{msg} should say {why}");
            assert_eq!(s.reservations().unwrap(), before, "rolled back after {msg}");
        }
    }

    #[test]
    fn rolls_back_earlier_sets_when_a_later_one_fails() {
        let tiny = RangeSet::new(vec![range("fd00::/126", None, None)]);
        let sets = [set(&["10.0.0.0/24"]), tiny];
        let mut s = MemStore::default();
        allocate(&mut s, &sets, &att("a", "eth0"), &[], Duplicates::Refuse).unwrap();
        allocate(&mut s, &sets, &att("b", "eth0"), &[], Duplicates::Refuse).unwrap();
        let e = allocate(&mut s, &sets, &att("c", "eth0"), &[], Duplicates::Refuse).unwrap_err();
        assert_eq!(e.code(), 102);
        assert!(e.to_string().contains("range set 1"), "{e}");
        assert!(s.get_by_id(&att("c", "eth0")).unwrap().is_empty());
        assert_eq!(exhausted_sets(&s, &sets).unwrap(), [1]);
    }

    #[test]
    fn duplicate_allocation_for_the_same_attachment_is_refused() {
        let sets = [set(&["10.0.0.0/24"])];
        let mut s = MemStore::default();
        assert_eq!(next(&mut s, &sets, "c").unwrap(), "10.0.0.2");
        for req in [vec![], vec![ip("10.0.0.9")]] {
            let e =
                allocate(&mut s, &sets, &att("c", "eth0"), &req, Duplicates::Refuse).unwrap_err();
            assert_eq!(e.code(), 103, "{e}");
            assert!(e.to_string().contains("10.0.0.2"), "{e}");
            assert!(e.to_string().contains("duplicate allocation"), "{e}");
        }
        assert_eq!(s.get_by_id(&att("c", "eth0")).unwrap(), [ip("10.0.0.2")]);
        // Another interface of the same container is another attachment.
        let a = allocate(&mut s, &sets, &att("c", "eth1"), &[], Duplicates::Refuse).unwrap();
        assert_eq!(a[0].address.ip(), ip("10.0.0.3"));
        // An old-format file of the container counts as held by it.
        s.insert_legacy(ip("10.0.0.20"), "old");
        assert_eq!(
            allocate(&mut s, &sets, &att("old", "eth0"), &[], Duplicates::Refuse)
                .unwrap_err()
                .code(),
            103
        );
    }

    #[test]
    fn exhausted_sets_counts_only_allocatable_addresses() {
        let sets = [set(&["10.0.0.0/30"]), set(&["10.0.1.0/29"])];
        let mut s = MemStore::default();
        assert!(exhausted_sets(&s, &sets).unwrap().is_empty());
        // A stray reservation of the gateway does not use up the range.
        s.insert_legacy(ip("10.0.0.1"), "stray");
        assert!(exhausted_sets(&s, &sets).unwrap().is_empty());
        allocate(&mut s, &sets, &att("a", "eth0"), &[], Duplicates::Refuse).unwrap();
        assert_eq!(exhausted_sets(&s, &sets).unwrap(), [0]);
        let empty = Range {
            gateway: ip("10.2.0.1"),
            ..range("10.2.0.0/24", Some("10.2.0.1"), Some("10.2.0.1"))
        };
        assert_eq!(
            exhausted_sets(&s, &[RangeSet::new(vec![empty])]).unwrap(),
            [0]
        );
    }
}
