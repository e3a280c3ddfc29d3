//! Where a guest's minutes went, per test binary: its wall time, the guest's
//! CPU split over it (`cpu` of /proc/stat before and after), and the datapath
//! loads the plugin timed (`SLUICE_TIMING`). The job script writes both files
//! (`<binary>.stat`, `<binary>.timing`); the time table prints them.
use std::{fs, path::Path, time::Duration};

/// One test binary's run in a guest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GuestTimes {
    pub wall: Duration,
    /// Shares of the guest's CPU time (all vCPUs) over the run.
    pub cpu: CpuSplit,
    /// Datapath loads (`load: object and maps`: one per load).
    pub loads: u32,
    /// The verifier's wall time in those loads (`load: verify`: every
    /// program verified and compiled, several at once).
    pub verify: Duration,
    /// Every ADD's `datapath prepare` step (a load when one is needed, else
    /// the check that the pinned programs are current).
    pub prepare: Duration,
}

/// Fractions of CPU time; they sum to 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CpuSplit {
    /// user + nice
    pub user: f64,
    /// system + irq + softirq (the verifier, the network stack)
    pub system: f64,
    /// idle + iowait (waiting: timers, sleeps, the 9p root)
    pub idle: f64,
}

impl GuestTimes {
    /// The files of binary `name` in the guest's output directory, if it ran.
    pub(crate) fn read(out: &Path, name: &str) -> Option<Self> {
        let stat = fs::read_to_string(out.join(format!("{name}.stat"))).ok()?;
        let timing = fs::read_to_string(out.join(format!("{name}.timing"))).unwrap_or_default();
        Self::parse(&stat, &timing)
    }

    fn parse(stat: &str, timing: &str) -> Option<Self> {
        let (t0, c0) = stat_line(stat, "start")?;
        let (t1, c1) = stat_line(stat, "end")?;
        let delta: Vec<u64> = c1
            .iter()
            .zip(&c0)
            .map(|(b, a)| b.saturating_sub(*a))
            .collect();
        // user nice system idle iowait irq softirq steal
        let at = |i: usize| delta.get(i).copied().unwrap_or(0);
        let (user, system, idle) = (at(0) + at(1), at(2) + at(5) + at(6), at(3) + at(4));
        let total = (user + system + idle).max(1) as f64;
        let mut times = Self {
            wall: Duration::from_secs_f64((t1 - t0).max(0.0)),
            cpu: CpuSplit {
                user: user as f64 / total,
                system: system as f64 / total,
                idle: idle as f64 / total,
            },
            loads: 0,
            verify: Duration::ZERO,
            prepare: Duration::ZERO,
        };
        for line in timing.lines() {
            // `<CNI_COMMAND> <CNI_CONTAINERID> <step, may have spaces> <µs>`
            let mut words: Vec<&str> = line.split_whitespace().collect();
            let Some(us) = words.pop().and_then(|w| w.parse::<u64>().ok()) else {
                continue;
            };
            let step = words.get(2..).unwrap_or_default().join(" ");
            let took = Duration::from_micros(us);
            if step == "load: object and maps" {
                times.loads += 1;
            } else if step == "load: verify" {
                times.verify += took;
            } else if step == "datapath prepare" {
                times.prepare += took;
            }
        }
        Some(times)
    }
}

/// `<tag> <uptime seconds> cpu <counters...>` of the job script.
fn stat_line(stat: &str, tag: &str) -> Option<(f64, Vec<u64>)> {
    let line = stat.lines().find(|l| l.starts_with(tag))?;
    let mut words = line.split_whitespace().skip(1);
    let uptime = words.next()?.parse().ok()?;
    if words.next()? != "cpu" {
        return None;
    }
    let counters = words.map_while(|w| w.parse().ok()).collect::<Vec<u64>>();
    (counters.len() >= 4).then_some((uptime, counters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_timing_give_the_split_and_the_loads() {
        let stat = "start 10.50 cpu  100 0 50 200 10 5 5 0 0 0\n\
                    end 70.50 cpu  400 20 250 300 30 15 25 0 0 0\n";
        let timing = "ADD t-1 load: object and maps 700000\n\
                      ADD t-1 verify uplink_out 4000000\n\
                      ADD t-1 verify from_pod 250000\n\
                      ADD t-1 load: verify 4100000\n\
                      ADD t-1 datapath prepare 5200000\n\
                      ADD t-2 datapath prepare 1000\n\
                      DEL t-1 datapath detach 800000\n\
                      garbage\n";
        let t = GuestTimes::parse(stat, timing).unwrap();
        assert_eq!(t.wall, Duration::from_mins(1));
        // user 320, system 200+10+20 = 230, idle 100+20 = 120 (of 670)
        assert!((t.cpu.user - 320.0 / 670.0).abs() < 1e-9, "{t:?}");
        assert!((t.cpu.system - 230.0 / 670.0).abs() < 1e-9, "{t:?}");
        assert!((t.cpu.idle - 120.0 / 670.0).abs() < 1e-9, "{t:?}");
        assert_eq!(t.loads, 1);
        assert_eq!(t.verify, Duration::from_millis(4100));
        assert_eq!(t.prepare, Duration::from_millis(5201));
    }

    #[test]
    fn a_binary_that_never_ended_has_no_times() {
        assert_eq!(GuestTimes::parse("start 1.0 cpu 1 2 3 4 5 6 7\n", ""), None);
    }
}
