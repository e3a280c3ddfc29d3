//! ADD with NetworkPolicy on: the pod starts with its policy in place. With
//! policy on (`sl_pol_config`), a pod's flows are refused both ways until
//! the policy agent (`sluice-node policy`) has written its addresses into
//! `sl_pol_pods` ("pending", see `sluice_common::policy`). The agent finds
//! a new pod's addresses in the endpoint map and its Pod object by the
//! attachment record's `K8S_POD_NAMESPACE`/`K8S_POD_NAME`, within one of its
//! polls (200 ms). ADD waits for that, at most [`WAIT`], so the workload's
//! first packets meet its policy rather than the pending refusal. A pod the
//! runtime does not name, policy off, or no agent in time: ADD returns at
//! once (or after [`WAIT`]) and the pod stays pending until the agent has
//! compiled it; never open by accident.
use std::{
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use sluice_common::policy_flags;
use sluice_maps::{policy, PinRoot};

/// Longest ADD waits for the agent.
const WAIT: Duration = Duration::from_secs(2);
/// How often it looks.
const POLL: Duration = Duration::from_millis(20);

/// Waits until every address in `ips` has its policy, or [`WAIT`]; says on
/// stderr when it gave up. Policy off or without the maps: returns at once.
pub(crate) fn wait(pin_root: &Path, ips: &[IpAddr]) {
    let root = PinRoot::new(pin_root);
    let on = policy::config(&root)
        .ok()
        .flatten()
        .is_some_and(|c| c.flags & policy_flags::ON != 0);
    if !on || ips.is_empty() {
        return;
    }
    let start = Instant::now();
    loop {
        let known = ips
            .iter()
            .all(|ip| policy::pod(&root, *ip).ok().flatten().is_some());
        if known {
            return;
        }
        if start.elapsed() >= WAIT {
            eprintln!(
                "sluice: NetworkPolicy is on and the policy agent has not compiled this pod within {WAIT:?}: its flows are refused until it has"
            );
            return;
        }
        std::thread::sleep(POLL);
    }
}
