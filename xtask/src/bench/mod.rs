//! `cargo xtask bench`: Sluice, the reference plugins (bridge + host-local) and
//! the limit (a bare veth pair) on the same namespace testbed, in one run,
//! interleaved round by round, printed as ratios and written to
//! docs/benchmarks.md. Absolute numbers drift 30% between runs on these VMs;
//! the ratios within one run are what to compare. Masquerade is measured on two
//! more setups (both plugins with `ipMasq: true`) in the same run.
mod connloop;
mod measure;
mod report;
mod topology;

use anyhow::Result;

use crate::{build, cli::BenchArgs, cli::SetupArgs, ebpf, setup, testbed::Testbed, ws::Workspace};

use report::{Figure, Report, REFERENCE_MASQ, SLUICE_MASQ};
use topology::Setup;

pub fn conn_loop(args: &crate::cli::ConnLoopArgs) -> Result<()> {
    connloop::run(args)
}

pub fn run(ws: &Workspace, args: &BenchArgs) -> Result<()> {
    setup::run(&SetupArgs::default())?;
    let object = ebpf::build(ws)?;
    let bins = build::build_bins(ws, &object, true)?;
    let mut tb = Testbed::new("slbench")?;
    let setups = [
        topology::limit(&mut tb)?,
        topology::reference(&mut tb)?,
        topology::sluice(&mut tb, &bins)?,
        topology::reference_masq(&mut tb)?,
        topology::sluice_masq(&mut tb, &bins)?,
    ];
    let mut report = Report::new(&setups);
    for round in 0..args.rounds {
        eprintln!("bench: round {} of {}", round + 1, args.rounds);
        traffic_round(&tb, &setups[..3], args.seconds, &mut report)?;
        masq_round(&tb, &setups, args.seconds, &mut report)?;
    }
    lifecycle(&tb, &setups[..3], usize::try_from(args.pods)?, &mut report)?;
    drop(tb);
    let text = report.render(args);
    print!("{text}");
    let path = ws.root.join("docs").join("benchmarks.md");
    std::fs::create_dir_all(path.parent().unwrap_or(&ws.root))?;
    std::fs::write(&path, report.markdown(args))?;
    println!("written to {}", path.display());
    Ok(())
}

/// One value of every traffic figure for every setup, setups interleaved.
fn traffic_round(tb: &Testbed, setups: &[Setup], secs: u32, r: &mut Report) -> Result<()> {
    let ns = |i| tb.ns(i);
    for (i, s) in setups.iter().enumerate() {
        r.add(
            Figure::PodPodGbps,
            i,
            measure::tcp_gbps(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?,
        );
    }
    for (i, s) in setups.iter().enumerate() {
        let (p50, p99) = measure::tcp_rtt_us(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?;
        r.add(Figure::PodPodRttP50, i, p50);
        r.add(Figure::PodPodRttP99, i, p99);
    }
    for (i, s) in setups.iter().enumerate() {
        r.add(
            Figure::PodPodUdpKpps,
            i,
            measure::udp_small_pps(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)? / 1e3,
        );
    }
    for (i, s) in setups.iter().enumerate() {
        r.add(
            Figure::PodExtGbps,
            i,
            measure::tcp_gbps(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?,
        );
        let (p50, _) = measure::tcp_rtt_us(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?;
        r.add(Figure::PodExtRttP50, i, p50);
    }
    for (i, s) in setups.iter().enumerate() {
        r.add(
            Figure::ExtPodGbps,
            i,
            measure::tcp_gbps(ns(s.ext), ns(s.pod1), &s.pod1_ip, secs)?,
        );
        let (p50, _) = measure::tcp_rtt_us(ns(s.ext), ns(s.pod1), &s.pod1_ip, secs)?;
        r.add(Figure::ExtPodRttP50, i, p50);
    }
    Ok(())
}

/// The masquerade figures, pod -> external host, the two ipMasq setups in turn.
fn masq_round(tb: &Testbed, setups: &[Setup], secs: u32, r: &mut Report) -> Result<()> {
    let ns = |i| tb.ns(i);
    let both = [REFERENCE_MASQ, SLUICE_MASQ];
    for i in both {
        let s = &setups[i];
        r.add(
            Figure::MasqGbps,
            i,
            measure::tcp_gbps(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?,
        );
    }
    for i in both {
        let s = &setups[i];
        let (p50, p99) = measure::tcp_rtt_us(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?;
        r.add(Figure::MasqRttP50, i, p50);
        r.add(Figure::MasqRttP99, i, p99);
    }
    for i in both {
        let s = &setups[i];
        r.add(
            Figure::MasqConnsPerSec,
            i,
            measure::conns_per_sec(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?,
        );
    }
    Ok(())
}

/// ADD and DEL latency over `pods` pods, on a node whose datapath (or bridge) is
/// already up (its two pods stay attached), setups interleaved.
fn lifecycle(tb: &Testbed, setups: &[Setup], pods: usize, r: &mut Report) -> Result<()> {
    for (i, s) in setups.iter().enumerate() {
        let Some(c) = &s.cni else { continue };
        let (adds, dels) = measure::add_del_ms(tb.ns(c.node), &c.plugin, &c.conf, pods)?;
        let (a50, a99) = measure::p50_p99(adds);
        let (d50, d99) = measure::p50_p99(dels);
        r.add(Figure::AddP50, i, a50);
        r.add(Figure::AddP99, i, a99);
        r.add(Figure::DelP50, i, d50);
        r.add(Figure::DelP99, i, d99);
    }
    Ok(())
}
