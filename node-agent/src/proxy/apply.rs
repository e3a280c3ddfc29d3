//! Keeping the Service maps as [`super::desired`] says, writing only what
//! changed: each Service port keeps its id while it exists (ids are reused
//! once free); a restarted agent takes over the ids its predecessor wrote,
//! by the frontends, and removes what no Service port claims any more.
use std::collections::{BTreeMap, BTreeSet};

use sluice_common::{Backend, SvcKey};
use sluice_maps::lb::LbMaps;

use super::desired::{Port, Ports};
use crate::error::Result;

/// What was written for one Service port.
#[derive(Clone, Debug)]
struct Written {
    id: u32,
    port: Port,
}

/// What the maps hold, as this agent wrote or found it.
#[derive(Default)]
pub(crate) struct Applied {
    by_name: BTreeMap<String, Written>,
    /// The maps were read once (a restart's takeover is done).
    loaded: bool,
    /// Ids below `next` that no Service port holds.
    free: BTreeSet<u32>,
    next: u32,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    pub(crate) written: usize,
    pub(crate) removed: usize,
    /// Service ports that could not be written, and why (a full map): tried
    /// again at the next pass.
    pub(crate) failed: Vec<(String, String)>,
    /// Backends of UDP Service ports that lost them (removed from the port,
    /// or the port gone): their connected sockets may need closing.
    pub(crate) gone_udp: Vec<Backend>,
}

impl Applied {
    /// Forgets what was written (the maps are new: a datapath loaded again).
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// How many Service ports are in the maps.
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    /// The id the Service port `name` holds in the maps, if written.
    pub(crate) fn id_of(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).map(|w| w.id)
    }

    fn take_id(&mut self) -> u32 {
        if let Some(id) = self.free.pop_first() {
            return id;
        }
        self.next += 1;
        self.next - 1
    }

    /// A restart: the frontends in the maps name the ids and counts of the
    /// Service ports an earlier agent wrote. Each wanted port whose frontend
    /// is there keeps its id; what no wanted port claims is removed.
    fn take_over(&mut self, maps: &mut LbMaps, want: &Ports) -> Result<usize> {
        let found = maps.frontends();
        let by_key: BTreeMap<_, _> = found
            .iter()
            .map(|(k, v)| ((k.addr.addr, k.port, k.proto), *v))
            .collect();
        let mut claimed = BTreeSet::new();
        for (name, port) in want {
            let hit = port
                .frontends
                .iter()
                .find_map(|k| by_key.get(&(k.addr.addr, k.port, k.proto)));
            if let Some(v) = hit.filter(|v| !claimed.contains(&v.id)) {
                claimed.insert(v.id);
                // What it had: its frontends in the maps and its count; the
                // next write makes it what is wanted.
                let frontends = found
                    .iter()
                    .filter(|(_, o)| o.id == v.id)
                    .map(|(k, _)| *k)
                    .collect();
                let backends = maps.backends(v.id, v.count);
                self.by_name.insert(
                    name.clone(),
                    Written {
                        id: v.id,
                        port: Port {
                            frontends,
                            backends,
                            flags: v.flags,
                            affinity_secs: v.affinity_secs,
                            about: super::desired::About::default(),
                        },
                    },
                );
            }
        }
        let mut removed = 0;
        let mut stale: BTreeMap<u32, (Vec<SvcKey>, u32)> = BTreeMap::new();
        for (k, v) in &found {
            if !claimed.contains(&v.id) {
                let e = stale.entry(v.id).or_default();
                e.0.push(*k);
                e.1 = e.1.max(v.count);
            }
        }
        for (id, (keys, count)) in stale {
            maps.remove_frontends(&keys)?;
            maps.remove_slots(id, 0, count)?;
            removed += 1;
        }
        self.next = found
            .iter()
            .map(|(_, v)| v.id + 1)
            .chain(claimed.iter().map(|id| id + 1))
            .max()
            .unwrap_or(0);
        self.free = (0..self.next).filter(|id| !claimed.contains(id)).collect();
        self.loaded = true;
        Ok(removed)
    }

    /// Makes the maps hold `want`.
    pub(crate) fn sync(&mut self, maps: &mut LbMaps, want: &Ports) -> Result<Pass> {
        let mut pass = Pass::default();
        if !self.loaded {
            pass.removed += self.take_over(maps, want)?;
        }
        // Removals first: they make room.
        let gone: Vec<String> = self
            .by_name
            .keys()
            .filter(|n| !want.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(w) = self.by_name.remove(&name) {
                if udp(&w.port) {
                    pass.gone_udp.extend_from_slice(&w.port.backends);
                }
                maps.remove_frontends(&w.port.frontends)?;
                maps.remove_slots(w.id, 0, count(&w.port))?;
                self.free.insert(w.id);
                pass.removed += 1;
            }
        }
        for (name, port) in want {
            let old = self.by_name.get(name);
            if old.is_some_and(|w| same(&w.port, port)) {
                continue;
            }
            let had = old.map(|w| (w.id, count(&w.port), w.port.frontends.clone()));
            let lost: Vec<Backend> = old
                .filter(|w| udp(&w.port))
                .map(|w| {
                    w.port
                        .backends
                        .iter()
                        .filter(|b| !port.backends.contains(b))
                        .copied()
                        .collect()
                })
                .unwrap_or_default();
            // Backends that stay keep their slots (session affinity remembers
            // a slot; connections picked since keep theirs either way).
            let mut port = port.clone();
            if let Some(w) = old {
                port.backends = stable_order(&w.port.backends, &port.backends);
            }
            let new = had.is_none();
            let (id, old_count, old_fronts) = if let Some(h) = had {
                h
            } else {
                let id = self.take_id();
                maps.reset_translations(id)?;
                (id, 0, Vec::new())
            };
            match maps.write(
                id,
                &port.frontends,
                &port.backends,
                (port.flags, port.affinity_secs),
                old_count,
            ) {
                Ok(()) => {
                    let dropped: Vec<SvcKey> = old_fronts
                        .into_iter()
                        .filter(|k| !port.frontends.contains(k))
                        .collect();
                    maps.remove_frontends(&dropped)?;
                    pass.gone_udp.extend(lost);
                    self.by_name.insert(name.clone(), Written { id, port });
                    pass.written += 1;
                }
                Err(e @ sluice_maps::Error::Full { .. }) => {
                    // Nothing of it counts as written: the next pass tries
                    // again (the slots written stay unreferenced or are
                    // overwritten then).
                    if new {
                        self.free.insert(id);
                    }
                    pass.failed.push((name.clone(), e.to_string()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(pass)
    }
}

/// `new` in an order that keeps each backend of `old` still in `new` in its
/// slot: holes (backends gone) take the backends that now sit past the new
/// count, then the new ones.
fn stable_order(old: &[Backend], new: &[Backend]) -> Vec<Backend> {
    let n = new.len();
    let mut slots: Vec<Option<Backend>> =
        old.iter().map(|b| new.contains(b).then_some(*b)).collect();
    slots.resize(n.max(slots.len()), None);
    let mut movers: Vec<Backend> = slots[n..].iter().flatten().copied().collect();
    slots.truncate(n);
    let mut fresh = new.iter().filter(|b| !old.contains(b)).copied();
    for s in &mut slots {
        if s.is_none() {
            *s = movers.pop().or_else(|| fresh.next());
        }
    }
    slots.into_iter().flatten().collect()
}

/// Whether two Service ports hold the same (backends in any slot order).
fn same(a: &Port, b: &Port) -> bool {
    let sorted = |p: &Port| {
        let mut v: Vec<([u8; 16], u16)> =
            p.backends.iter().map(|x| (x.addr.addr, x.port)).collect();
        v.sort_unstable();
        v
    };
    a.frontends == b.frontends
        && a.flags == b.flags
        && a.affinity_secs == b.affinity_secs
        && sorted(a) == sorted(b)
}

/// Whether a Service port is a UDP one (its frontends all share its
/// protocol).
pub(crate) fn udp(p: &Port) -> bool {
    p.frontends
        .first()
        .is_some_and(|k| i32::from(k.proto) == libc::IPPROTO_UDP)
}

fn count(p: &Port) -> u32 {
    u32::try_from(p.backends.len()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    fn b(last: u8) -> Backend {
        sluice_maps::lb::backend(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), 80)
    }

    #[test]
    fn backends_that_stay_keep_their_slots() {
        let old = [b(1), b(2), b(3), b(4)];
        // One gone from the middle: the last moves into its slot.
        assert_eq!(stable_order(&old, &[b(1), b(2), b(4)]), [b(1), b(2), b(4)]);
        assert_eq!(stable_order(&old, &[b(1), b(3), b(4)]), [b(1), b(4), b(3)]);
        // A new one takes the slot of one gone.
        assert_eq!(
            stable_order(&[b(1), b(2), b(3)], &[b(1), b(3), b(5)]),
            [b(1), b(5), b(3)]
        );
        // More: the new ones after the old.
        assert_eq!(
            stable_order(&[b(1), b(2)], &[b(3), b(2), b(1), b(4)]),
            [b(1), b(2), b(3), b(4)]
        );
        // Nothing before: the order given.
        assert_eq!(stable_order(&[], &[b(2), b(1)]), [b(2), b(1)]);
        assert!(stable_order(&old, &[]).is_empty());
    }
}
