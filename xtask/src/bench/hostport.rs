//! What the port-mapping table needs besides its topology: the reference
//! `portmap` plugin's rules for thousands of mappings, and the dedicated cgroup
//! Sluice's socket hooks attach to.
//!
//! The reference plugin writes its rules one `iptables` run at a time (a check,
//! then an append, three rules per mapping), and every run reads the whole nat
//! table: 1,000 mappings in one ADD take ~55 s on these VMs, 10,000 would take
//! about an hour. So the filler container's ADD runs through the CNI protocol
//! with its first `CNI_MAPPINGS` mappings, and the rules of the others are
//! appended in one `iptables-restore --noflush` inside the node namespace, each
//! line made from the plugin's own rule for the first mapping with only the port
//! numbers changed. Before anything is appended, the lines made this way for the
//! mappings the plugin itself wrote are compared with what it wrote; any
//! difference stops the run. The table then holds what one ADD of all the
//! mappings would have left.
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{cmd, testbed::Netns};

/// Mappings of the filler's ADD that the reference plugin writes itself: three
/// of its multiport groups (15 ports each).
pub(crate) const CNI_MAPPINGS: usize = 45;

/// (hostPort, containerPort) of a mapping.
pub(crate) type Mapping = (u16, u16);

/// Appends to the node's nat table the reference portmap rules of `all[done..]`,
/// the mappings of container `cid` whose first `done` the plugin wrote itself.
pub(crate) fn extend_portmap(node: &Netns, cid: &str, all: &[Mapping], done: usize) -> Result<()> {
    ensure!(
        done > 0 && done < all.len(),
        "nothing to extend ({done} of {} mappings written)",
        all.len()
    );
    let saved = cmd::stdout(node.command("iptables-save").args(["-t", "nat"]))?;
    let id = format!(r#"id: \"{cid}\""#);
    let entries: Vec<&str> = saved
        .lines()
        .filter(|l| l.starts_with("-A CNI-HOSTPORT-DNAT ") && l.contains(&id))
        .collect();
    let first = entries
        .first()
        .with_context(|| format!("no CNI-HOSTPORT-DNAT rule of {cid} in the node's nat table"))?;
    let chain = after(first, "-j").context("a CNI-HOSTPORT-DNAT rule without -j")?;
    let group = after(first, "--dports")
        .context("a CNI-HOSTPORT-DNAT rule without --dports")?
        .split(',')
        .count();
    let rules: Vec<&str> = saved
        .lines()
        .filter(|l| l.starts_with(&format!("-A {chain} ")))
        .collect();
    ensure!(
        rules.len().is_multiple_of(done) && done.is_multiple_of(group),
        "{} rules in {chain} and groups of {group} ports for {done} mappings: \
         not the layout this bench extends",
        rules.len()
    );
    let per = rules.len() / done;
    let (h0, c0) = all[0];
    let rule = |m: Mapping| -> Vec<String> {
        rules[..per]
            .iter()
            .map(|l| {
                substitute(l, |prev, tok| match prev {
                    "--dport" if tok == h0.to_string() => Some(m.0.to_string()),
                    "--to-destination" => tok
                        .strip_suffix(&format!(":{c0}"))
                        .map(|ip| format!("{ip}:{}", m.1)),
                    _ => None,
                })
            })
            .collect()
    };
    let entry = |ports: &[Mapping]| -> String {
        let list = ports
            .iter()
            .map(|m| m.0.to_string())
            .collect::<Vec<_>>()
            .join(",");
        substitute(first, |prev, _| (prev == "--dports").then(|| list.clone()))
    };
    // What the plugin wrote must be what these templates make.
    let made: Vec<String> = all[..done].iter().flat_map(|m| rule(*m)).collect();
    ensure!(
        made == rules,
        "the portmap rules in {chain} differ from the ones made from its first mapping"
    );
    let made: Vec<String> = all[..done].chunks(group).map(entry).collect();
    ensure!(
        made == entries,
        "portmap's CNI-HOSTPORT-DNAT rules of {cid} differ from the ones made from its first"
    );
    let mut input = String::from("*nat\n");
    for m in &all[done..] {
        for l in rule(*m) {
            input.push_str(&l);
            input.push('\n');
        }
    }
    for g in all[done..].chunks(group) {
        input.push_str(&entry(g));
        input.push('\n');
    }
    input.push_str("COMMIT\n");
    restore(node, &input)?;
    // Count what is there now.
    let saved = cmd::stdout(node.command("iptables-save").args(["-t", "nat"]))?;
    let count = |prefix: &str| saved.lines().filter(|l| l.starts_with(prefix)).count();
    let in_chain = count(&format!("-A {chain} "));
    ensure!(
        in_chain == per * all.len(),
        "{in_chain} rules in {chain} after the restore, {} expected",
        per * all.len()
    );
    Ok(())
}

/// The token after `flag` in an iptables-save line.
fn after<'a>(line: &'a str, flag: &str) -> Option<&'a str> {
    let mut it = line.split(' ');
    it.find(|t| *t == flag)?;
    it.next()
}

/// `line` with each token replaced where `f(previous token, token)` says so
/// (iptables-save separates tokens by one space; quoted comments are never a
/// token after the flags this is used with).
fn substitute(line: &str, f: impl Fn(&str, &str) -> Option<String>) -> String {
    let mut prev = "";
    line.split(' ')
        .map(|t| {
            let out = f(prev, t).unwrap_or_else(|| t.to_string());
            prev = t;
            out
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn restore(node: &Netns, input: &str) -> Result<()> {
    let mut c = node.command("iptables-restore");
    c.args(["--noflush", "-w", "10"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .with_context(|| format!("starting `{}`", cmd::describe(&c)))?;
    if let Some(mut s) = child.stdin.take() {
        s.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            cmd::describe(&c),
            cmd::status_text(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A cgroup (v2) of this run, for Sluice's `hostPortCgroup`: nothing is ever
/// moved into it (the figures' clients are on the external host), so rmdir
/// removes it on drop; leftovers of runs whose process is gone are removed
/// before a new one is made.
pub(crate) struct Cgroup {
    pub path: PathBuf,
}

const CGROUP_PREFIX: &str = "slbench-";

impl Cgroup {
    pub(crate) fn new(tag: &str) -> Result<Self> {
        let root = cgroup2_root()?;
        clean_cgroups(&root);
        let path = root.join(format!("{CGROUP_PREFIX}{tag}-{}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!("bench: could not remove {}: {e}", self.path.display());
        }
    }
}

/// Where cgroup v2 is mounted: /sys/fs/cgroup itself on a unified host, else the
/// cgroup2 mount below it (/sys/fs/cgroup/unified on a hybrid one).
fn cgroup2_root() -> Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            (right.split(' ').next()? == "cgroup2").then(|| PathBuf::from(point))
        })
        .collect();
    let root = Path::new("/sys/fs/cgroup");
    mounts
        .iter()
        .find(|m| m.as_path() == root)
        .or_else(|| mounts.iter().find(|m| m.starts_with(root)))
        .cloned()
        .context("no cgroup2 mount at or below /sys/fs/cgroup")
}

/// Removes `slbench-*-<pid>` cgroups whose process is gone (rmdir only: a
/// cgroup with processes in it stays).
fn clean_cgroups(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(CGROUP_PREFIX)
            .and_then(|r| r.rsplit('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_tokens_after_flags() {
        let l = "-A CNI-DN-x -p tcp -m tcp --dport 20000 -j DNAT --to-destination 10.85.0.2:10000";
        let out = substitute(l, |prev, tok| match prev {
            "--dport" if tok == "20000" => Some("20001".into()),
            "--to-destination" => tok.strip_suffix(":10000").map(|ip| format!("{ip}:10001")),
            _ => None,
        });
        assert_eq!(
            out,
            "-A CNI-DN-x -p tcp -m tcp --dport 20001 -j DNAT --to-destination 10.85.0.2:10001"
        );
        assert_eq!(after(l, "-j"), Some("DNAT"));
    }
}
