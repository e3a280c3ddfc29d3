//! Where an invocation's time goes, for performance work: with
//! `SLUICE_TIMING=1` in its environment the plugin prints each step's
//! duration to stderr (`sluice: timing <step> <µs>`); with `SLUICE_TIMING`
//! set to an absolute path it appends `<CNI_COMMAND> <CNI_CONTAINERID> <step>
//! <µs>` lines to that file instead (a runtime or the bench keeps no plugin's
//! stderr; `cargo xtask bench` passes the variable through). Off, a step costs
//! one branch on a cached flag.
use std::{
    io::Write,
    path::PathBuf,
    sync::OnceLock,
    time::{Duration, Instant},
};

/// Where the lines go.
enum Sink {
    Stderr,
    /// The file, and what each line starts with.
    File(PathBuf, String),
}

fn sink() -> Option<&'static Sink> {
    static SINK: OnceLock<Option<Sink>> = OnceLock::new();
    SINK.get_or_init(|| {
        let v = std::env::var_os("SLUICE_TIMING")?;
        if v == "1" {
            return Some(Sink::Stderr);
        }
        let path = PathBuf::from(v);
        path.is_absolute().then(|| {
            let var = |k| std::env::var(k).unwrap_or_else(|_| "-".into());
            let who = format!("{} {}", var("CNI_COMMAND"), var("CNI_CONTAINERID"));
            Sink::File(path, who)
        })
    })
    .as_ref()
}

/// Times the steps of one command.
pub struct Steps {
    last: Option<Instant>,
}

impl Steps {
    pub fn start() -> Self {
        Self {
            last: sink().map(|_| Instant::now()),
        }
    }

    /// Ends step `name` (started by the previous call, or by [`Self::start`]).
    pub fn done(&mut self, name: &str) {
        let (Some(last), Some(sink)) = (self.last, sink()) else {
            return;
        };
        write(sink, name, last.elapsed());
        // The file write is not part of the next step.
        self.last = Some(Instant::now());
    }
}

/// Records `name` as taking `took`, outside a sequence of [`Steps`] (work
/// done beside the steps, in another thread).
pub fn record(name: &str, took: Duration) {
    if let Some(sink) = sink() {
        write(sink, name, took);
    }
}

fn write(sink: &Sink, name: &str, took: Duration) {
    let us = took.as_micros();
    match sink {
        Sink::Stderr => eprintln!("sluice: timing {name} {us}"),
        Sink::File(path, who) => {
            // One write per line (O_APPEND): lines of concurrent runs do
            // not interleave. Best effort: timing never fails a command.
            let line = format!("{who} {name} {us}\n");
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(line.as_bytes());
            }
        }
    }
}
