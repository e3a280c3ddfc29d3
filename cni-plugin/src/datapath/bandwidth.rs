//! A pod's bandwidth limits in `sl_bw` (the aya calls of the bandwidth feature)
//! and how CNI's bits become the programs' token buckets.
use std::path::Path;

use aya::maps::{HashMap, MapData};
use sluice_common::{map_names, Bucket, BwState};

use super::bpf::{dp_err, open_map};
use crate::{cni::runtime_config::Bandwidth, error::Error};

/// The bucket for `rate` bits/s and `burst` bits (CNI conventions), in bytes
/// (the defaults and bounds are in `sluice_common::bw_limits`).
pub fn bucket(rate_bits: Option<u64>, burst_bits: Option<u64>, now_ns: u64) -> Bucket {
    Bucket::from_bits(rate_bits, burst_bits, now_ns)
}

/// The state for `bw`, both directions.
pub fn state(bw: &Bandwidth, now_ns: u64) -> BwState {
    BwState {
        egress: bucket(bw.egress_rate, bw.egress_burst, now_ns),
        ingress: bucket(bw.ingress_rate, bw.ingress_burst, now_ns),
    }
}

fn map(maps_dir: &Path) -> Result<HashMap<MapData, u32, BwState>, Error> {
    HashMap::try_from(open_map(maps_dir, map_names::BANDWIDTH)?)
        .map_err(|e| dp_err("open sl_bw", e))
}

/// Sets the limits of the pod on host veth `ifindex` (next packet on).
pub fn write(maps_dir: &Path, ifindex: u32, bw: &Bandwidth) -> Result<(), Error> {
    map(maps_dir)?
        .insert(ifindex, state(bw, sluice_common::user::monotonic_ns()), 0)
        .map_err(|e| dp_err(format!("write sl_bw for ifindex {ifindex}"), e))
}

/// Removes the pod's limits (none is fine).
pub fn remove(maps_dir: &Path, ifindex: u32) -> Result<(), Error> {
    if !maps_dir.join(map_names::BANDWIDTH).exists() {
        return Ok(());
    }
    let _ = map(maps_dir)?.remove(&ifindex);
    Ok(())
}

/// CHECK: the limits in place are the configured ones.
pub fn check(maps_dir: &Path, ifindex: u32, bw: Option<&Bandwidth>) -> Result<(), Error> {
    let found = map(maps_dir).ok().and_then(|m| m.get(&ifindex, 0).ok());
    match (bw, found) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(Error::check(format!(
            "ifindex {ifindex} has bandwidth limits the config does not ask for"
        ))),
        (Some(_), None) => Err(Error::check(format!(
            "bandwidth limits of ifindex {ifindex} are missing from sl_bw"
        ))),
        (Some(want), Some(have)) => {
            let w = state(want, 0);
            for (dir, w, h) in [
                ("egress", w.egress, have.egress),
                ("ingress", w.ingress, have.ingress),
            ] {
                if (w.rate, w.burst) != (h.rate, h.burst) {
                    return Err(Error::check(format!(
                        "{dir} limit of ifindex {ifindex} is {} B/s burst {} B, the config asks for {} B/s burst {} B",
                        h.rate, h.burst, w.rate, w.burst
                    )));
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::bw_limits::MIN_DEFAULT_BURST;

    #[test]
    fn bits_become_bytes_and_a_missing_burst_gets_the_default() {
        let b = bucket(Some(1_000_000_000), Some(8_000_000), 5);
        assert_eq!((b.rate, b.burst), (125_000_000, 1_000_000));
        // From MAX_DEFICIT below zero to full: (1e6 + 262144) B at 125e6 B/s.
        assert_eq!(b.fill_ns, 10_097_152);
        assert_eq!((b.tokens, b.last_ns), (1_000_000, 5));
        // 1 Gbit/s: 300 ms is 37.5 MB.
        assert_eq!(bucket(Some(1_000_000_000), None, 0).burst, 37_500_000);
        // 10 Mbit/s: 375 KB; 1 Mbit/s: 37.5 KB, under two GSO packets: the minimum.
        assert_eq!(bucket(Some(10_000_000), None, 0).burst, 375_000);
        assert_eq!(bucket(Some(1_000_000), None, 0).burst, MIN_DEFAULT_BURST);
        assert_eq!(bucket(None, None, 0), Bucket::default());
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let b = bucket(Some(1), Some(u64::from(u32::MAX) * 8), 0);
        assert_eq!(b.rate, 1);
        assert_eq!(
            b.fill_ns,
            (u64::from(u32::MAX) + sluice_common::bw_limits::MAX_DEFICIT) * 1_000_000_000
        );
        // The programs' `min(elapsed, fill_ns) * rate` fits in 64 bits.
        assert!(u128::from(b.fill_ns) * u128::from(b.rate) < u128::from(u64::MAX));
        let b = bucket(Some(1_000_000_000_000), None, 0);
        assert_eq!(b.burst, u64::from(u32::MAX));
        assert!(u128::from(b.fill_ns) * u128::from(b.rate) < u128::from(u64::MAX));
    }
}
