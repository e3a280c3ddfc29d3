//! The node agent's NAT sweep (`sluice-node`): what the in-kernel sweeper
//! does (`nat::sweep` of the eBPF crate: idle flows and stale fragment
//! entries removed), from process context. The kernel's walk runs in a perf
//! event's hard interrupt, where a masquerading node's tables took 2.6 ms a
//! second; here the walk is preemptible and reads the tables in batches.
//!
//! While the agent's lease in `sl_agent` lasts, the in-kernel sweeper skips
//! its runs; the agent renews the lease on every pass, so a stopped agent
//! hands the tables back within `SWEEP_LEASE_NS`.
use std::collections::BTreeMap;

use aya::{
    maps::{HashMap, MapData},
    Pod,
};
use sluice_common::{
    agent_slot,
    maps::{self, MapSpec},
    masq_flags, nat_flags, FragEntry, FragKey, MasqConfig, NatEntryOf, NatKeyOf, NatRevOf,
    FRAG_TIMEOUT_NS,
};

use crate::{agent, batch, nat, nat_pressure, PinRoot, Result};

/// What one pass removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// IPv4 flows past their idle timeout.
    pub flows: u64,
    /// IPv6 flows past their idle timeout.
    pub flows6: u64,
    /// Fragment entries past `FRAG_TIMEOUT_NS`.
    pub frags: u64,
}

/// Whether this datapath takes a sweep lease: one loaded by an older sluice
/// has no `sl_agent`, and its in-kernel sweeper cannot be told to stand back.
pub fn supported(root: &PinRoot) -> bool {
    agent::supported(root)
}

/// How long the agent's sweep lease still lasts, in ns (0: not held).
pub fn lease_left_ns(root: &PinRoot) -> Result<u64> {
    agent::lease_left_ns(root, agent_slot::SWEEP_UNTIL_NS)
}

/// Takes (or renews) the sweep lease until `until_ns` (`CLOCK_MONOTONIC`); 0
/// gives the tables back to the in-kernel sweeper at once.
pub fn set_lease(root: &PinRoot, until_ns: u64) -> Result<()> {
    agent::set_lease(root, agent_slot::SWEEP_UNTIL_NS, until_ns)
}

/// Flows the agent has removed as idle (`agent_slot::SWEEP_EXPIRED`).
pub fn agent_expired(root: &PinRoot) -> Result<u64> {
    agent::slot(root, agent_slot::SWEEP_EXPIRED)
}

/// One pass at `now` (`CLOCK_MONOTONIC` ns, from
/// `sluice_common::user::monotonic_ns`): the flows of each family whose
/// masquerade is on, and the fragment entries while either is (the tables
/// the in-kernel sweeper walks). Adds the flows removed to the agent's count.
pub fn sweep(root: &PinRoot, now: u64) -> Result<Swept> {
    let cfg = nat::config(root)?;
    let unreplied = nat_pressure::limits(root)?.udp_unreplied_secs;
    let mut counts = BTreeMap::new();
    let mut kept = (0, 0);
    let v4 = cfg.flags & masq_flags::ENABLED != 0;
    let v6 = root.has(&maps::MASQ6) && nat::config6(root)?.flags & masq_flags::ENABLED != 0;
    let mut swept = Swept::default();
    // The walks and the counts written from them under one lock, as a DEL's
    // recount (see `crate::MapsLock`).
    let walk_to_write = (v4 || v6).then(|| root.lock_maps()).transpose()?;
    if v4 {
        (swept.flows, kept.0) = expire::<[u8; 4], u32>(
            root,
            (&maps::NAT_FWD, &maps::NAT_REV),
            (&cfg, unreplied),
            now,
            &mut counts,
        )?;
    }
    if v6 {
        (swept.flows6, kept.1) = expire::<sluice_common::Addr6, ()>(
            root,
            (&maps::NAT6_FWD, &maps::NAT6_REV),
            (&cfg, unreplied),
            now,
            &mut counts,
        )?;
    }
    // The flows each pod and each table holds, as this walk found them (the
    // datapath's running counts drift with races; see `nat_pressure`).
    if v4 || v6 {
        nat_pressure::set_pod_counts(root, &counts)?;
        nat_pressure::set_table_counts(root, kept.0, kept.1)?;
    }
    drop(walk_to_write);
    if v4 || v6 {
        swept.frags = expire_frags(root, now)?;
    }
    let n = swept.flows + swept.flows6;
    if n > 0 {
        let total = agent_expired(root)?;
        agent::set_slot(root, agent_slot::SWEEP_EXPIRED, total.wrapping_add(n))?;
    }
    Ok(swept)
}

/// Removes the flows of one family idle past their timeout (IPv6 flows use
/// the IPv4 settings' timeouts, as the datapath does), each with its reverse
/// entry, as the in-kernel sweeper does; the flows kept are added to
/// `counts` by pod. (removed, kept).
fn expire<A, P>(
    root: &PinRoot,
    (fwd_spec, rev_spec): (&MapSpec, &MapSpec),
    (cfg, unreplied): (&MasqConfig, u32),
    now: u64,
    counts: &mut BTreeMap<u32, u64>,
) -> Result<(u64, u64)>
where
    A: Copy,
    NatKeyOf<A>: Pod,
    NatEntryOf<A, P>: Pod,
    NatRevOf<A>: Pod,
{
    let expired =
        |e: &NatEntryOf<A, P>| cfg.is_expired((e.state, e.flags), unreplied, e.last_seen_ns, now);
    let (idle, kept): (Vec<_>, Vec<_>) =
        batch::lookup_all::<NatKeyOf<A>, NatEntryOf<A, P>>(root, fwd_spec)?
            .into_iter()
            .partition(|(_, e)| expired(e));
    nat_pressure::count_by_pod(&kept, counts);
    let mut held = kept.len() as u64;
    if idle.is_empty() {
        return Ok((0, held));
    }
    let mut fwd: HashMap<MapData, NatKeyOf<A>, NatEntryOf<A, P>> = root.typed(fwd_spec)?;
    let mut rev: HashMap<MapData, NatKeyOf<A>, NatRevOf<A>> = root.typed(rev_spec)?;
    let mut n = 0;
    for (k, _) in &idle {
        // Read again: a packet may have refreshed the flow since the batch.
        let Ok(e) = fwd.get(k, 0) else { continue };
        if !expired(&e) {
            if e.pod_ifindex != 0 {
                *counts.entry(e.pod_ifindex).or_default() += 1;
            }
            held += 1;
            continue;
        }
        // Inbound flows have no reverse entry (and their key could be a
        // masqueraded flow's).
        if e.flags & nat_flags::INBOUND == 0 {
            let _ = rev.remove(&k.reverse(e.nat_addr, e.nat_port));
        }
        if fwd.remove(k).is_ok() {
            n += 1;
        }
    }
    Ok((n, held))
}

/// Removes fragment entries older than `FRAG_TIMEOUT_NS` (the datapath
/// ignores them already).
fn expire_frags(root: &PinRoot, now: u64) -> Result<u64> {
    if !root.has(&maps::NAT_FRAG) {
        return Ok(0);
    }
    let stale: Vec<FragKey> = batch::lookup_all::<FragKey, FragEntry>(root, &maps::NAT_FRAG)?
        .into_iter()
        .filter(|(_, e)| now.saturating_sub(e.created_ns) > FRAG_TIMEOUT_NS)
        .map(|(k, _)| k)
        .collect();
    if stale.is_empty() {
        return Ok(0);
    }
    let mut frags: HashMap<MapData, FragKey, FragEntry> = root.typed(&maps::NAT_FRAG)?;
    Ok(stale.iter().filter(|k| frags.remove(k).is_ok()).count() as u64)
}
