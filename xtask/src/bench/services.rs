//! The Services table: a pod's new connections and round trips to a
//! ClusterIP with 1, 1,000 and 10,000 Services in the cluster, Sluice
//! translating them itself (`sluice-node proxy` against the tests' stand-in
//! API server: its Service maps and socket hooks; and its apply times) against kube-proxy's iptables-mode rules on
//! a Sluice node, and the same pods' direct connections (pod -> pod address:
//! what a ClusterIP connection costs at best). Setups interleaved, one value
//! per round each; medians with their range.
use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::{Context, Result};

use super::{
    hostport::Cgroup,
    measure,
    topology::{self, Setup, CLUSTER_IP, SVC_SIZES},
};
use crate::{build::Binaries, testbed::Testbed};

/// How a node translates its Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Way {
    /// kube-proxy's iptables rules (Sluice hands the packets to the stack).
    KubeProxy,
    /// Sluice's own Services (socket hooks).
    Sluice,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Self::KubeProxy => "sluice+kube-proxy (iptables)",
            Self::Sluice => "sluice services",
        }
    }
}

/// One node of the table.
pub(super) struct SvcSetup {
    pub size: usize,
    pub way: Way,
    pub setup: Setup,
}

/// The cgroups the Sluice nodes' hooks attach to (made before the testbed,
/// so removed after it).
pub(super) fn cgroups() -> Result<Vec<Cgroup>> {
    (0..SVC_SIZES.len())
        .map(|i| Cgroup::new(&format!("ssv{i}")))
        .collect()
}

/// Both ways at every size; the agent's apply times go to `r`.
pub(super) fn setups(
    tb: &mut Testbed,
    bins: &Binaries,
    (apiserver, cgroups): (&Path, &[Cgroup]),
    r: &mut Results,
) -> Result<Vec<SvcSetup>> {
    let mut out = Vec::new();
    for (i, n) in SVC_SIZES.iter().enumerate() {
        out.push(SvcSetup {
            size: *n,
            way: Way::KubeProxy,
            setup: topology::services_kube_proxy(tb, bins, *n, i)?,
        });
        let (setup, times) =
            topology::services_sluice(tb, bins, (apiserver, &cgroups[i].path), *n, i)?;
        r.apply.insert(*n, times);
        out.push(SvcSetup {
            size: *n,
            way: Way::Sluice,
            setup,
        });
    }
    Ok(out)
}

/// A figure of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fig {
    ConnsPerSec,
    RttP50,
}

/// Every value, by (figure, column, size); the direct column is "direct".
#[derive(Default)]
pub(super) struct Results {
    values: BTreeMap<(Fig, &'static str, usize), Vec<f64>>,
    /// The agent's apply times on the Sluice node of each size.
    apply: BTreeMap<usize, topology::ApplyTimes>,
}

const DIRECT: &str = "direct pod->pod";

/// One value of each figure for every setup, interleaved; on each Sluice
/// node also the direct connection between the same pods.
pub(super) fn round(
    tb: &Testbed,
    setups: &[SvcSetup],
    cgroups: &[Cgroup],
    secs: u32,
    r: &mut Results,
) -> Result<()> {
    let port = measure::SOCKPERF_PORT;
    for (k, s) in setups.iter().enumerate() {
        let cg = cgroup_of(s, cgroups);
        let (c, srv) = (tb.ns(s.setup.pod1), tb.ns(s.setup.pod2));
        let (p50, _) = measure::tcp_rtt_us_via_in(
            (c, cg),
            srv,
            (CLUSTER_IP, port),
            (&s.setup.pod2_ip, port),
            secs,
        )
        .with_context(|| {
            format!(
                "{} ({} Services): RTT to {CLUSTER_IP}",
                s.way.name(),
                s.size
            )
        })?;
        r.add(Fig::RttP50, s.way.name(), s.size, p50);
        let cps = measure::conns_per_sec_via_in((c, cg), srv, (CLUSTER_IP, &s.setup.pod2_ip), secs)
            .with_context(|| {
                format!(
                    "{} ({} Services): connections to {CLUSTER_IP}",
                    s.way.name(),
                    s.size
                )
            })?;
        r.add(Fig::ConnsPerSec, s.way.name(), s.size, cps);
        if s.way == Way::Sluice {
            let direct = measure::conns_per_sec(c, srv, &s.setup.pod2_ip, secs)
                .with_context(|| format!("direct connections (node {k})"))?;
            r.add(Fig::ConnsPerSec, DIRECT, s.size, direct);
            let (d50, _) = measure::tcp_rtt_us(c, srv, &s.setup.pod2_ip, secs)?;
            r.add(Fig::RttP50, DIRECT, s.size, d50);
        }
    }
    Ok(())
}

fn cgroup_of<'a>(s: &SvcSetup, cgroups: &'a [Cgroup]) -> Option<&'a Path> {
    let i = SVC_SIZES.iter().position(|n| *n == s.size)?;
    (s.way == Way::Sluice).then(|| cgroups[i].path.as_path())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

impl Results {
    fn add(&mut self, f: Fig, column: &'static str, size: usize, v: f64) {
        self.values.entry((f, column, size)).or_default().push(v);
    }

    fn cell(&self, f: Fig, column: &str, size: usize) -> Option<(f64, f64, f64)> {
        let v = self
            .values
            .iter()
            .find(|((ff, c, n), _)| *ff == f && *c == column && *n == size)
            .map(|(_, v)| v)?;
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((median(v), lo, hi))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The table's rows: per size, each column's median (range), and the
    /// ratios the targets are stated in.
    fn rows(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let cols = [DIRECT, Way::Sluice.name(), Way::KubeProxy.name()];
        let mut header = vec!["Services".to_string(), "figure".to_string()];
        header.extend(cols.iter().map(ToString::to_string));
        header.extend([
            "services/direct".to_string(),
            "services/kube-proxy".to_string(),
        ]);
        let mut rows = Vec::new();
        for n in SVC_SIZES {
            for (f, name) in [
                (Fig::ConnsPerSec, "new TCP connections/s to the ClusterIP"),
                (Fig::RttP50, "TCP RTT median to the ClusterIP (us)"),
            ] {
                let mut row = vec![n.to_string(), name.to_string()];
                for c in cols {
                    row.push(self.cell(f, c, n).map_or("-".into(), |(m, lo, hi)| {
                        format!("{m:.1} ({lo:.1}-{hi:.1})")
                    }));
                }
                let ratio = |a: &str, b: &str| match (self.cell(f, a, n), self.cell(f, b, n)) {
                    (Some((x, _, _)), Some((y, _, _))) if y > 0.0 => format!("{:.2}x", x / y),
                    _ => "-".into(),
                };
                row.push(ratio(Way::Sluice.name(), DIRECT));
                row.push(ratio(Way::Sluice.name(), Way::KubeProxy.name()));
                rows.push(row);
            }
        }
        (header, rows)
    }

    /// The agent's apply times: per size, the cold start and one endpoint
    /// change's p50/p99 (with how many changes).
    fn apply_lines(&self) -> Vec<String> {
        self.apply
            .iter()
            .map(|(n, t)| {
                let mut line = format!(
                    "{n} Services: sluice-node proxy from its start to every Service port written {:.0} ms",
                    t.cold_ms
                );
                if !t.change_ms.is_empty() {
                    let (p50, p99) = measure::p50_p99(t.change_ms.clone());
                    let _ = write!(
                        line,
                        "; one EndpointSlice change to its port rewritten p50 {p50:.1} ms, p99 {p99:.1} ms ({} changes)",
                        t.change_ms.len()
                    );
                }
                line
            })
            .collect()
    }

    /// Plain text, for the terminal.
    pub(super) fn text(&self) -> String {
        let (header, rows) = self.rows();
        let mut out = String::from(
            "\nServices (pod -> ClusterIP; 1, 1,000, 10,000 Services in the cluster):\n",
        );
        let _ = writeln!(out, "{}", header.join(" | "));
        for r in rows {
            let _ = writeln!(out, "{}", r.join(" | "));
        }
        for t in self.targets() {
            let _ = writeln!(out, "  {t}");
        }
        let _ = writeln!(out, "Agent apply times (against the stand-in API server):");
        for l in self.apply_lines() {
            let _ = writeln!(out, "  {l}");
        }
        out
    }

    /// Issue 52's targets, each with the same-run figures it is judged on.
    fn targets(&self) -> Vec<String> {
        let cps = |c: &str, n: usize| self.cell(Fig::ConnsPerSec, c, n).map(|(m, _, _)| m);
        let check = |ok: bool| if ok { "met" } else { "NOT met" };
        let mut out = Vec::new();
        let per_size: Vec<(usize, f64)> = SVC_SIZES
            .iter()
            .filter_map(|n| Some((*n, cps(Way::Sluice.name(), *n)? / cps(DIRECT, *n)?)))
            .collect();
        if !per_size.is_empty() {
            let worst = per_size
                .iter()
                .map(|(_, r)| *r)
                .fold(f64::INFINITY, f64::min);
            let list: Vec<String> = per_size
                .iter()
                .map(|(n, r)| format!("{n}: {r:.3}x"))
                .collect();
            out.push(format!(
                "ClusterIP new connections >= 0.95x direct pod->pod at every size ({}): {}",
                list.join(", "),
                check(worst >= 0.95)
            ));
        }
        let last = SVC_SIZES[SVC_SIZES.len() - 1];
        if let (Some(s), Some(k)) = (
            cps(Way::Sluice.name(), last),
            cps(Way::KubeProxy.name(), last),
        ) {
            out.push(format!(
                "ClusterIP new connections >= 2x kube-proxy's iptables mode at {last} Services: {:.2}x, {}",
                s / k,
                check(s / k >= 2.0)
            ));
        }
        out
    }

    /// A markdown section at heading `level`.
    pub(super) fn markdown(&self, level: &str) -> String {
        let (header, rows) = self.rows();
        let mut md = format!(
            "{level} Services (pod -> ClusterIP with 1, 1,000 and 10,000 Services in the cluster)\n\n"
        );
        let _ = writeln!(md, "| {} |", header.join(" | "));
        let _ = writeln!(md, "|{}", " --- |".repeat(header.len()));
        for r in rows {
            let _ = writeln!(md, "| {} |", r.join(" | "));
        }
        md.push_str(
            "\nThe direct column: the same pods of the Sluice-services node, connecting to \
             the pod's own address. Sluice services: the Service maps written and the \
             socket hooks attached (on a cgroup the clients join) by the real \
             `sluice-node proxy` (the measured Service in the middle of the others) against the tests' stand-in API server \
             (`sluice-test-apiserver`: list, watch, resource versions and bookmarks as \
             kube-rs uses them; no kube-apiserver is to be had here), one EndpointSlice per \
             Service. kube-proxy: its iptables-mode rules written by the real `iptables-restore` \
             in kube-proxy's structure (`sluice_testbed::kube_proxy`), the measured Service's \
             rule in the middle of `KUBE-SERVICES`, on a Sluice node with `serviceCIDRs`.\n\n\
             Targets (issue 52):\n\n",
        );
        for t in self.targets() {
            let _ = writeln!(md, "- {t}");
        }
        md.push_str(
            "\nThe agent's apply times (its own log lines; a change: from the \
                     stand-in API server storing the EndpointSlice):\n\n",
        );
        for l in self.apply_lines() {
            let _ = writeln!(md, "- {l}");
        }
        md.push('\n');
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_every_size_and_targets_use_the_medians() {
        let mut r = Results::default();
        for n in SVC_SIZES {
            for v in [100.0, 98.0, 99.0] {
                r.add(Fig::ConnsPerSec, DIRECT, n, v);
            }
            r.add(Fig::ConnsPerSec, Way::Sluice.name(), n, 97.0);
            r.add(Fig::ConnsPerSec, Way::KubeProxy.name(), n, 40.0);
        }
        let (header, rows) = r.rows();
        assert_eq!(header.len(), 7);
        assert_eq!(rows.len(), 2 * SVC_SIZES.len());
        assert_eq!(rows[0][2], "99.0 (98.0-100.0)");
        assert_eq!(rows[0][5], "0.98x");
        assert_eq!(rows[1][2], "-", "no RTT measured");
        let t = r.targets();
        assert!(t[0].ends_with(": met"), "{t:?}");
        assert!(t[1].contains("2.42x, met"), "{t:?}");
        assert!(r.markdown("##").contains("| 10000 | new TCP connections/s"));
    }
}
