//! Running libtest executables one at a time, as `cargo test` does, but timed
//! and counted per binary (the time table's rows).
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{build::TestExe, cmd};

/// One test binary's run.
#[derive(Debug, Clone)]
pub(crate) struct BinaryRun {
    pub name: String,
    pub took: Duration,
    pub passed: u32,
    pub failed: Vec<String>,
    /// Exited 0.
    pub ok: bool,
}

/// Runs each of `exes` (with `args`, in its package directory, with `envs`),
/// printing its output as it comes; every binary runs, also after a failure.
pub(crate) fn run_all(
    exes: &[TestExe],
    args: &[String],
    envs: &[(&str, &Path)],
) -> Result<Vec<BinaryRun>> {
    let mut runs = Vec::new();
    for t in exes {
        let mut c = Command::new(&t.exe);
        c.args(args).current_dir(&t.dir);
        for (k, v) in envs {
            c.env(k, v);
        }
        runs.push(run_one(&t.name, &mut c)?);
    }
    Ok(runs)
}

fn run_one(name: &str, c: &mut Command) -> Result<BinaryRun> {
    let line = cmd::describe(c);
    eprintln!("$ {line}");
    // One pipe for both streams, so the output keeps its order.
    let (reader, writer) = std::io::pipe().context("a pipe for the test's output")?;
    let started = Instant::now();
    let mut child = c
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    // The command holds the parent's copies of the write end: drop them, so
    // the read ends when the child (and anything it left running) exits.
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut log = String::new();
    for l in BufReader::new(reader).split(b'\n').map_while(Result::ok) {
        let l = String::from_utf8_lossy(&l);
        println!("{l}");
        log.push_str(&l);
        log.push('\n');
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{line}`"))?;
    let (passed, failed) = parse_libtest(&log);
    Ok(BinaryRun {
        name: name.to_string(),
        took: started.elapsed(),
        passed,
        failed,
        ok: status.success(),
    })
}

/// Passed count and failed test names from libtest's output.
pub(crate) fn parse_libtest(log: &str) -> (u32, Vec<String>) {
    let mut passed = 0;
    let mut failed = Vec::new();
    for l in log.lines() {
        if let Some(rest) = l.strip_prefix("test ") {
            if rest.ends_with(" ... ok") {
                passed += 1;
            } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
                failed.push(name.to_string());
            }
        }
    }
    (passed, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_output_counts() {
        let log = "running 3 tests\ntest a ... ok\ntest b::c ... FAILED\ntest d ... ok\n\
                   test result: FAILED. 2 passed; 1 failed; 0 ignored\n";
        assert_eq!(parse_libtest(log), (2, vec!["b::c".to_string()]));
    }

    #[test]
    fn a_binary_is_run_timed_and_counted() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo 'test x ... ok'; echo 'test y ... FAILED' >&2; exit 101",
        ]);
        let run = run_one("sh", &mut c).unwrap();
        assert_eq!(
            (run.passed, run.failed, run.ok),
            (1, vec!["y".into()], false)
        );
    }
}
