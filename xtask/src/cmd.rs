//! Running external commands with errors that show the command line and how it ended.
use std::{
    ffi::OsStr,
    fmt::Write as _,
    os::unix::process::ExitStatusExt,
    process::{Command, ExitStatus, Output, Stdio},
};

use anyhow::{bail, Context, Result};

/// The command as one could paste it into a shell: env vars it sets, program,
/// arguments (quoted where needed) and the directory it runs in.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut parts = Vec::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            parts.push(format!("{}={}", key.to_string_lossy(), quote(value)));
        }
    }
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    let mut line = parts.join(" ");
    if let Some(dir) = cmd.get_current_dir() {
        let _ = write!(line, "  (in {})", dir.display());
    }
    line
}

fn quote(arg: &OsStr) -> String {
    let s = arg.to_string_lossy();
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=+:,@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// "exit status 101", or "killed by signal 9".
pub(crate) fn status_text(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}

/// Runs the command with inherited stdio, echoing it first; fails unless it exits 0.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    eprintln!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({})", status_text(status));
    }
    Ok(())
}

/// Runs the command quietly and returns what it printed, whatever its exit status;
/// fails only when it cannot be started.
pub(crate) fn capture(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{}`", describe(cmd)))
}

/// Runs the command with its stderr shown (cargo's progress and rendered
/// diagnostics) and returns its stdout (cargo's JSON messages); fails unless
/// it exits 0.
pub(crate) fn stdout_json(cmd: &mut Command) -> Result<String> {
    let line = describe(cmd);
    eprintln!("$ {line}");
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({})", status_text(out.status));
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{line}` printed non-UTF-8"))
}

/// Runs the command quietly and returns its stdout; fails unless it exits 0,
/// with its stderr in the error.
pub(crate) fn stdout(cmd: &mut Command) -> Result<String> {
    let out = capture(cmd)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            status_text(out.status),
            stderr.trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", describe(cmd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_quotes_what_a_shell_would_split() {
        let mut cmd = Command::new("cargo");
        cmd.args(["+nightly", "build", "-Z", "build-std=core"])
            .env("RUSTFLAGS", "-C debuginfo=2")
            .arg("it's")
            .current_dir("/tmp");
        assert_eq!(
            describe(&cmd),
            r"RUSTFLAGS='-C debuginfo=2' cargo +nightly build -Z build-std=core 'it'\''s'  (in /tmp)"
        );
    }

    #[test]
    fn failures_name_the_command_and_status() {
        let err = run(Command::new("false").arg("x")).unwrap_err();
        assert_eq!(err.to_string(), "`false x` failed (exit status 1)");
        let err = stdout(Command::new("ls").arg("/nonexistent-xtask")).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("`ls /nonexistent-xtask` failed (exit status 2): "));
        let err = run(&mut Command::new("/nonexistent-xtask-tool")).unwrap_err();
        assert_eq!(err.to_string(), "could not start `/nonexistent-xtask-tool`");
    }
}
