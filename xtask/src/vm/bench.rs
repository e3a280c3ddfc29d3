//! `cargo xtask vm-bench`: one table of `cargo xtask bench` inside each of
//! Debian's kernels. This development host's kernel has neither `sch_fq` nor
//! netkit, so only a guest measures Sluice's EDT egress against the reference
//! (the bandwidth table, the default) and netkit pods against veth pods and the
//! limit (`--only routing`).
//!
//! The release binaries and this xtask are built on the host; the guest runs
//! `xtask bench --only <table> --prebuilt` on them (the host's `/` is its root,
//! read-only) and writes the results as markdown into its output directory. The
//! host gathers every kernel's into docs/benchmarks-kernels.md (bandwidth) or
//! docs/benchmarks-kernels-<table>.md.
use std::{fmt::Write as _, fs, time::Duration};

use anyhow::{bail, Context, Result};

use super::{boot_job, detect_accel, kernels, kernels_or_matrix, prelude, Accel};
use clap::ValueEnum;

use crate::{
    build,
    cli::{BenchTable, VmBenchArgs},
    ebpf,
    host::fmt_duration,
    ws::Workspace,
};

pub(crate) fn run(ws: &Workspace, args: &VmBenchArgs) -> Result<()> {
    let names = kernels_or_matrix(&args.kernel);
    let object = ebpf::build(ws)?;
    let bins = build::build_bins(ws, &object, true)?;
    let xtask = std::env::current_exe().context("where this xtask binary is")?;
    let accel = detect_accel(ws, &names[0])?;
    let dir = ws.target.join("vm");
    let kernels = kernels::fetch(&dir, &names)?;
    let deadline = Duration::from_secs(u64::from(args.timeout_mins) * 60);
    println!(
        "vm-bench: {} kernel(s), {} round(s) each, {accel:?}",
        kernels.len(),
        args.rounds
    );
    let vars = [
        ("SLUICE_BIN", bins.sluice.as_path()),
        ("SLUICECTL_BIN", bins.sluicectl.as_path()),
    ];
    let mut sections = Vec::new();
    let mut method = None;
    let mut failures = Vec::new();
    for kernel in &kernels {
        let (out, console) = boot_job(&dir, kernel, accel, deadline, |k| {
            let mut s = prelude(ws, k, &vars);
            // A guest under emulation records no perf samples: its profile is
            // the programs' own run time (kernel statistics).
            let job = if args.profile {
                "profile --no-perf --out /out/results.md".to_string()
            } else {
                format!(
                    "bench --only {} --markdown-parts /out",
                    table_name(args.only)
                )
            };
            let _ = writeln!(
                s,
                "'{}' {job} --rounds {} --prebuilt \
                 > /out/bench.log 2>&1; echo $? > /out/bench.rc\nsync\necho SLUICE-VM-DONE",
                xtask.display(),
                args.rounds
            );
            s
        })?;
        let rc = fs::read_to_string(out.join("bench.rc")).ok();
        let results = fs::read_to_string(out.join("results.md"));
        match (rc.as_deref().map(str::trim), results) {
            (Some("0"), Ok(results)) => {
                println!(
                    "vm-bench: {} done in {}",
                    kernel.name,
                    fmt_duration(console.took)
                );
                let results = if args.profile {
                    nested(&results)
                } else {
                    results
                };
                sections.push((kernel.release.clone(), results));
                if method.is_none() {
                    method = fs::read_to_string(out.join("method.md")).ok();
                }
            }
            (rc, _) => {
                let log = out.join("bench.log");
                failures.push(format!(
                    "{}: the bench {} (timed out: {}; its log: {})",
                    kernel.name,
                    rc.map_or_else(|| "did not finish".into(), |rc| format!("exited with {rc}")),
                    console.timed_out,
                    log.display()
                ));
            }
        }
    }
    if !sections.is_empty() {
        let path = ws.root.join("docs").join(match args.only {
            _ if args.profile => "profile-kernels.md".to_string(),
            BenchTable::Bandwidth => "benchmarks-kernels.md".to_string(),
            t => format!("benchmarks-kernels-{}.md", table_name(t)),
        });
        fs::write(&path, document(args, accel, &sections, method.as_deref()))?;
        println!("written to {}", path.display());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("vm-bench: {}", failures.join("; "))
    }
}

/// The table's name on the command line.
fn table_name(t: BenchTable) -> String {
    t.to_possible_value()
        .map_or_else(|| format!("{t:?}"), |v| v.get_name().to_string())
}

/// docs/benchmarks-kernels*.md: each kernel's results, the method once.
fn document(
    args: &VmBenchArgs,
    accel: Accel,
    sections: &[(String, String)],
    method: Option<&str>,
) -> String {
    let table = table_name(args.only);
    let booted = match accel {
        Accel::Kvm => "under KVM",
        Accel::Tcg => {
            "under emulation (TCG, where every packet costs several times its native CPU time)"
        }
    };
    let mut md = if args.profile {
        format!(
            "# The eBPF programs' own time on Debian's kernels\n\n\
             Generated by `cargo xtask vm-bench --profile --rounds {}` (as root): `cargo xtask \
             profile --no-perf` run inside each kernel, booted in qemu {booted} with this \
             machine's userspace: each figure's wall time per unit of work on every setup, and \
             what Sluice's programs took of it by the kernel's own run-time statistics (perf \
             records no samples in such a guest). From 6.7 on these kernels have netkit, so \
             each figure has Sluice with netkit pods (`podDevice: netkit`) beside veth pods. \
             Emulation inflates every instruction, the kernel's and the programs' alike; \
             compare setups of one guest.\n",
            args.rounds
        )
    } else if args.only == BenchTable::Bandwidth {
        String::from("# Bandwidth benchmarks on Debian's kernels\n\n")
    } else {
        format!("# The {table} table on Debian's kernels\n\n")
    };
    if !args.profile {
        let _ = write!(
            md,
            "Generated by `cargo xtask vm-bench --only {table} --rounds {}` (as root): the \
             {table} table of `cargo xtask bench` run inside each kernel, booted in qemu \
             {booted} with this machine's userspace. ",
            args.rounds,
        );
    }
    md.push_str(match args.only {
        _ if args.profile => "",
        BenchTable::Bandwidth => {
            "These kernels have `sch_fq`, so Sluice's egress is EDT here (the method below says \
             what each run found); the host's docs/benchmarks.md measures the policer. Absolute \
             rates are bounded by the guest's CPU (at 1 Gbit/s both plugins may run out of CPU \
             before the limit); compare Sluice and the reference in the same guest.\n"
        }
        BenchTable::Routing => {
            "From 6.7 on these kernels have netkit, so the table has a column of Sluice with \
             netkit pods (`podDevice: netkit`) beside veth pods, the reference and the bare \
             veth pair (the limit). Absolute figures are the emulator's; compare columns of one \
             guest.\n"
        }
        _ => "Compare columns of one guest: absolute figures are the guest's.\n",
    });
    for (release, results) in sections {
        let _ = write!(md, "\n## Linux {release}\n\n{results}");
    }
    if let Some(method) = method {
        md.push_str("\n## How these were measured\n");
        md.push_str(method);
    }
    md
}

/// A guest's profile.md under a kernel's section: its title left out, its
/// headings one level down.
fn nested(doc: &str) -> String {
    doc.lines()
        .skip_while(|l| !l.starts_with("# "))
        .skip(1)
        .map(|l| {
            if l.starts_with('#') {
                format!("#{l}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect::<String>()
        .trim_start()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_has_a_section_per_kernel_and_the_method_once() {
        let args = VmBenchArgs {
            kernel: Vec::new(),
            rounds: 2,
            timeout_mins: 40,
            only: BenchTable::Bandwidth,
            profile: false,
        };
        let sections = vec![
            ("6.1.0-1-amd64".to_string(), "Machine: x\n".to_string()),
            ("6.12.0-1-amd64".to_string(), "Machine: y\n".to_string()),
        ];
        let md = document(&args, Accel::Tcg, &sections, Some("\n### Method\n\ntext\n"));
        assert!(md.contains("--rounds 2"));
        assert!(md.contains("## Linux 6.1.0-1-amd64\n\nMachine: x"));
        assert!(md.contains("## Linux 6.12.0-1-amd64\n\nMachine: y"));
        assert_eq!(md.matches("### Method").count(), 1);
        let profile = VmBenchArgs {
            profile: true,
            ..args
        };
        let md = document(&profile, Accel::Tcg, &sections, None);
        assert!(md.starts_with("# The eBPF programs' own time on Debian's kernels"));
        assert!(md.contains("vm-bench --profile --rounds 2"));
        assert!(md.contains("## Linux 6.12.0-1-amd64\n\nMachine: y"));
    }

    #[test]
    fn a_guests_profile_nests_under_its_kernel() {
        let doc = "# Where the per-packet time goes\n\nGenerated by x\n## RTT\n\n| a |\n";
        assert_eq!(nested(doc), "Generated by x\n### RTT\n\n| a |\n");
    }
}
