//! The datapath's per-reason counters as `sluicectl counters --json` prints them,
//! and differences between two readings.
use std::{collections::BTreeMap, fmt};

use serde_json::Value;

use crate::{err, Result};

/// Packets per reason name (`from_pod_to_local_pod`, `xdp_to_pod`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters(pub BTreeMap<String, u64>);

impl Counters {
    /// From `sluicectl counters --json` (`{"node": {"<reason>": count, ...},
    /// "endpoints": [...]}`).
    pub fn parse(v: &Value) -> Result<Self> {
        let o = v
            .get("node")
            .and_then(Value::as_object)
            .ok_or_else(|| err!("counters are not a JSON object: {v}"))?;
        let mut m = BTreeMap::new();
        for (k, v) in o {
            let n = v
                .as_u64()
                .ok_or_else(|| err!("counter {k} is not a number: {v}"))?;
            m.insert(k.clone(), n);
        }
        Ok(Self(m))
    }

    /// The count of `reason`. Panics on a name `sluicectl` does not print, so a
    /// misspelt reason cannot pass as "did not rise".
    #[track_caller]
    pub fn get(&self, reason: &str) -> u64 {
        match self.0.get(reason) {
            Some(n) => *n,
            None => panic!("no counter {reason:?} in {:?}", self.0.keys()),
        }
    }

    /// What rose from `before` to `self`, per reason (counters never fall; a fall
    /// shows as 0 here and is caught by [`Self::assert_not_reset`]).
    pub fn since(&self, before: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(before.0.get(k).copied().unwrap_or(0)),
                    )
                })
                .collect(),
        )
    }

    /// Sum of several reasons.
    #[track_caller]
    pub fn sum(&self, reasons: &[&str]) -> u64 {
        reasons.iter().map(|r| self.get(r)).sum()
    }

    /// Asserts that no counter is lower than in `before` (a reload or upgrade
    /// must keep the map).
    #[track_caller]
    pub fn assert_not_reset(&self, before: &Self) {
        for (k, v) in &before.0 {
            let now = self.0.get(k).copied().unwrap_or(0);
            assert!(
                now >= *v,
                "counter {k} fell from {v} to {now}: the counters were reset\nbefore: {before}\nafter: {self}"
            );
        }
    }
}

/// The counters that are not zero, `name=count` separated by spaces.
impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nonzero: Vec<String> = self
            .0
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if nonzero.is_empty() {
            f.write_str("(all zero)")
        } else {
            f.write_str(&nonzero.join(" "))
        }
    }
}
