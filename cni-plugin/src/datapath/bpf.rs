//! Every aya call of the plugin lives here, so an aya upgrade touches one file.
//!
//! Layout under the pin root (see `sluice_common::pin_dirs`):
//! `maps/<map>`, `progs/<program>`, `links/<host veth>-<program>`.
//! bpffs refuses names with a dot (EPERM from `bpf_lookup`, kernel/bpf/inode.c:
//! dots are reserved), so no pin name has one.
use std::{
    fs,
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{
        lpm_trie::{Key as LpmKey, LpmTrie},
        Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues,
    },
    programs::{
        links::{FdLink, PinnedLink},
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        tc::SchedClassifierLink,
        tc::{qdisc_add_clsact, NlOptions, TcAttachOptions, TcError, TcHandle},
        xdp::XdpLink,
        CgroupSockAddr, Link, PerfEvent, SchedClassifier, TcAttachType, Xdp, XdpMode,
    },
    EbpfLoader,
};
use aya_obj::programs::XdpAttachType;
use sluice_common::{
    map_names, masq_flags, nat_flags, prog_names, reason, BwState, DatapathMeta, Endpoint,
    EndpointInfo, EndpointStats, EpDropKey, FragEntry, FragKey, HostPortConfig, HpFlow, IpKey,
    MasqConfig, NatEntry, NatKey, NatRev, NodeConfig, PortKey, PortTarget, SockKey, SockOrig,
    LAYOUT_VERSION,
};

use super::bpffs::unpin;
use crate::{cni::config::PodAttach, error::Error};

/// The eBPF object `cargo xtask build` embedded (see build.rs).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice-ebpf.o"));

/// FNV-1a hash of [`OBJECT`], computed by build.rs.
pub fn object_hash() -> u64 {
    u64::from_str_radix(env!("SLUICE_EBPF_HASH"), 16).unwrap_or(0)
}

/// The TC programs and where each attaches on a pod's host veth.
const TC_PROGRAMS: [(&str, TcAttachType); 2] = [
    (prog_names::FROM_POD, TcAttachType::Ingress),
    (prog_names::TO_POD, TcAttachType::Egress),
];

/// Every program of the object: its name and whether it is XDP (else tc).
const ALL_PROGRAMS: [(&str, Kind); 10] = [
    (prog_names::FROM_POD, Kind::Tc),
    (prog_names::TO_POD, Kind::Tc),
    (prog_names::UPLINK_IN, Kind::Tc),
    (prog_names::UPLINK_OUT, Kind::Tc),
    (prog_names::UPLINK_XDP, Kind::Xdp),
    (prog_names::NAT_SWEEP, Kind::PerfEvent),
    (prog_names::HP_CONNECT4, Kind::SockAddr),
    (prog_names::HP_SENDMSG4, Kind::SockAddr),
    (prog_names::HP_RECVMSG4, Kind::SockAddr),
    (prog_names::HP_GETPEERNAME4, Kind::SockAddr),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tc,
    Xdp,
    PerfEvent,
    SockAddr,
}

/// Pin of the NAT sweeper's perf-event link.
const SWEEP_LINK: &str = "nat_sweep";
/// How often the sweeper runs (CPU clock of CPU 0, which ticks while idle too).
const SWEEP_PERIOD_NS: u64 = 1_000_000_000;

/// Prefix of the uplink's link pins (`uplink<ifindex>-<program>`); pod links start
/// with the host veth name (`sl...`), so the two never mix.
pub const UPLINK_LINK_PREFIX: &str = "uplink";

/// Key and value sizes each pinned map must have for this layout. aya reuses a
/// pinned map by name without comparing its shape, so the plugin does.
fn expected_maps() -> [(&'static str, usize, usize); 20] {
    use std::mem::size_of;
    [
        (
            map_names::ENDPOINTS,
            size_of::<IpKey>(),
            size_of::<Endpoint>(),
        ),
        (
            map_names::ENDPOINT_STATS,
            size_of::<u32>(),
            size_of::<EndpointStats>(),
        ),
        (
            map_names::ENDPOINT_INFO,
            size_of::<u32>(),
            size_of::<EndpointInfo>(),
        ),
        (map_names::META, size_of::<u32>(), size_of::<DatapathMeta>()),
        (map_names::COUNTERS, size_of::<u32>(), size_of::<u64>()),
        (map_names::CONFIG, size_of::<u32>(), size_of::<NodeConfig>()),
        (map_names::MASQ, size_of::<u32>(), size_of::<MasqConfig>()),
        (
            map_names::NON_MASQ,
            size_of::<LpmKey<[u8; 4]>>(),
            size_of::<u8>(),
        ),
        (
            map_names::NAT_FWD,
            size_of::<NatKey>(),
            size_of::<NatEntry>(),
        ),
        (map_names::NAT_REV, size_of::<NatKey>(), size_of::<NatRev>()),
        (
            map_names::NAT_FRAG,
            size_of::<FragKey>(),
            size_of::<FragEntry>(),
        ),
        (
            map_names::PORTS,
            size_of::<PortKey>(),
            size_of::<PortTarget>(),
        ),
        (map_names::HP_CT, size_of::<NatKey>(), size_of::<HpFlow>()),
        (map_names::NODE_ADDRS, 4, 1),
        (
            map_names::HP_SOCK,
            size_of::<SockKey>(),
            size_of::<SockOrig>(),
        ),
        (
            map_names::HP_CONFIG,
            size_of::<u32>(),
            size_of::<HostPortConfig>(),
        ),
        (map_names::BANDWIDTH, size_of::<u32>(), size_of::<BwState>()),
        // A ring buffer has no keys or values.
        (map_names::EVENTS, 0, 0),
        (map_names::MONITOR, size_of::<u32>(), size_of::<u64>()),
        (
            map_names::EP_DROPS,
            size_of::<EpDropKey>(),
            size_of::<u64>(),
        ),
    ]
}

pub(super) fn dp_err(op: impl Into<String>, e: impl std::fmt::Display) -> Error {
    Error::datapath(op, e)
}

pub(super) fn open_map(maps_dir: &Path, name: &str) -> Result<Map, Error> {
    let path = maps_dir.join(name);
    let data = MapData::from_pin(&path)
        .map_err(|e| dp_err(format!("open pinned map {}", path.display()), e))?;
    Map::from_map_data(data).map_err(|e| dp_err(format!("open pinned map {}", path.display()), e))
}

/// Reads the identity of the pinned datapath, `None` when nothing is pinned yet.
pub fn read_meta(maps_dir: &Path) -> Result<Option<DatapathMeta>, Error> {
    if !maps_dir.join(map_names::META).exists() {
        return Ok(None);
    }
    let map = open_map(maps_dir, map_names::META)?;
    let arr: Array<MapData, DatapathMeta> =
        Array::try_from(map).map_err(|e| dp_err("open sl_meta", e))?;
    let meta = arr.get(&0, 0).map_err(|e| dp_err("read sl_meta", e))?;
    // A zeroed entry: the maps were created by a load that did not finish.
    Ok(Some(meta).filter(|m| m.layout_version != 0))
}

fn write_meta(maps_dir: &Path, meta: DatapathMeta) -> Result<(), Error> {
    let map = open_map(maps_dir, map_names::META)?;
    let mut arr: Array<MapData, DatapathMeta> =
        Array::try_from(map).map_err(|e| dp_err("open sl_meta", e))?;
    arr.set(0, meta, 0).map_err(|e| dp_err("write sl_meta", e))
}

/// Refuses pinned maps whose key or value size differs from this layout.
pub fn check_pinned_maps(maps_dir: &Path) -> Result<(), Error> {
    for (name, key, value) in expected_maps() {
        let path = maps_dir.join(name);
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(&path)
            .map_err(|e| dp_err(format!("open pinned map {}", path.display()), e))?;
        let info = data
            .info()
            .map_err(|e| dp_err(format!("inspect pinned map {}", path.display()), e))?;
        if info.key_size() as usize != key || info.value_size() as usize != value {
            return Err(dp_err(
                format!("reuse pinned map {}", path.display()),
                format!(
                    "it has key/value sizes {}/{}, layout v{LAYOUT_VERSION} needs {key}/{value}; \
                     the pin root holds another map layout (remove it or migrate)",
                    info.key_size(),
                    info.value_size()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether every program is pinned.
pub fn programs_pinned(progs_dir: &Path) -> bool {
    ALL_PROGRAMS
        .iter()
        .all(|(name, _)| progs_dir.join(name).exists())
}

/// Fires `prog` once a second on CPU 0 through a perf event whose link is pinned:
/// the sweep runs with no process of ours alive.
fn attach_sweeper(prog: &mut PerfEvent, links_dir: &Path) -> Result<(), Error> {
    let lp = links_dir.join(SWEEP_LINK);
    unpin(&lp)?;
    let id = prog
        .attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu: 0 },
            SamplePolicy::Period(SWEEP_PERIOD_NS),
            false,
        )
        .map_err(|e| dp_err("attach the NAT sweeper to a CPU clock perf event", e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| dp_err("take the NAT sweeper link", e))?;
    let fd: FdLink = link
        .try_into()
        .map_err(|e| dp_err("NAT sweeper link is not a bpf_link", e))?;
    fd.pin(&lp)
        .map(drop)
        .map_err(|e| dp_err(format!("pin {}", lp.display()), e))
}

/// Whether the sweeper's link is pinned.
pub fn sweeper_attached(links_dir: &Path) -> bool {
    links_dir.join(SWEEP_LINK).exists()
}

/// Attaches the pinned sweeper program (after an upgrade from a datapath
/// without one, or when its link was removed).
pub fn ensure_sweeper(progs_dir: &Path, links_dir: &Path) -> Result<(), Error> {
    let mut prog = PerfEvent::from_pin(progs_dir.join(prog_names::NAT_SWEEP))
        .map_err(|e| dp_err("open pinned program nat_sweep", e))?;
    attach_sweeper(&mut prog, links_dir)
}

/// Loads the embedded object (reusing pinned maps), pins its programs, moves every
/// existing attachment to the new programs atomically (`bpf_link_update`), and
/// records the object's identity. Runs under the datapath's exclusive lock.
pub fn load_and_pin(
    maps_dir: &Path,
    progs_dir: &Path,
    links_dir: &Path,
    pod_ifnames: &[String],
    nat_flows: u32,
) -> Result<(), Error> {
    if OBJECT.is_empty() {
        return Err(dp_err(
            "load",
            "this sluice binary was built without its eBPF object; build it with `cargo xtask build`",
        ));
    }
    // Sizes only matter when the maps are created; pinned maps are reused as they are.
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(maps_dir)
        .map_max_entries(map_names::NAT_FWD, nat_flows)
        .map_max_entries(map_names::NAT_REV, nat_flows)
        .load(OBJECT)
        .map_err(|e| dp_err("load the eBPF object", e))?;
    for (name, kind) in ALL_PROGRAMS {
        let staged = progs_dir.join(format!("{name}-new"));
        unpin(&staged)?;
        let prog = ebpf
            .program_mut(name)
            .ok_or_else(|| dp_err("load", format!("program {name} missing from the object")))?;
        if kind == Kind::SockAddr {
            let prog: &mut CgroupSockAddr = prog
                .try_into()
                .map_err(|e| dp_err(format!("load {name}"), e))?;
            prog.load()
                .map_err(|e| dp_err(format!("verify and load {name}"), e))?;
            prog.pin(&staged)
                .map_err(|e| dp_err(format!("pin {}", staged.display()), e))?;
            let fd = prog
                .fd()
                .map_err(|e| dp_err(format!("fd of {name}"), e))?
                .as_fd()
                .as_raw_fd();
            for link_path in link_pins(links_dir, name)? {
                update_link(&link_path, fd)?;
            }
        } else if kind == Kind::PerfEvent {
            let prog: &mut PerfEvent = prog
                .try_into()
                .map_err(|e| dp_err(format!("load {name}"), e))?;
            prog.load()
                .map_err(|e| dp_err(format!("verify and load {name}"), e))?;
            prog.pin(&staged)
                .map_err(|e| dp_err(format!("pin {}", staged.display()), e))?;
            // Perf-event links cannot be updated in place: the new one replaces
            // the old (a second without sweeping at most).
            attach_sweeper(prog, links_dir)?;
        } else if kind == Kind::Xdp {
            let prog: &mut Xdp = prog
                .try_into()
                .map_err(|e| dp_err(format!("load {name}"), e))?;
            prog.load()
                .map_err(|e| dp_err(format!("verify and load {name}"), e))?;
            prog.pin(&staged)
                .map_err(|e| dp_err(format!("pin {}", staged.display()), e))?;
            for link_path in link_pins(links_dir, name)? {
                replace_xdp_link(prog, &link_path)?;
            }
        } else {
            let prog: &mut SchedClassifier = prog
                .try_into()
                .map_err(|e| dp_err(format!("load {name}"), e))?;
            prog.load()
                .map_err(|e| dp_err(format!("verify and load {name}"), e))?;
            prog.pin(&staged)
                .map_err(|e| dp_err(format!("pin {}", staged.display()), e))?;
            for link_path in link_pins(links_dir, name)? {
                replace_tc_link(prog, &link_path)?;
            }
            if let Some((_, attach_type)) = TC_PROGRAMS.iter().find(|(n, _)| *n == name) {
                for ifname in pod_ifnames {
                    replace_filter(prog, ifname, *attach_type);
                }
            }
        }
        // Readers (`attach`) open progs/<name>; the rename swaps it in one step.
        let final_path = progs_dir.join(name);
        fs::rename(&staged, &final_path).map_err(|e| {
            Error::io(
                format!("renaming {} to {}", staged.display(), final_path.display()),
                e,
            )
        })?;
    }
    write_meta(
        maps_dir,
        DatapathMeta {
            layout_version: LAYOUT_VERSION,
            _pad: 0,
            object_hash: object_hash(),
            loaded_unix: now_unix(),
        },
    )
}

/// bpf(2) with a zeroed `union bpf_attr` whose leading words are `words`
/// (aya does not expose the link commands Sluice needs).
fn bpf_cmd(cmd: libc::c_long, words: &[u64]) -> std::io::Result<i64> {
    let mut attr = [0u64; 16];
    attr[..words.len()].copy_from_slice(words);
    // SAFETY: a valid bpf_attr of the size passed; any pointer in `words` is the
    // caller's and outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// One attr word holding two `__u32` fields in memory order.
fn u32_pair(first: u32, second: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&first.to_ne_bytes());
    b[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(b)
}

/// A new fd of the BPF object pinned at `path` (BPF_OBJ_GET).
fn obj_get(path: &Path) -> Result<std::os::fd::OwnedFd, Error> {
    use std::os::unix::ffi::OsStrExt;
    const BPF_OBJ_GET: libc::c_long = 7;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| dp_err(format!("open pin {}", path.display()), e))?;
    // `pathname` is the first word of the attr.
    let fd = bpf_cmd(BPF_OBJ_GET, &[c.as_ptr() as u64])
        .map_err(|e| dp_err(format!("open pin {}", path.display()), e))?;
    // SAFETY: BPF_OBJ_GET returned a new fd that only this owns.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// Points the pinned link at program `prog_fd` in place (BPF_LINK_UPDATE; aya
/// has no update for cgroup links).
fn update_link(link_path: &Path, prog_fd: std::os::fd::RawFd) -> Result<(), Error> {
    const BPF_LINK_UPDATE: libc::c_long = 29;
    let link_fd = obj_get(link_path)?;
    // link_update: link_fd, new_prog_fd (u32 each, in the first word).
    let word = u32_pair(link_fd.as_raw_fd() as u32, prog_fd as u32);
    if let Err(e) = bpf_cmd(BPF_LINK_UPDATE, &[word]) {
        return drop_dead_link(link_path, &e);
    }
    Ok(())
}

/// Pinned links of program `prog` (`links/*-<prog>`).
fn link_pins(links_dir: &Path, prog: &str) -> Result<Vec<PathBuf>, Error> {
    let suffix = format!("-{prog}");
    let rd = match fs::read_dir(links_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", links_dir.display()), e)),
    };
    Ok(rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&suffix))
        })
        .collect())
}

/// Points the pinned tcx link at `prog` without detaching it (`bpf_link_update`).
/// A link whose interface is gone cannot be updated; its pin is dropped.
fn replace_tc_link(prog: &mut SchedClassifier, link_path: &Path) -> Result<(), Error> {
    let pinned = PinnedLink::from_pin(link_path)
        .map_err(|e| dp_err(format!("open pinned link {}", link_path.display()), e))?;
    let link: SchedClassifierLink = FdLink::from(pinned)
        .try_into()
        .map_err(|e| dp_err(format!("use pinned link {}", link_path.display()), e))?;
    match prog.attach_to_link(link) {
        // The pin keeps the link alive; taking it out of `prog` keeps the program's
        // drop from touching it.
        Ok(id) => prog
            .take_link(id)
            .map(drop)
            .map_err(|e| dp_err(format!("keep link {}", link_path.display()), e)),
        Err(e) => drop_dead_link(link_path, &e),
    }
}

/// The same for an XDP link.
fn replace_xdp_link(prog: &mut Xdp, link_path: &Path) -> Result<(), Error> {
    let pinned = PinnedLink::from_pin(link_path)
        .map_err(|e| dp_err(format!("open pinned link {}", link_path.display()), e))?;
    let link: XdpLink = FdLink::from(pinned)
        .try_into()
        .map_err(|e| dp_err(format!("use pinned link {}", link_path.display()), e))?;
    match prog.attach_to_link(link) {
        Ok(id) => prog
            .take_link(id)
            .map(drop)
            .map_err(|e| dp_err(format!("keep link {}", link_path.display()), e)),
        Err(e) => drop_dead_link(link_path, &e),
    }
}

/// A link that cannot be updated (ENOLINK: its interface went away) is dropped.
fn drop_dead_link(link_path: &Path, e: &dyn std::fmt::Display) -> Result<(), Error> {
    eprintln!(
        "sluice: dropping pinned link {} that cannot be updated: {e}",
        link_path.display()
    );
    unpin(link_path)
}

fn link_path(links_dir: &Path, host_ifname: &str, prog: &str) -> PathBuf {
    links_dir.join(format!("{host_ifname}-{prog}"))
}

/// Priority and handle of Sluice's cls_bpf filters on a pod's host veth: fixed, so
/// an upgrade can replace them in place and DEL can find them.
const FILTER_PRIORITY: u16 = 1;
const FILTER_HANDLE: TcHandle = TcHandle::new(0, 1);

/// Attaches the pod programs to `host_ifname` (resolved in this thread's
/// namespace, the node's) so that the attachment outlives this process:
/// - `Tc`: cls_bpf filters on a clsact qdisc, made through netlink. The qdisc
///   owns them; no grace period is waited for.
/// - `Tcx`: tcx links, pinned. Each first tcx attachment of a device and direction
///   waits for an RCU grace period (`tcx_entry_sync`), ~10 ms here.
pub fn attach(
    progs_dir: &Path,
    links_dir: &Path,
    host_ifname: &str,
    mode: PodAttach,
) -> Result<(), Error> {
    if mode == PodAttach::Tc {
        match qdisc_add_clsact(host_ifname) {
            Ok(()) => {}
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(dp_err(format!("add clsact qdisc to {host_ifname}"), e)),
        }
    }
    for (name, attach_type) in TC_PROGRAMS {
        let mut prog = SchedClassifier::from_pin(progs_dir.join(name))
            .map_err(|e| dp_err(format!("open pinned program {name}"), e))?;
        match mode {
            PodAttach::Tc => {
                let opts = TcAttachOptions::Netlink(NlOptions {
                    priority: FILTER_PRIORITY,
                    handle: FILTER_HANDLE,
                    classid: None,
                });
                let id = match prog.attach_with_options(host_ifname, attach_type, opts) {
                    Ok(id) => id,
                    // A filter of ours is already there (the programs of a
                    // datapath whose pins were lost): point it at this program
                    // in place (aya creates filters with NLM_F_EXCL).
                    Err(aya::programs::ProgramError::TcError(TcError::NetlinkError(e)))
                        if e.raw_os_error() == Some(libc::EEXIST) =>
                    {
                        let existing = SchedClassifierLink::attached(
                            host_ifname,
                            attach_type,
                            FILTER_PRIORITY,
                            FILTER_HANDLE,
                            None,
                        )
                        .map_err(|e| dp_err(format!("find {name} on {host_ifname}"), e))?;
                        prog.attach_to_link(existing)
                            .map_err(|e| dp_err(format!("replace {name} on {host_ifname}"), e))?
                    }
                    Err(e) => return Err(dp_err(format!("attach {name} to {host_ifname}"), e)),
                };
                let link = prog
                    .take_link(id)
                    .map_err(|e| dp_err(format!("take link of {name} on {host_ifname}"), e))?;
                // Dropping a netlink link would delete the filter; it must stay.
                std::mem::forget(link);
            }
            PodAttach::Tcx => {
                let lp = link_path(links_dir, host_ifname, name);
                // A pin left by a crashed ADD of the same attachment.
                detach_pinned_link(&lp)?;
                let id = prog
                    .attach(host_ifname, attach_type)
                    .map_err(|e| dp_err(format!("attach {name} to {host_ifname}"), e))?;
                let link = prog
                    .take_link(id)
                    .map_err(|e| dp_err(format!("take link of {name} on {host_ifname}"), e))?;
                pin_link(link, &lp)?;
            }
        }
    }
    Ok(())
}

/// Removes the pod programs from `host_ifname`, whichever way they were attached.
/// Missing pins, filters or interface are fine (DEL deletes the veth anyway).
pub fn detach(links_dir: &Path, host_ifname: &str) -> Result<(), Error> {
    let mut first_err = None;
    for (name, attach_type) in TC_PROGRAMS {
        if let Err(e) = unpin(&link_path(links_dir, host_ifname, name)) {
            first_err.get_or_insert(e);
        }
        if let Ok(link) = SchedClassifierLink::attached(
            host_ifname,
            attach_type,
            FILTER_PRIORITY,
            FILTER_HANDLE,
            None,
        ) {
            // ENOENT (no such filter, e.g. tcx mode) is expected here.
            let _ = Link::detach(link);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Kernel ids of the pinned pod programs: (name, ingress?, id).
pub fn pod_program_ids(progs_dir: &Path) -> Result<Vec<(&'static str, bool, u32)>, Error> {
    TC_PROGRAMS
        .iter()
        .map(|(name, at)| {
            let p = SchedClassifier::from_pin(progs_dir.join(name))
                .map_err(|e| dp_err(format!("open pinned program {name}"), e))?;
            let id = p
                .info()
                .map_err(|e| dp_err(format!("read info of {name}"), e))?
                .id();
            Ok((*name, *at == TcAttachType::Ingress, id))
        })
        .collect()
}

/// Whether the pod programs are attached to `host_ifname` through pinned tcx links
/// whose programs are attached to it (tcx query).
pub fn check_tcx_attached(links_dir: &Path, host_ifname: &str) -> Result<(), Error> {
    for (name, attach_type) in TC_PROGRAMS {
        let lp = link_path(links_dir, host_ifname, name);
        let pinned = PinnedLink::from_pin(&lp)
            .map_err(|e| Error::check(format!("pinned link {} is missing: {e}", lp.display())))?;
        let fd_link = FdLink::from(pinned);
        let info = fd_link
            .info()
            .map_err(|e| Error::check(format!("link {} unreadable: {e}", lp.display())))?;
        let (_, progs) = SchedClassifier::query_tcx(host_ifname, attach_type).map_err(|e| {
            Error::check(format!("cannot query tcx programs of {host_ifname}: {e}"))
        })?;
        if !progs.iter().any(|p| p.id() == info.program_id()) {
            return Err(Error::check(format!(
                "{name} (program id {}) is not attached to {host_ifname}",
                info.program_id()
            )));
        }
    }
    Ok(())
}

/// Points Sluice's cls_bpf filter on `host_ifname` at `prog` in place (netlink
/// replace of the same priority and handle: no packet sees no filter). A veth
/// without that filter (tcx mode, or gone) is skipped.
fn replace_filter(prog: &mut SchedClassifier, host_ifname: &str, attach_type: TcAttachType) {
    let Ok(link) = SchedClassifierLink::attached(
        host_ifname,
        attach_type,
        FILTER_PRIORITY,
        FILTER_HANDLE,
        None,
    ) else {
        return;
    };
    if let Ok(id) = prog.attach_to_link(link) {
        if let Ok(l) = prog.take_link(id) {
            std::mem::forget(l);
        }
    }
}

/// Takes every program of the datapath off the kernel's hooks: the pods' tc
/// programs (`pod_ifnames`) and every pinned link (uplink tc and XDP, hostPort
/// socket hooks, NAT sweeper). Maps and programs stay pinned. Returns what was
/// detached.
pub fn detach_all(links_dir: &Path, pod_ifnames: &[String]) -> Result<Vec<String>, Error> {
    let mut gone = Vec::new();
    let present: Vec<&String> = pod_ifnames
        .iter()
        .filter(|n| {
            // (Not /sys/class/net: sysfs shows the namespace of whoever mounted it.)
            std::ffi::CString::new(n.as_str())
                // SAFETY: a valid NUL-terminated name.
                .is_ok_and(|c| unsafe { libc::if_nametoindex(c.as_ptr()) } != 0)
        })
        .collect();
    // Host veths live in the node's namespace: from anywhere else nothing
    // would be found, and nothing must be claimed.
    if present.is_empty() && !pod_ifnames.is_empty() {
        return Err(dp_err(
            "detach the pod programs",
            format!(
                "none of the pod interfaces ({}) is in this network namespace; run it in the node's",
                pod_ifnames.join(", ")
            ),
        ));
    }
    for ifname in pod_ifnames {
        if present.contains(&ifname) {
            detach(links_dir, ifname)?;
            gone.push(format!("pod interface {ifname}"));
        } else {
            gone.push(format!("pod interface {ifname}: not found (skipped)"));
        }
    }
    let mut pins: Vec<PathBuf> = std::fs::read_dir(links_dir)
        .map_err(|e| Error::io(format!("list {}", links_dir.display()), e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    pins.sort();
    for p in pins {
        detach_pinned_link(&p)?;
        gone.push(format!(
            "link {}",
            p.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    Ok(gone)
}

/// How the uplink's XDP program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttached {
    Native,
    Generic,
    Off,
}

/// Detaches the link pinned at `path` now and removes the pin. Removing a pin
/// alone drops the link's reference only after an RCU grace period (bpffs frees
/// its inodes with call_rcu), so a new attachment made right after would find the
/// old one still there (tcx: EEXIST, XDP: EBUSY). aya does not expose the link fd
/// or BPF_LINK_DETACH, hence the two raw bpf(2) calls.
fn detach_pinned_link(path: &Path) -> Result<(), Error> {
    const BPF_LINK_DETACH: libc::c_long = 34;
    if !path.exists() {
        return Ok(());
    }
    if let Ok(fd) = obj_get(path) {
        // `link_fd` is the first word of the attr.
        if let Err(e) = bpf_cmd(BPF_LINK_DETACH, &[u32_pair(fd.as_raw_fd() as u32, 0)]) {
            eprintln!(
                "sluice: BPF_LINK_DETACH of {} failed ({e}); the pin's removal releases it",
                path.display()
            );
        }
    }
    unpin(path)
}

fn uplink_link_path(links_dir: &Path, ifindex: u32, prog: &str) -> PathBuf {
    links_dir.join(format!("{UPLINK_LINK_PREFIX}{ifindex}-{prog}"))
}

/// Whether the uplink's tc program is attached (its link pin exists).
pub fn uplink_attached(links_dir: &Path, ifindex: u32) -> bool {
    [prog_names::UPLINK_IN, prog_names::UPLINK_OUT]
        .iter()
        .all(|p| uplink_link_path(links_dir, ifindex, p).exists())
}

/// Attaches `uplink_in` (tcx ingress), `uplink_out` (tcx egress) and, unless `xdp`
/// is off, `uplink_xdp` to the uplink. Native XDP falls back to generic when the driver refuses it; an XDP
/// failure leaves tc alone to do the job. Returns how XDP ended up.
pub fn attach_uplink(
    progs_dir: &Path,
    links_dir: &Path,
    ifname: &str,
    ifindex: u32,
    xdp: crate::cni::config::XdpMode,
) -> Result<XdpAttached, Error> {
    for (name, hook) in [
        (prog_names::UPLINK_IN, TcAttachType::Ingress),
        (prog_names::UPLINK_OUT, TcAttachType::Egress),
    ] {
        let lp = uplink_link_path(links_dir, ifindex, name);
        // Already attached to this interface (the pin name carries the ifindex):
        // keep it; upgrades replace its program in place.
        if lp.exists() {
            continue;
        }
        let mut tc = SchedClassifier::from_pin(progs_dir.join(name))
            .map_err(|e| dp_err(format!("open pinned program {name}"), e))?;
        let id = tc
            .attach(ifname, hook)
            .map_err(|e| dp_err(format!("attach {name} to {ifname}"), e))?;
        pin_link(
            tc.take_link(id)
                .map_err(|e| dp_err(format!("take {name} link"), e))?,
            &lp,
        )?;
    }

    attach_uplink_xdp(progs_dir, links_dir, ifname, ifindex, xdp)
}

/// The XDP half of [`attach_uplink`].
fn attach_uplink_xdp(
    progs_dir: &Path,
    links_dir: &Path,
    ifname: &str,
    ifindex: u32,
    xdp: crate::cni::config::XdpMode,
) -> Result<XdpAttached, Error> {
    // Any XDP link of an earlier mode goes first (also when XDP is now off).
    let lp = uplink_link_path(links_dir, ifindex, prog_names::UPLINK_XDP);
    detach_pinned_link(&lp)?;
    let mode = match xdp {
        crate::cni::config::XdpMode::Native | crate::cni::config::XdpMode::Auto => XdpMode::Driver,
        crate::cni::config::XdpMode::Generic => XdpMode::Skb,
        crate::cni::config::XdpMode::Off => return Ok(XdpAttached::Off),
    };
    let mut prog = Xdp::from_pin(
        progs_dir.join(prog_names::UPLINK_XDP),
        XdpAttachType::Interface,
    )
    .map_err(|e| dp_err("open pinned program uplink_xdp", e))?;
    let mut tries = vec![mode];
    if mode == XdpMode::Driver {
        tries.push(XdpMode::Skb);
    }
    for m in tries {
        match prog.attach(ifname, m) {
            Ok(id) => {
                let link = prog
                    .take_link(id)
                    .map_err(|e| dp_err("take uplink_xdp link", e))?;
                let fd: FdLink = link.try_into().map_err(|e| {
                    dp_err(format!("uplink_xdp link on {ifname} is not a bpf_link"), e)
                })?;
                fd.pin(&lp)
                    .map_err(|e| dp_err(format!("pin {}", lp.display()), e))?;
                return Ok(if m == XdpMode::Skb {
                    XdpAttached::Generic
                } else {
                    XdpAttached::Native
                });
            }
            Err(e) => eprintln!("sluice: XDP ({m:?} mode) on {ifname} failed: {e}"),
        }
    }
    eprintln!("sluice: no XDP on {ifname}; the tc program handles uplink traffic alone");
    Ok(XdpAttached::Off)
}

fn pin_link(link: SchedClassifierLink, path: &Path) -> Result<(), Error> {
    let fd: FdLink = link
        .try_into()
        .map_err(|e| dp_err(format!("link for {}", path.display()), e))?;
    fd.pin(path)
        .map(drop)
        .map_err(|e| dp_err(format!("pin {}", path.display()), e))
}

/// Writes one slot of `sl_monitor` (see `sluice_common::monitor_slot`). A
/// datapath loaded before the map existed has none: nothing to switch.
pub fn write_monitor_slot(maps_dir: &Path, slot: u32, value: u64) -> Result<(), Error> {
    if !maps_dir.join(map_names::MONITOR).exists() {
        return Ok(());
    }
    let mut arr: Array<MapData, u64> = Array::try_from(open_map(maps_dir, map_names::MONITOR)?)
        .map_err(|e| dp_err("open sl_monitor", e))?;
    if arr.get(&slot, 0).ok() == Some(value) {
        return Ok(());
    }
    arr.set(slot, value, 0)
        .map_err(|e| dp_err("write sl_monitor", e))
}

/// The node settings the programs read.
pub fn read_config(maps_dir: &Path) -> Result<NodeConfig, Error> {
    let arr: Array<MapData, NodeConfig> = Array::try_from(open_map(maps_dir, map_names::CONFIG)?)
        .map_err(|e| dp_err("open sl_config", e))?;
    arr.get(&0, 0).map_err(|e| dp_err("read sl_config", e))
}

/// Writes the node settings the programs read.
pub fn write_config(maps_dir: &Path, cfg: NodeConfig) -> Result<(), Error> {
    let mut arr: Array<MapData, NodeConfig> =
        Array::try_from(open_map(maps_dir, map_names::CONFIG)?)
            .map_err(|e| dp_err("open sl_config", e))?;
    arr.set(0, cfg, 0).map_err(|e| dp_err("write sl_config", e))
}

/// The per-reason counters summed over CPUs, by index.
pub fn counters(maps_dir: &Path) -> Result<Vec<u64>, Error> {
    let arr: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(open_map(maps_dir, map_names::COUNTERS)?)
            .map_err(|e| dp_err("open sl_counters", e))?;
    (0..reason::NAMES.len() as u32)
        .map(|i| {
            arr.get(&i, 0)
                .map(|v| v.iter().sum())
                .map_err(|e| dp_err("read sl_counters", e))
        })
        .collect()
}

/// Writes the masquerade settings the programs read.
pub fn write_masq(maps_dir: &Path, mut cfg: MasqConfig) -> Result<(), Error> {
    let mut arr: Array<MapData, MasqConfig> = Array::try_from(open_map(maps_dir, map_names::MASQ)?)
        .map_err(|e| dp_err("open sl_masq", e))?;
    let old = arr.get(&0, 0).unwrap_or_default();
    // A new address: flows opened before keep theirs and still get replies
    // (`prev_addr`); flows of any older one are dropped from the maps.
    let changed = old.flags & masq_flags::ENABLED != 0 && old.addr != cfg.addr;
    if cfg.flags & masq_flags::ENABLED != 0 {
        cfg.prev_addr = if changed { old.addr } else { old.prev_addr };
        if cfg.prev_addr == cfg.addr {
            cfg.prev_addr = [0; 4];
        }
    }
    if old == cfg {
        return Ok(());
    }
    arr.set(0, cfg, 0).map_err(|e| dp_err("write sl_masq", e))?;
    if changed && cfg.flags & masq_flags::ENABLED != 0 {
        let keep = [cfg.addr, cfg.prev_addr];
        flush_nat_matching(maps_dir, |_, e| {
            e.flags & nat_flags::INBOUND == 0 && !keep.contains(&e.nat_addr)
        })?;
    }
    Ok(())
}

/// Makes the non-masquerade trie hold exactly `cidrs`: new prefixes are added
/// before stale ones go, so traffic inside the cluster range is never masqueraded
/// while it changes.
pub fn set_non_masq(maps_dir: &Path, cidrs: &[(u32, [u8; 4])]) -> Result<(), Error> {
    let mut trie: LpmTrie<MapData, [u8; 4], u8> =
        LpmTrie::try_from(open_map(maps_dir, map_names::NON_MASQ)?)
            .map_err(|e| dp_err("open sl_nonmasq", e))?;
    let have: Vec<LpmKey<[u8; 4]>> = trie.keys().filter_map(Result::ok).collect();
    for (len, addr) in cidrs {
        let k = LpmKey::new(*len, *addr);
        if !have
            .iter()
            .any(|h| h.prefix_len() == *len && h.data() == *addr)
        {
            trie.insert(&k, 1, 0).map_err(|e| {
                dp_err(
                    format!(
                        "add {}/{len} to sl_nonmasq",
                        std::net::Ipv4Addr::from(*addr)
                    ),
                    e,
                )
            })?;
        }
    }
    for h in have {
        if !cidrs
            .iter()
            .any(|(len, addr)| h.prefix_len() == *len && h.data() == *addr)
        {
            let _ = trie.remove(&h);
        }
    }
    Ok(())
}

/// Deletes the masqueraded flows of pod addresses `ips` (both directions).
/// Returns how many flows went.
pub fn flush_nat(maps_dir: &Path, ips: &[[u8; 4]]) -> Result<usize, Error> {
    flush_frags(maps_dir, ips)?;
    flush_nat_matching(maps_dir, |k, _| ips.contains(&k.src_ip))
}

/// Deletes the fragment entries of datagrams from or to `ips`, so none can
/// reach a later pod with a reused address.
fn flush_frags(maps_dir: &Path, ips: &[[u8; 4]]) -> Result<(), Error> {
    if !maps_dir.join(map_names::NAT_FRAG).exists() {
        return Ok(());
    }
    let mut frags: HashMap<MapData, FragKey, FragEntry> =
        HashMap::try_from(open_map(maps_dir, map_names::NAT_FRAG)?)
            .map_err(|e| dp_err("open sl_nat_frag", e))?;
    let doomed: Vec<FragKey> = frags
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, e)| ips.contains(&k.src_ip) || ips.contains(&e.addr))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        let _ = frags.remove(k);
    }
    Ok(())
}

/// Deletes the flows `doomed` picks, each with its reverse entry (made with the
/// flow's own address; inbound flows have none).
fn flush_nat_matching(
    maps_dir: &Path,
    doomed: impl Fn(&NatKey, &NatEntry) -> bool,
) -> Result<usize, Error> {
    if !maps_dir.join(map_names::NAT_FWD).exists() {
        return Ok(0);
    }
    let mut fwd: HashMap<MapData, NatKey, NatEntry> =
        HashMap::try_from(open_map(maps_dir, map_names::NAT_FWD)?)
            .map_err(|e| dp_err("open sl_nat_fwd", e))?;
    let mut rev: HashMap<MapData, NatKey, NatRev> =
        HashMap::try_from(open_map(maps_dir, map_names::NAT_REV)?)
            .map_err(|e| dp_err("open sl_nat_rev", e))?;
    let doomed: Vec<(NatKey, NatEntry)> = fwd
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, e)| doomed(k, e))
        .collect();
    for (k, e) in &doomed {
        if e.flags & nat_flags::INBOUND == 0 {
            let _ = rev.remove(&k.reverse(e.nat_addr, e.nat_port));
        }
        let _ = fwd.remove(k);
    }
    Ok(doomed.len())
}

/// The pinned maps the plugin writes.
pub struct Maps {
    endpoints: HashMap<MapData, IpKey, Endpoint>,
    stats: PerCpuHashMap<MapData, u32, EndpointStats>,
    info: HashMap<MapData, u32, EndpointInfo>,
    /// Where `sl_ep_drops` is opened, by removals only (ADD never needs it).
    maps_dir: PathBuf,
}

impl Maps {
    pub fn open(maps_dir: &Path) -> Result<Self, Error> {
        let endpoints = HashMap::try_from(open_map(maps_dir, map_names::ENDPOINTS)?)
            .map_err(|e| dp_err("open sl_endpoints", e))?;
        let stats = PerCpuHashMap::try_from(open_map(maps_dir, map_names::ENDPOINT_STATS)?)
            .map_err(|e| dp_err("open sl_ep_stats", e))?;
        let info = HashMap::try_from(open_map(maps_dir, map_names::ENDPOINT_INFO)?)
            .map_err(|e| dp_err("open sl_ep_info", e))?;
        Ok(Self {
            endpoints,
            stats,
            info,
            maps_dir: maps_dir.to_path_buf(),
        })
    }

    /// Adds the per-interface entries (zeroed counters, owner).
    pub fn insert_interface(&mut self, ifindex: u32, info: &EndpointInfo) -> Result<(), Error> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::io("counting CPUs", e))?;
        let zero = PerCpuValues::try_from(vec![EndpointStats::default(); cpus])
            .map_err(|e| dp_err("build per-CPU counters", e))?;
        self.stats
            .insert(ifindex, zero, 0)
            .map_err(|e| dp_err(format!("insert counters of ifindex {ifindex}"), e))?;
        self.info
            .insert(ifindex, *info, 0)
            .map_err(|e| dp_err(format!("insert owner of ifindex {ifindex}"), e))
    }

    pub fn insert_endpoint(&mut self, key: IpKey, ep: Endpoint) -> Result<(), Error> {
        self.endpoints
            .insert(key, ep, 0)
            .map_err(|e| dp_err("insert endpoint", e))
    }

    pub fn endpoint(&self, key: &IpKey) -> Option<Endpoint> {
        self.endpoints.get(key, 0).ok()
    }

    pub fn endpoints(&self) -> Vec<(IpKey, Endpoint)> {
        self.endpoints.iter().filter_map(Result::ok).collect()
    }

    pub fn interfaces(&self) -> Vec<(u32, EndpointInfo)> {
        self.info.iter().filter_map(Result::ok).collect()
    }

    pub fn has_counters(&self, ifindex: u32) -> bool {
        self.stats.get(&ifindex, 0).is_ok()
    }

    /// Removes an endpoint address; a missing one is fine.
    pub fn remove_endpoint(&mut self, key: &IpKey) -> Result<(), Error> {
        match self.endpoints.remove(key) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(dp_err("remove endpoint", e)),
        }
    }

    /// Removes the per-interface entries; missing ones are fine.
    pub fn remove_interface(&mut self, ifindex: u32) -> Result<(), Error> {
        let a = match self.stats.remove(&ifindex) {
            Err(e) if !is_not_found(&e) => Err(dp_err("remove counters", e)),
            _ => Ok(()),
        };
        let b = match self.info.remove(&ifindex) {
            Err(e) if !is_not_found(&e) => Err(dp_err("remove owner", e)),
            _ => Ok(()),
        };
        // Its drop counters: one key per reason (the programs insert them). A
        // datapath loaded before per-endpoint drop counters existed has none.
        let c = if self.maps_dir.join(map_names::EP_DROPS).exists() {
            PerCpuHashMap::<_, EpDropKey, u64>::try_from(open_map(
                &self.maps_dir,
                map_names::EP_DROPS,
            )?)
            .map_err(|e| dp_err("open sl_ep_drops", e))
            .map(|mut drops| {
                for r in 0..reason::MAX {
                    let _ = drops.remove(&EpDropKey { ifindex, reason: r });
                }
            })
        } else {
            Ok(())
        };
        a.and(b).and(c)
    }
}

fn is_not_found(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether this binary carries an eBPF object.
pub fn has_object() -> bool {
    !OBJECT.is_empty()
}
