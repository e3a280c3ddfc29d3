//! What the integration tests may leave behind on the node: network namespaces,
//! interfaces, bpf links, bpffs pins and files under the CNI state directory. A
//! snapshot before and after the tests; anything new afterwards is a leak.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{cmd, host};

const BPFFS: &str = "/sys/fs/bpf";
const SLUICE_PIN_ROOT: &str = "/sys/fs/bpf/sluice";
/// How deep under the sluice pin root to look (network/kind/name).
const PIN_DEPTH: usize = 4;
/// Where Sluice (`stateDir`, IPAM `dataDir`) and libcni's result cache write when
/// a config does not say otherwise. Tests must give each node its own dirs, so a
/// file here afterwards is a test that fell back to the defaults.
const CNI_STATE: &str = "/var/lib/cni";
/// networks/<network>/<address>, sluice/<network>/<file>, results/<file>; one
/// more level for what a plugin nests.
const CNI_STATE_DEPTH: usize = 4;

/// Objects by identity ("netns foo", "bpf link 42") -> how to show them.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    objects: BTreeMap<String, String>,
    counts: BTreeMap<&'static str, usize>,
    /// Why bpf links were not looked at, if they were not.
    pub bpf_links_unchecked: Option<String>,
}

impl Snapshot {
    /// With `require_bpftool`, a missing bpftool is an error instead of a note.
    pub(crate) fn take(require_bpftool: bool) -> Result<Self> {
        let mut snap = Snapshot::default();
        let netns = cmd::stdout(Command::new("ip").args(["netns", "list"]))?;
        snap.add_all("netns", parse_netns(&netns), |n| format!("netns {n}"));
        let links = cmd::stdout(Command::new("ip").args(["-o", "link", "show"]))?;
        snap.add_all("interfaces", parse_ip_link(&links), |n| {
            format!("interface {n}")
        });
        match host::which("bpftool") {
            Some(bpftool) => {
                let out = cmd::stdout(Command::new(bpftool).args(["link", "show"]))?;
                let links = parse_bpftool_links(&out);
                snap.counts.insert("bpf links", links.len());
                for (id, what) in links {
                    snap.objects.insert(
                        format!("bpf link {id:>10}"),
                        format!("bpf link {id}: {what}"),
                    );
                }
            }
            None if require_bpftool => {
                bail!("bpftool is not on PATH, so bpf links cannot be checked for leaks (CI=true)")
            }
            None => snap.bpf_links_unchecked = Some("bpftool not found on PATH".to_owned()),
        }
        let mut pins = list_dir(Path::new(BPFFS))?;
        pins.extend(list_tree(Path::new(SLUICE_PIN_ROOT), PIN_DEPTH)?);
        pins.sort();
        pins.dedup();
        snap.add_all(
            "bpffs entries",
            pins.iter().map(|p| p.display().to_string()),
            |p| format!("bpffs {p}"),
        );
        // Files only: an empty directory holds no state, and runtimes create
        // /var/lib/cni/results on their own.
        let state = list_tree(Path::new(CNI_STATE), CNI_STATE_DEPTH)?
            .into_iter()
            .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()));
        snap.add_all(
            "CNI state files",
            state.map(|p| p.display().to_string()),
            |p| format!("file {p}"),
        );
        Ok(snap)
    }

    fn add_all(
        &mut self,
        kind: &'static str,
        names: impl IntoIterator<Item = String>,
        show: impl Fn(&str) -> String,
    ) {
        let mut n = 0;
        for name in names {
            let shown = show(&name);
            self.objects.insert(shown.clone(), shown);
            n += 1;
        }
        self.counts.insert(kind, n);
    }

    /// What `after` has that `self` had not, ready to print.
    pub(crate) fn new_in(&self, after: &Snapshot) -> Vec<String> {
        after
            .objects
            .iter()
            .filter(|(key, _)| !self.objects.contains_key(*key))
            .map(|(_, shown)| shown.clone())
            .collect()
    }

    /// "3 netns, 12 interfaces, 4 bpf links, 2 bpffs entries"
    pub(crate) fn summary(&self) -> String {
        self.counts
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `ip netns list`: "name" or "name (id: 3)" per line.
fn parse_netns(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// `ip -o link show`: "5: veth1@if4: <BROADCAST,...> mtu 1500 ..." -> "veth1".
fn parse_ip_link(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

/// `bpftool link show`: an unindented "42: tcx  prog 17" line starts each link,
/// indented lines continue it. -> (42, "tcx prog 17 ifindex 5 ...").
fn parse_bpftool_links(out: &str) -> Vec<(u32, String)> {
    let mut links: Vec<(u32, String)> = Vec::new();
    for line in out.lines() {
        let head = line
            .split_once(':')
            .filter(|_| !line.starts_with(char::is_whitespace))
            .and_then(|(id, rest)| Some((id.parse::<u32>().ok()?, rest)));
        match (head, links.last_mut()) {
            (Some((id, rest)), _) => links.push((id, squash(rest))),
            (None, Some((_, what))) if !line.trim().is_empty() => {
                what.push(' ');
                what.push_str(&squash(line));
            }
            _ => {}
        }
    }
    links
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries = Vec::new();
    let iter = match fs::read_dir(dir) {
        Ok(iter) => iter,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(entries),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for entry in iter {
        entries.push(
            entry
                .with_context(|| format!("listing {}", dir.display()))?
                .path(),
        );
    }
    Ok(entries)
}

/// Everything under `dir`, down to `depth` levels.
fn list_tree(dir: &Path, depth: usize) -> Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    if depth == 0 {
        return Ok(all);
    }
    for path in list_dir(dir)? {
        let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        all.push(path.clone());
        if is_dir {
            all.extend(list_tree(&path, depth - 1)?);
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_netns_and_links() {
        assert_eq!(parse_netns("sl-a (id: 0)\nsl-b\n"), ["sl-a", "sl-b"]);
        let links = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n\
                     7: slc0a1b2@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\\    link/ether 02:00:00:00:00:01\n";
        assert_eq!(parse_ip_link(links), ["lo", "slc0a1b2"]);
    }

    #[test]
    fn parses_bpftool_links() {
        let out = "\
12: tcx  prog 34  
\tifindex slc0a1b2(7)  attach_type tcx_ingress  
13: xdp  prog 40  
\tifindex eth9(9)  
";
        assert_eq!(
            parse_bpftool_links(out),
            [
                (
                    12,
                    "tcx prog 34 ifindex slc0a1b2(7) attach_type tcx_ingress".to_owned()
                ),
                (13, "xdp prog 40 ifindex eth9(9)".to_owned())
            ]
        );
    }

    #[test]
    fn reports_only_new_objects() {
        let mut before = Snapshot::default();
        before.add_all("netns", ["a".to_owned()], |n| format!("netns {n}"));
        let mut after = Snapshot::default();
        after.add_all("netns", ["a".to_owned(), "b".to_owned()], |n| {
            format!("netns {n}")
        });
        assert_eq!(before.new_in(&after), ["netns b"]);
        assert_eq!(after.new_in(&before), Vec::<String>::new());
        assert_eq!(after.summary(), "2 netns");
    }

    #[test]
    fn lists_trees() {
        let dir = std::env::temp_dir().join(format!("xtask-tree-test-{}", std::process::id()));
        fs::create_dir_all(dir.join("net1/maps")).unwrap();
        fs::write(dir.join("net1/maps/sl_ep"), "").unwrap();
        let tree = list_tree(&dir, 4).unwrap();
        assert_eq!(tree.len(), 3, "{tree:?}");
        assert_eq!(list_tree(&dir, 1).unwrap().len(), 1);
        assert!(list_tree(&dir.join("absent"), 4).unwrap().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
