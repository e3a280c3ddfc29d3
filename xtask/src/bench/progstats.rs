//! The eBPF programs' own run time, as the kernel counts it: with run-time
//! statistics on, every program run adds its duration (`sched_clock` before
//! and after `bpf_prog_run`, helpers and map lookups included) to the
//! program's `run_time_ns` and one to its `run_cnt` (`bpf_prog_get_info_by_fd`).
//! No PMU and no perf needed, so it works in a guest under emulation, where
//! `perf record` takes no samples.
//!
//! Statistics are turned on with `BPF_ENABLE_STATS` (Linux 5.8+), which
//! returns a file descriptor: they stay on while it is open, for every program
//! on the machine, and go off when the last such descriptor closes. The
//! `kernel.bpf_stats_enabled` sysctl is left as it is.
use std::{
    collections::BTreeMap,
    os::fd::{FromRawFd as _, OwnedFd},
    path::Path,
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cmd;

/// `BPF_ENABLE_STATS` (include/uapi/linux/bpf.h, `enum bpf_cmd`).
const BPF_ENABLE_STATS: nix::libc::c_long = 32;
/// `BPF_STATS_RUN_TIME` (`enum bpf_stats_type`).
const BPF_STATS_RUN_TIME: u32 = 0;

/// Run-time statistics on while this lives.
pub(super) struct Enabled(#[allow(dead_code)] OwnedFd);

impl Enabled {
    pub(super) fn new() -> Result<Self> {
        // union bpf_attr's enable_stats: { __u32 type; }.
        let attr: u32 = BPF_STATS_RUN_TIME;
        // SAFETY: the kernel reads `size_of::<u32>()` bytes from `attr`, which
        // lives across the call.
        let fd = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_bpf,
                BPF_ENABLE_STATS,
                std::ptr::from_ref(&attr),
                std::mem::size_of::<u32>(),
            )
        };
        if fd < 0 {
            bail!(
                "BPF_ENABLE_STATS: {} (Linux 5.8+, as root)",
                std::io::Error::last_os_error()
            );
        }
        let fd = i32::try_from(fd).context("BPF_ENABLE_STATS returned no descriptor")?;
        // SAFETY: a descriptor the kernel just returned to us alone.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

/// Run time and runs of one program.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Runs {
    pub ns: u64,
    pub count: u64,
}

/// Each program pinned under `<pin_root>/progs/`, by its pin's name (the
/// kernel keeps only 15 characters of a program's own name).
pub(super) fn snapshot(pin_root: &Path) -> Result<BTreeMap<String, Runs>> {
    let dir = pin_root.join("progs");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // A reload's staged pin (`.new`-style names) is not a program in use.
        if name.starts_with('.') {
            continue;
        }
        let mut c = Command::new("bpftool");
        c.args(["-j", "prog", "show", "pinned"]).arg(&path);
        let text = cmd::stdout(&mut c)?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("bpftool's answer for {}: {text}", path.display()))?;
        out.insert(name.to_string(), runs_of(&v));
    }
    Ok(out)
}

/// `run_time_ns` and `run_cnt` of one `bpftool -j prog show` object (bpftool
/// leaves both out while they are zero).
fn runs_of(v: &Value) -> Runs {
    Runs {
        ns: v["run_time_ns"].as_u64().unwrap_or(0),
        count: v["run_cnt"].as_u64().unwrap_or(0),
    }
}

/// What each program ran between two snapshots.
pub(super) fn delta(
    before: &BTreeMap<String, Runs>,
    after: &BTreeMap<String, Runs>,
) -> BTreeMap<String, Runs> {
    after
        .iter()
        .map(|(name, a)| {
            let b = before.get(name).copied().unwrap_or_default();
            (
                name.clone(),
                Runs {
                    ns: a.ns.saturating_sub(b.ns),
                    count: a.count.saturating_sub(b.count),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bpftool_counters_and_their_absence() {
        let v: Value = serde_json::from_str(
            r#"{"id":7,"type":"sched_cls","name":"from_pod","run_time_ns":1500,"run_cnt":3}"#,
        )
        .unwrap();
        assert_eq!(runs_of(&v), Runs { ns: 1500, count: 3 });
        let v: Value = serde_json::from_str(r#"{"id":8,"name":"to_pod"}"#).unwrap();
        assert_eq!(runs_of(&v), Runs::default());
    }

    #[test]
    fn deltas_are_per_program_and_never_negative() {
        let r = |ns, count| Runs { ns, count };
        let before = BTreeMap::from([("a".to_string(), r(100, 1)), ("b".to_string(), r(50, 5))]);
        // "b" replaced by a reload between the snapshots (its counters restart);
        // "c" new.
        let after = BTreeMap::from([
            ("a".to_string(), r(400, 4)),
            ("b".to_string(), r(10, 1)),
            ("c".to_string(), r(7, 1)),
        ]);
        let d = delta(&before, &after);
        assert_eq!(d["a"], r(300, 3));
        assert_eq!(d["b"], r(0, 0));
        assert_eq!(d["c"], r(7, 1));
    }
}
