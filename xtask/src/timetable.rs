//! The table `cargo xtask test` prints at its end: each stage against its
//! budget, each test binary's time on the host and on each kernel, and where
//! a guest's time went (boot, datapath loads, the guest's CPU).
//!
//! Budgets are for a fresh clone on a 2-core machine with emulated guests
//! (CI): 40 minutes in all. A stage over its budget is said loudly, not
//! failed: the next change that adds tests sees what they cost.
use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use crate::{host::fmt_duration, libtest::BinaryRun, vm::Report};

/// Per stage. `kernels` runs beside `clippy`, `ebpf-clippy`, `unit` and
/// `integration`, so those are slower than alone.
pub(crate) const BUDGETS: [(&str, u64); 14] = [
    // A fresh machine: Debian packages, the nightly, bpf-linker built.
    ("setup", 6 * 60),
    ("build-ebpf", 90),
    ("fmt", 15),
    // Cold: every crate of the workspace, every target.
    ("build", 5 * 60),
    ("build-next", 90),
    ("prometheus", 30),
    ("kubernetes-validate", 60),
    ("image", 60),
    ("clippy", 4 * 60),
    ("ebpf-clippy", 30),
    ("unit", 60),
    ("integration", 11 * 60),
    ("kernels", 30 * 60),
    ("total", 40 * 60),
];

pub(crate) fn budget(stage: &str) -> Option<Duration> {
    BUDGETS
        .iter()
        .find(|(s, _)| *s == stage)
        .map(|(_, secs)| Duration::from_secs(*secs))
}

pub(crate) struct Input<'a> {
    pub stages: &'a [(&'static str, Duration, bool)],
    pub total: Duration,
    pub unit: &'a [BinaryRun],
    pub host: &'a [BinaryRun],
    pub vms: Option<&'a Report>,
}

pub(crate) fn render(i: &Input) -> String {
    let mut s = String::from("\n== where the time went ==\n");
    let mut over = Vec::new();
    let _ = writeln!(s, "  {:<20} {:>8} {:>8}", "stage", "took", "budget");
    let rows = i
        .stages
        .iter()
        .map(|(n, t, _)| (*n, *t))
        .chain([("total", i.total)]);
    for (name, took) in rows {
        let budget = budget(name);
        let mark = match budget {
            Some(b) if took > b => {
                over.push(format!(
                    "{name} took {}, over its budget of {}",
                    fmt_duration(took),
                    fmt_duration(b)
                ));
                "  OVER BUDGET"
            }
            _ => "",
        };
        let _ = writeln!(
            s,
            "  {name:<20} {:>8} {:>8}{mark}",
            fmt_duration(took),
            budget.map(fmt_duration).unwrap_or_default()
        );
    }
    if !i.unit.is_empty() {
        let passed: u32 = i.unit.iter().map(|r| r.passed).sum();
        let took: Duration = i.unit.iter().map(|r| r.took).sum();
        let _ = writeln!(
            s,
            "\n  unit tests: {passed} passed in {} binaries, {} running",
            i.unit.len(),
            fmt_duration(took)
        );
    }
    binaries(&mut s, i);
    if let Some(report) = i.vms {
        kernels(&mut s, report);
    }
    if over.is_empty() {
        s.push_str("\n  every stage within its budget\n");
    } else {
        s.push('\n');
        for o in over {
            let _ = writeln!(s, "  !!! OVER BUDGET: {o}");
        }
    }
    s
}

/// `cargo xtask vm-test`'s part of the table: each binary on each kernel,
/// and where each guest's time went.
pub(crate) fn render_vms(report: &Report) -> String {
    let mut s = String::from("\n== where the guests' time went ==\n");
    let i = Input {
        stages: &[],
        total: Duration::ZERO,
        unit: &[],
        host: &[],
        vms: Some(report),
    };
    binaries(&mut s, &i);
    kernels(&mut s, report);
    s
}

/// One row per integration test binary: its time on the host and on each
/// kernel, and its test count (host/kernels).
fn binaries(s: &mut String, i: &Input) {
    let kernels: Vec<&str> = i
        .vms
        .map(|r| r.kernels.iter().map(|k| k.name.as_str()).collect())
        .unwrap_or_default();
    let mut rows: BTreeMap<&str, Vec<Option<(Duration, u32)>>> = BTreeMap::new();
    let cols = 1 + kernels.len();
    for r in i.host {
        rows.entry(&r.name).or_insert_with(|| vec![None; cols])[0] = Some((r.took, r.passed));
    }
    if let Some(report) = i.vms {
        for (k, kernel) in report.kernels.iter().enumerate() {
            for b in &kernel.binaries {
                let took = b.times.as_ref().map(|t| t.wall).unwrap_or_default();
                rows.entry(&b.name).or_insert_with(|| vec![None; cols])[k + 1] =
                    Some((took, b.passed));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    let _ = write!(s, "\n  {:<18} {:>12}", "test binary", "host");
    for k in &kernels {
        let _ = write!(s, " {k:>12}");
    }
    s.push('\n');
    let mut totals = vec![(Duration::ZERO, 0u32); cols];
    for (name, cells) in &rows {
        let _ = write!(s, "  {name:<18}");
        for (c, cell) in cells.iter().enumerate() {
            match cell {
                Some((took, passed)) => {
                    totals[c].0 += *took;
                    totals[c].1 += passed;
                    let _ = write!(s, " {:>12}", format!("{} ({passed})", secs(*took)));
                }
                None => {
                    let _ = write!(s, " {:>12}", "-");
                }
            }
        }
        s.push('\n');
    }
    let _ = write!(s, "  {:<18}", "all (tests passed)");
    for (took, passed) in totals {
        let _ = write!(s, " {:>12}", format!("{} ({passed})", secs(took)));
    }
    s.push('\n');
}

/// Per kernel: boot, the tests' wall time, the datapath loads and their
/// per-program (verifier) steps, and the guest's CPU over its tests.
fn kernels(s: &mut String, report: &Report) {
    let _ = writeln!(
        s,
        "\n  {:<5} {:<24} {:>7} {:>6} {:>7} {:>6} {:>9} {:>9}  guest CPU user/sys/idle",
        "kernel", "release", "took", "boot", "tests", "loads", "prepare", "verifier"
    );
    for k in &report.kernels {
        let times: Vec<_> = k.binaries.iter().filter_map(|b| b.times.as_ref()).collect();
        let wall: Duration = times.iter().map(|t| t.wall).sum();
        let loads: u32 = times.iter().map(|t| t.loads).sum();
        let prepare: Duration = times.iter().map(|t| t.prepare).sum();
        let verify: Duration = times.iter().map(|t| t.verify).sum();
        // Weighted by each binary's wall time.
        let w = wall.as_secs_f64().max(f64::EPSILON);
        let share = |f: fn(&crate::vm::times::CpuSplit) -> f64| {
            times
                .iter()
                .map(|t| f(&t.cpu) * t.wall.as_secs_f64())
                .sum::<f64>()
                / w
                * 100.0
        };
        let _ = writeln!(
            s,
            "  {:<5} {:<24} {:>7} {:>6} {:>7} {:>6} {:>9} {:>9}  {:.0}%/{:.0}%/{:.0}%",
            k.name,
            k.release,
            fmt_duration(k.took),
            k.boot.map_or_else(|| "-".into(), fmt_duration),
            fmt_duration(wall),
            loads,
            fmt_duration(prepare),
            fmt_duration(verify),
            share(|c| c.user),
            share(|c| c.system),
            share(|c| c.idle),
        );
    }
    s.push_str(
        "  (prepare: every ADD's datapath step; verifier: the wall time of its verify step, programs in parallel;\n   \
         under emulation they overlap with the other test thread's work)\n",
    );
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, secs: u64, passed: u32) -> BinaryRun {
        BinaryRun {
            name: name.into(),
            took: Duration::from_secs(secs),
            passed,
            failed: Vec::new(),
            ok: true,
        }
    }

    #[test]
    fn a_stage_over_its_budget_is_said_loudly() {
        let stages = [
            ("setup", Duration::from_secs(1), true),
            ("kernels", Duration::from_mins(31), true),
        ];
        let host = [run("traffic", 12, 4), run("bandwidth", 70, 9)];
        let t = render(&Input {
            stages: &stages,
            total: Duration::from_mins(35),
            unit: &[],
            host: &host,
            vms: None,
        });
        assert!(t.contains("kernels") && t.contains("OVER BUDGET"), "{t}");
        assert!(
            t.contains("!!! OVER BUDGET: kernels took 31m00s, over its budget of 30m00s"),
            "{t}"
        );
        assert!(!t.contains("OVER BUDGET: total"), "{t}");
        assert!(t.contains("bandwidth") && t.contains("70.0s (9)"), "{t}");
        assert!(t.contains("82.0s (13)"), "{t}");
    }

    #[test]
    fn every_stage_of_the_suite_has_a_budget() {
        for stage in [
            "setup",
            "build-ebpf",
            "fmt",
            "build",
            "build-next",
            "prometheus",
            "kubernetes-validate",
            "image",
            "clippy",
            "ebpf-clippy",
            "unit",
            "integration",
            "kernels",
        ] {
            assert!(budget(stage).is_some(), "{stage}");
        }
        assert_eq!(budget("total"), Some(Duration::from_mins(40)));
    }
}
