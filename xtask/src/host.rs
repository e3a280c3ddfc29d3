//! Facts about the machine and the process: root, CI, PATH lookups, mounts.
use std::{
    env, fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};

/// Whether the effective uid is 0 (read from /proc, no libc needed).
pub(crate) fn is_root() -> Result<bool> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .context("no effective uid in /proc/self/status")?;
    Ok(euid == "0")
}

/// `CI=true` (or `1`), as CI systems set it.
pub(crate) fn is_ci() -> bool {
    env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The first executable file called `name` in `$PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(crate) fn home() -> Result<PathBuf> {
    env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .context("$HOME is not set")
}

/// `$CARGO_HOME`, else `~/.cargo`.
pub(crate) fn cargo_home() -> Result<PathBuf> {
    match env::var_os("CARGO_HOME") {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Ok(home()?.join(".cargo")),
    }
}

/// Filesystem type of what is mounted (last, i.e. visible) on `mount_point`, if anything.
pub(crate) fn mounted_fs_type(mount_point: &str) -> Result<Option<String>> {
    let info =
        fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(parse_mountinfo_fs_type(&info, mount_point))
}

fn parse_mountinfo_fs_type(info: &str, mount_point: &str) -> Option<String> {
    // "36 35 98:0 / /sys/fs/bpf rw,relatime shared:2 - bpf bpf rw,mode=700"
    info.lines()
        .filter(|l| l.split_whitespace().nth(4) == Some(mount_point))
        .filter_map(|l| l.split(" - ").nth(1)?.split_whitespace().next())
        .next_back()
        .map(str::to_owned)
}

/// "850ms", "12.3s", "2m05s".
pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        let s = d.as_secs();
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_last_mount_wins() {
        let info = "\
25 1 0:22 / /sys rw,relatime shared:7 - sysfs sysfs rw
36 25 0:30 / /sys/fs/bpf rw,relatime shared:8 - bpf bpf rw,mode=700
37 36 0:31 / /sys/fs/bpf rw,relatime - tmpfs none rw
";
        assert_eq!(
            parse_mountinfo_fs_type(info, "/sys/fs/bpf").as_deref(),
            Some("tmpfs")
        );
        assert_eq!(
            parse_mountinfo_fs_type(info, "/sys").as_deref(),
            Some("sysfs")
        );
        assert_eq!(parse_mountinfo_fs_type(info, "/proc"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(fmt_duration(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(fmt_duration(Duration::from_secs(125)), "2m05s");
    }

    #[test]
    fn finds_programs_on_path() {
        assert!(which("sh").is_some());
        assert!(which("no-such-program-xtask").is_none());
    }
}
