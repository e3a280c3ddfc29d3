//! The bandwidth feature on the plugin's side: how CNI's bits become the
//! programs' token buckets (the defaults and bounds are in
//! `sluice_common::bw_limits`), and a pod's limits attached, detached and
//! checked: the policer's buckets, and for an egress limit on a kernel with
//! `sch_fq`, EDT on the pod's own interface (`fq` as its root qdisc, made by
//! ADD, and `pod_edt` on its egress). The maps are `sluice_maps::bandwidth`.
use sluice_common::{Bucket, BwState};
use sluice_maps::PinRoot;

use super::{features, pod_links, Attachment, Gone, PodDevice};
use crate::{
    cni::{config::PodAttach, runtime_config::Bandwidth},
    error::{Error, Errors},
    netlink::Netlink,
};

/// The bucket for `rate` bits/s and `burst` bits (CNI conventions), in bytes.
pub fn bucket(rate_bits: Option<u64>, burst_bits: Option<u64>, now_ns: u64) -> Bucket {
    Bucket::from_bits(rate_bits, burst_bits, now_ns)
}

/// The state for `bw`, both directions, full at `now_ns`.
pub fn state(bw: &Bandwidth, now_ns: u64) -> BwState {
    BwState {
        egress: bucket(bw.egress_rate, bw.egress_burst, now_ns),
        ingress: bucket(bw.ingress_rate, bw.ingress_burst, now_ns),
    }
}

/// Makes `fq` the root qdisc of the pod's own interface (`ifindex`, seen
/// through `pod_nl`) when the pod has an egress limit: EDT shapes on it, and
/// ADD does this before the datapath attaches `pod_edt`. `true` when `fq` is
/// there; a kernel without `sch_fq` leaves the egress limit to the policer
/// (docs/bandwidth.md), said once for pod `who`.
pub async fn prepare_device(
    pod_nl: &Netlink,
    ifindex: u32,
    bandwidth: Option<&Bandwidth>,
    who: &str,
) -> Result<bool, Error> {
    if bandwidth.is_none_or(|b| b.egress_rate.is_none()) {
        return Ok(false);
    }
    let fq = pod_nl
        .replace_root_fq(ifindex, sluice_common::EDT_FQ_LIMIT)
        .await?;
    if !fq {
        eprintln!("sluice: this kernel has no sch_fq; the egress limit of {who} is a policer");
    }
    Ok(fq)
}

/// EDT for this pod: an egress limit and `fq` on its interface.
fn edt_device<'a>(pod: &'a Attachment<'_>) -> Option<&'a PodDevice<'a>> {
    let egress = pod.bandwidth.is_some_and(|b| b.egress_rate.is_some());
    pod.device.as_ref().filter(|d| egress && d.fq)
}

/// Writes the pod's buckets (or removes stale ones) and, in EDT mode, attaches
/// `pod_edt` to its interface. Before the endpoint: the programs look the
/// buckets up from the first packet its `LIMITED` mark lets through.
pub(super) fn attach(root: &PinRoot, pod: &Attachment<'_>) -> Result<(), Error> {
    match &pod.bandwidth {
        Some(b) => sluice_maps::bandwidth::set(
            root,
            pod.host_ifindex,
            state(b, sluice_common::user::monotonic_ns()),
        )?,
        None => sluice_maps::bandwidth::remove(root, pod.host_ifindex)?,
    }
    match edt_device(pod) {
        Some(d) => {
            pod_links::attach_pod_device(
                root,
                d.ns,
                &pod.host_ifname,
                &d.ifname,
                features::pod_attach(pod.attach),
            )?;
            sluice_maps::bandwidth::enable_edt(root, pod.host_ifindex, d.ifindex)?;
        }
        None => sluice_maps::bandwidth::disable_edt(root, pod.host_ifindex)?,
    }
    Ok(())
}

/// Removes the buckets and the EDT slot of a pod that is going (`pod_edt`
/// goes with the pod's interface).
pub(super) fn detach(root: &PinRoot, gone: &Gone<'_>, errors: &mut Errors) {
    for idx in &gone.ifindexes {
        errors.note(sluice_maps::bandwidth::remove(root, *idx));
        errors.note(sluice_maps::bandwidth::disable_edt(root, *idx));
    }
}

/// CHECK: the buckets as the config asks, and a pod in EDT mode has `fq` as
/// its interface's root qdisc and `pod_edt` on its egress (one in policer mode
/// needs nothing there).
pub(super) async fn check(root: &PinRoot, pod: &Attachment<'_>) -> Result<(), Error> {
    use sluice_maps::bandwidth::{egress_mode, EgressMode};
    let want = pod.bandwidth.as_ref().map(|b| state(b, 0));
    sluice_maps::bandwidth::check(root, pod.host_ifindex, want.as_ref())?;
    if egress_mode(root, pod.host_ifindex) == EgressMode::Policer {
        return Ok(());
    }
    let Some(d) = &pod.device else {
        return Ok(());
    };
    let qdisc = d.nl.root_qdisc(d.ifindex).await?;
    if qdisc.as_deref() != Some(crate::netlink::FQ) {
        return Err(Error::check(format!(
            "{} of the pod has root qdisc {} instead of fq (its egress is EDT)",
            d.ifname,
            qdisc.as_deref().unwrap_or("none")
        )));
    }
    match features::pod_attach(pod.attach) {
        PodAttach::Tcx => pod_links::check_pod_device_tcx(root, d.ns, &pod.host_ifname, &d.ifname),
        PodAttach::Tc => {
            let id = sluice_maps::programs::id(root, sluice_common::prog_names::POD_EDT)?;
            let filters = d.nl.bpf_filters(d.ifindex, false).await?;
            if filters.iter().any(|f| f.prog_id == id) {
                Ok(())
            } else {
                Err(Error::check(format!(
                    "pod_edt (program id {id}) is not attached to the egress of the pod's {} (filters: {filters:?})",
                    d.ifname
                )))
            }
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
        // The depth is 300 ms of the rate (37.5 MB), more than that burst; from
        // MAX_DEFICIT below zero to full: (37.5e6 + 262144) B at 125e6 B/s.
        assert_eq!(b.fill_ns, 302_097_152);
        assert_eq!((b.tokens, b.last_ns), (37_500_000, 5));
        // 1 Gbit/s: 300 ms is 37.5 MB.
        assert_eq!(bucket(Some(1_000_000_000), None, 0).burst, 37_500_000);
        // 10 Mbit/s: 375 KB; 1 Mbit/s: 37.5 KB, under two GSO packets: the minimum.
        assert_eq!(bucket(Some(10_000_000), None, 0).burst, 375_000);
        assert_eq!(bucket(Some(1_000_000), None, 0).burst, MIN_DEFAULT_BURST);
        assert_eq!(bucket(None, None, 0), Bucket::default());
    }

    /// A burst smaller than what TCP needs is kept as configured (CHECK and
    /// sluicectl show it) and the bucket gets the larger depth.
    #[test]
    fn a_small_burst_gets_the_tcp_depth() {
        // 200 Mbit/s with the reference's usual 10 ms: 250 KB; depth 7.5 MB.
        let b = bucket(Some(200_000_000), Some(2_000_000), 0);
        assert_eq!((b.rate, b.burst), (25_000_000, 250_000));
        assert_eq!(b.depth(), 7_500_000);
        assert_eq!(b.tokens, 7_500_000);
        assert_eq!(b.bits(), Some((200_000_000, 2_000_000)));
        assert_eq!(b.depth_bits(), Some(60_000_000));
        // (7.5e6 + 262144) B at 25e6 B/s.
        assert_eq!(b.fill_ns, 310_485_760);
        // A larger burst is the depth.
        let b = bucket(Some(200_000_000), Some(800_000_000), 0);
        assert_eq!(b.depth(), 100_000_000);
        // The u64-only tcp_depth agrees with 300 ms of the rate.
        for rate in [1u64, 999, 125_000, 1_250_001, 125_000_000, 125_000_000_000] {
            let exact = u64::try_from(u128::from(rate) * 300 / 1000).unwrap();
            let want = exact.clamp(MIN_DEFAULT_BURST, u64::from(u32::MAX));
            assert_eq!(Bucket::tcp_depth(rate), want, "{rate}");
        }
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
