//! Socket hooks (cgroup `sock_addr` programs) attached to a cgroup v2
//! directory, each link pinned at `links/cgroup-<program>` so that it
//! outlives the process that attached it: the hostPort hooks (the plugin)
//! and the Service hooks ([`crate::lb`], the agent). The plugin's upgrade
//! replaces the program of every such link in place.
use std::{
    fs::File,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, LinkError, PinnedLink},
    CgroupAttachMode, CgroupSockAddr, CgroupSockAddrAttachType, ProgramError,
};
use sluice_common::programs::{ProgKind, ProgSpec, SockHook};

use crate::{Error, PinRoot, Result};

/// Where the link of socket hook `prog` is pinned.
pub fn link_path(root: &PinRoot, prog: &str) -> PathBuf {
    root.links_dir().join(format!("cgroup-{prog}"))
}

/// Whether every hook of `hooks` is attached (its link is pinned).
pub fn attached(root: &PinRoot, hooks: &[ProgSpec]) -> bool {
    hooks.iter().all(|p| link_path(root, p.name).exists())
}

fn attach_type(h: SockHook) -> CgroupSockAddrAttachType {
    match h {
        SockHook::Connect4 => CgroupSockAddrAttachType::Connect4,
        SockHook::SendMsg4 => CgroupSockAddrAttachType::UDPSendMsg4,
        SockHook::RecvMsg4 => CgroupSockAddrAttachType::UDPRecvMsg4,
        SockHook::GetPeerName4 => CgroupSockAddrAttachType::GetPeerName4,
        SockHook::Connect6 => CgroupSockAddrAttachType::Connect6,
        SockHook::SendMsg6 => CgroupSockAddrAttachType::UDPSendMsg6,
        SockHook::RecvMsg6 => CgroupSockAddrAttachType::UDPRecvMsg6,
        SockHook::GetPeerName6 => CgroupSockAddrAttachType::GetPeerName6,
    }
}

/// Attaches the pinned programs of `hooks` to the cgroup v2 directory
/// `cgroup` (opened; `shown` names it in errors) and pins their links.
/// Hooks already attached stay; a spec that is no socket hook is skipped.
pub fn attach(root: &PinRoot, hooks: &[ProgSpec], cgroup: &File, shown: &Path) -> Result<()> {
    for p in hooks {
        let ProgKind::SockAddr(hook) = p.kind else {
            continue;
        };
        let lp = link_path(root, p.name);
        if lp.exists() {
            continue;
        }
        let prog_err = |op: String| move |source: ProgramError| Error::Program { op, source };
        let path = root.progs_dir().join(p.name);
        let mut prog = CgroupSockAddr::from_pin(&path, attach_type(hook))
            .map_err(prog_err(format!("open pinned program {}", path.display())))?;
        let id = prog
            .attach(cgroup.as_fd(), CgroupAttachMode::Single)
            .map_err(prog_err(format!(
                "attach {} to cgroup {}",
                p.name,
                shown.display()
            )))?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(prog_err(format!("take the link of {}", p.name)))?
            .try_into()
            .map_err(|e: LinkError| {
                Error::io(
                    format!("the link of {} as a bpf_link", p.name),
                    std::io::Error::other(e),
                )
            })?;
        let _: PinnedLink = link
            .pin(&lp)
            .map_err(|e| Error::io(format!("pin {}", lp.display()), std::io::Error::other(e)))?;
    }
    Ok(())
}

/// Unpins the links of `hooks`: the kernel detaches each once its last
/// reference goes. Missing pins are fine.
pub fn detach(root: &PinRoot, hooks: &[ProgSpec]) -> Result<()> {
    for p in hooks {
        let lp = link_path(root, p.name);
        match std::fs::remove_file(&lp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("unpin {}", lp.display()), e)),
        }
    }
    Ok(())
}
