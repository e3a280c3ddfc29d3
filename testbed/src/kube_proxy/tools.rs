//! Running the node's tools inside the test's namespace, kube-proxy's sysctls
//! and the probe of what the node supports.
use std::{fmt, path::Path};

use super::{ports::Ctx, Features, Mode, Proxy};
use crate::{err, exec, Result};

/// A sysctl kube-proxy sets (dotted name, as `sysctl -w` takes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sysctl {
    pub name: &'static str,
    pub value: u32,
}

impl fmt::Display for Sysctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// `IPVSConnReuseModeMinSupportedKernelVersion` and
/// `IPVSConnReuseModeFixedKernelVersion` (pkg/util/kernel).
const CONN_REUSE_MIN: (u32, u32) = (4, 1);
const CONN_REUSE_FIXED: (u32, u32) = (5, 9);

/// The sysctls kube-proxy sets in `mode`, in its order:
/// - every mode, `conntrack.SetSysctls` with the default
///   `KubeProxyConntrackConfiguration` (established 24h, close-wait 1h; the
///   per-CPU `nf_conntrack_max` and its `hashsize` are machine-wide and left
///   alone);
/// - iptables, `NewProxier`: `route_localnet` for localhost NodePorts (IPv4);
/// - IPVS, `NewProxier`: `vs/conntrack`, `vs/conn_reuse_mode` (kernels 4.1 to
///   5.8 only), `vs/expire_nodest_conn`, `vs/expire_quiescent_template`,
///   `ip_forward` (no `--ipvs-strict-arp`: no `arp_ignore`/`arp_announce`).
pub(crate) fn sysctls(mode: Mode, ctx: &Ctx) -> Vec<Sysctl> {
    let s = |name, value| Sysctl { name, value };
    let mut out = vec![
        s("net.netfilter.nf_conntrack_tcp_timeout_established", 86400),
        s("net.netfilter.nf_conntrack_tcp_timeout_close_wait", 3600),
    ];
    match mode {
        Mode::Iptables => {
            if ctx.localhost_node_ports {
                out.push(s("net.ipv4.conf.all.route_localnet", 1));
            }
        }
        Mode::Nftables => {}
        Mode::Ipvs => {
            out.push(s("net.ipv4.vs.conntrack", 1));
            let k = ctx.features.kernel;
            if k >= CONN_REUSE_MIN && k < CONN_REUSE_FIXED {
                out.push(s("net.ipv4.vs.conn_reuse_mode", 0));
            }
            out.push(s("net.ipv4.vs.expire_nodest_conn", 1));
            out.push(s("net.ipv4.vs.expire_quiescent_template", 1));
            out.push(s("net.ipv4.ip_forward", 1));
        }
    }
    out
}

/// Sets `sysctls` inside the namespace (`sysctl -w` run in it: /proc/sys/net
/// shows the namespace of the process that opens it).
pub(crate) fn set_sysctls(netns: &Path, sysctls: &[Sysctl]) -> Result<()> {
    for s in sysctls {
        tool(netns, "sysctl", &["-w", &s.to_string()])?;
    }
    Ok(())
}

/// Runs `program args` in the namespace with `stdin`, required to succeed; its
/// stdout. The error names the tool and carries its output.
pub(crate) fn run(netns: &Path, program: &str, args: &[&str], stdin: &str) -> Result<String> {
    let out = exec::run(Some(netns), Path::new(program), args, &[], stdin.as_bytes())?;
    if out.success() {
        Ok(out.stdout)
    } else if stdin.is_empty() {
        Err(err!("kube-proxy rules: {program} failed: {out}"))
    } else {
        Err(err!(
            "kube-proxy rules: {program} failed: {out}\n--- its input ---\n{stdin}"
        ))
    }
}

/// [`run`] with no input.
pub(crate) fn tool(netns: &Path, program: &str, args: &[&str]) -> Result<String> {
    run(netns, program, args, "")
}

/// Runs `program args` in the namespace and returns its exit code and output,
/// whatever the code (for `-C`/`-N` checks that answer with their code).
pub(crate) fn status(netns: &Path, program: &str, args: &[&str]) -> Result<exec::Output> {
    exec::run(Some(netns), Path::new(program), args, &[], b"")
}

/// What kube-proxy would find on this node, looked up without changing
/// anything: `HasRandomFully` (`iptables --version` at least 1.6.2), whether
/// nfacct counters can be made (the `nfacct` tool answers in the namespace:
/// kube-proxy falls back to plain rules when `nfacct.Ensure` fails),
/// `nf_conntrack_tcp_be_liberal` in the namespace, and the kernel version.
pub(crate) fn probe(netns: &Path, proxy: &Proxy) -> Result<Features> {
    let kernel = kernel_version()?;
    let uses_iptables = proxy.mode != Mode::Nftables;
    let random_fully = uses_iptables && {
        let out = status(netns, "iptables", &["--version"])?;
        out.success() && iptables_version(&out.stdout) >= Some((1, 6, 2))
    };
    let nfacct = proxy.mode == Mode::Iptables
        && status(netns, "nfacct", &["list"]).is_ok_and(|o| o.success());
    let liberal = status(
        netns,
        "sysctl",
        &["-n", "net.netfilter.nf_conntrack_tcp_be_liberal"],
    )?;
    // kube-proxy reads it and, when that fails, installs the DROP rule.
    let tcp_be_liberal = liberal.success() && liberal.stdout.trim() != "0";
    Ok(Features {
        random_fully,
        nfacct,
        tcp_be_liberal,
        kernel,
    })
}

/// `iptables v1.8.9 (nf_tables)` -> (1, 8, 9).
fn iptables_version(s: &str) -> Option<(u32, u32, u32)> {
    let v = s.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut it = v.split('.').map(|n| n.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// The running kernel's major and minor version (the same in every namespace).
fn kernel_version() -> Result<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(|e| err!("reading the kernel version: {e}"))?;
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (it.next(), it.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => Err(err!("unexpected kernel release {release:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_versions() {
        assert_eq!(
            iptables_version("iptables v1.8.9 (nf_tables)\n"),
            Some((1, 8, 9))
        );
        assert_eq!(iptables_version("iptables v1.6.2\n"), Some((1, 6, 2)));
        assert_eq!(iptables_version("garbage"), None);
        assert!(iptables_version("iptables v1.6.1") < Some((1, 6, 2)));
    }
}
