//! Looking at what the plugin made: links, addresses, routes and neighbours with
//! `ip -j`, tcx links with `bpftool -j`, files in state directories.
use std::{fs, path::Path};

use serde_json::Value;

use crate::{err, exec, Result};

pub use sluice_testbed::netns::listening;

/// Runs `ip -n <netns> -j args...` and parses its JSON.
pub fn ip_json(netns: &str, args: &[&str]) -> Result<Vec<Value>> {
    let mut all = vec!["-n", netns, "-j"];
    all.extend_from_slice(args);
    let out = exec::tool(None, "ip", &all)?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_str(&out)?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("ip {} printed no JSON array: {out}", all.join(" ")))
}

/// Every link of `netns`, with details (`linkinfo.info_kind`, peer index).
pub fn links(netns: &str) -> Result<Vec<Value>> {
    ip_json(netns, &["-d", "link", "show"])
}

/// Names of every link of `netns`, in `ip`'s order.
pub fn link_names(netns: &str) -> Result<Vec<String>> {
    Ok(links(netns)?
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect())
}

/// The link `name` of `netns`, if it exists.
pub fn link(netns: &str, name: &str) -> Result<Option<Value>> {
    Ok(links(netns)?
        .into_iter()
        .find(|l| l["ifname"].as_str() == Some(name)))
}

/// The kind of a link (`veth`, `dummy`, ...) from `ip -d`.
pub fn kind(link: &Value) -> Option<&str> {
    link["linkinfo"]["info_kind"].as_str()
}

/// Whether a link is administratively up.
pub fn is_up(link: &Value) -> bool {
    link["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("UP")))
}

/// Addresses of `dev` in `netns` as `ip/prefix`, in `ip`'s order.
pub fn addrs(netns: &str, dev: &str) -> Result<Vec<String>> {
    let v = ip_json(netns, &["addr", "show", "dev", dev])?;
    Ok(v.iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| {
            Some(format!(
                "{}/{}",
                a["local"].as_str()?,
                a["prefixlen"].as_u64()?
            ))
        })
        .collect())
}

/// IPv4 routes of the main table of `netns`.
pub fn routes4(netns: &str) -> Result<Vec<Value>> {
    ip_json(netns, &["-4", "route", "show"])
}

/// The route to `dst` (as `ip` prints it: `default`, `10.1.0.0/24`, `10.1.0.1`).
pub fn route<'a>(routes: &'a [Value], dst: &str) -> Option<&'a Value> {
    routes.iter().find(|r| r["dst"].as_str() == Some(dst))
}

/// Neighbour entries of `dev` in `netns`.
pub fn neighbours(netns: &str, dev: &str) -> Result<Vec<Value>> {
    ip_json(netns, &["neigh", "show", "dev", dev])
}

/// Whether `neigh` is a permanent entry `ip` -> `mac`.
pub fn is_permanent_neighbour(neigh: &[Value], ip: &str, mac: &str) -> bool {
    neigh.iter().any(|n| {
        n["dst"].as_str() == Some(ip)
            && n["lladdr"]
                .as_str()
                .is_some_and(|m| m.eq_ignore_ascii_case(mac))
            && n["state"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x.as_str() == Some("PERMANENT")))
    })
}

/// A sysctl of `netns` (e.g. `net/ipv4/ip_forward`).
pub fn sysctl(netns: &Path, key: &str) -> Result<String> {
    let path = format!("/proc/sys/{key}");
    exec::tool(Some(netns), "cat", &[&path]).map(|s| s.trim().to_string())
}

/// `bpftool link show -j`: every BPF link of the machine. A link released while
/// bpftool walks the list (another test's, EAGAIN "can't get link by id") makes
/// it print an `error` entry and exit 255: that link is gone, so it is left out.
pub fn bpf_links() -> Result<Vec<Value>> {
    let out = exec::run(
        None,
        Path::new("bpftool"),
        &["link", "show", "-j"],
        &[],
        b"",
    )?;
    let listed = serde_json::from_str::<Value>(&out.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned());
    match listed {
        Some(links) if out.success() || links.iter().any(|l| l.get("error").is_some()) => Ok(links
            .into_iter()
            .filter(|l| l.get("error").is_none())
            .collect()),
        _ => Err(err!("bpftool link show: {out}")),
    }
}

/// `bpftool link show pinned <pin> -j`: the link a pin holds.
pub fn bpf_link_pinned(pin: &Path) -> Result<Value> {
    let p = pin.display().to_string();
    let out = exec::tool(None, "bpftool", &["link", "show", "pinned", &p, "-j"])?;
    Ok(serde_json::from_str(&out)?)
}

/// The `cls_bpf` filters on `dev`'s ingress (`true`) or egress hook in `netns`
/// (`tc -j filter show`): (program name, program id).
pub fn tc_bpf_filters(netns: &Path, dev: &str, ingress: bool) -> Result<Vec<(String, u64)>> {
    let hook = if ingress { "ingress" } else { "egress" };
    let out = exec::tool(
        Some(netns),
        "tc",
        &["-j", "filter", "show", "dev", dev, hook],
    )?;
    bpf_filters_of(&out)
}

/// (program name, id) of each `cls_bpf` filter in `tc -j filter show` output.
pub fn bpf_filters_of(out: &str) -> Result<Vec<(String, u64)>> {
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_str(out)?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    let prog = &f["options"]["prog"];
                    Some((prog["name"].as_str()?.to_string(), prog["id"].as_u64()?))
                })
                .collect()
        })
        .unwrap_or_default())
}

/// `bpftool prog show pinned <pin> -j`: the id of a pinned program.
pub fn pinned_prog_id(pin: &Path) -> Result<u64> {
    let p = pin.display().to_string();
    let out = exec::tool(None, "bpftool", &["prog", "show", "pinned", &p, "-j"])?;
    let v: Value = serde_json::from_str(&out)?;
    v["id"]
        .as_u64()
        .ok_or_else(|| err!("bpftool printed no id for {p}: {out}"))
}

/// `bpftool prog show id <id> -j`.
pub fn bpf_prog(id: u64) -> Result<Value> {
    let id = id.to_string();
    let out = exec::tool(None, "bpftool", &["prog", "show", "id", &id, "-j"])?;
    Ok(serde_json::from_str(&out)?)
}

/// File names in `dir`, sorted; a missing directory has none.
pub fn files(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err!("listing {}: {e}", dir.display())),
    };
    let mut v: Vec<String> = rd
        .filter_map(std::result::Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    Ok(v)
}

/// What the kernel says about a pinned tcx link (`BPF_OBJ_GET_INFO_BY_FD`).
/// Debian's bpftool 7.1 predates tcx and prints neither the interface nor the
/// direction of these links, so the harness asks the kernel itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcxLink {
    pub id: u32,
    pub prog_id: u32,
    /// Index of the interface in its namespace.
    pub ifindex: u32,
    /// `true`: `BPF_TCX_INGRESS`, `false`: `BPF_TCX_EGRESS`.
    pub ingress: bool,
}

/// `BPF_LINK_TYPE_TCX` (include/uapi/linux/bpf.h).
const BPF_LINK_TYPE_TCX: u32 = 11;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
const BPF_LINK_TYPE_NETKIT: u32 = 13;
const BPF_NETKIT_PRIMARY: u32 = 54;
const BPF_NETKIT_PEER: u32 = 55;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `union bpf_attr` for `BPF_OBJ_GET`.
#[repr(C, align(8))]
#[derive(Default)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C, align(8))]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_link_info` up to the tcx member of its union (at offset 16).
#[repr(C, align(8))]
#[derive(Default)]
struct LinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    tcx_ifindex: u32,
    tcx_attach_type: u32,
    _rest: [u64; 6],
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    let size = std::mem::size_of::<T>();
    // SAFETY: `attr` is a live, writable `#[repr(C)]` prefix of `union bpf_attr`
    // of `size` bytes; the kernel reads and writes at most that many.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `union bpf_attr` for `BPF_PROG_QUERY`.
#[repr(C, align(8))]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    _rest: [u64; 4],
}

const BPF_PROG_QUERY: libc::c_long = 16;

/// The cgroup `sock_addr` attach types of the hostPort hooks: connect4,
/// sendmsg4, recvmsg4, getpeername4 (include/uapi/linux/bpf.h).
const SOCK_ADDR_ATTACH_TYPES: [u32; 4] = [10, 14, 19, 29];

/// Names of the programs attached to cgroup `dir` at the hostPort hooks'
/// attach types (not inherited ones), through `BPF_PROG_QUERY`: `bpftool
/// cgroup show` gives up on kernels that lack attach types it knows.
pub fn cgroup_sock_programs(dir: &Path) -> Result<std::collections::BTreeSet<String>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir).map_err(|e| err!("open {}: {e}", dir.display()))?;
    let mut names = std::collections::BTreeSet::new();
    for t in SOCK_ADDR_ATTACH_TYPES {
        let mut ids = [0u32; 16];
        let mut q = QueryAttr {
            target_fd: u32::try_from(f.as_raw_fd()).unwrap_or(u32::MAX),
            attach_type: t,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: 16,
            ..Default::default()
        };
        bpf(BPF_PROG_QUERY, &mut q).map_err(|e| err!("BPF_PROG_QUERY {}: {e}", dir.display()))?;
        for id in &ids[..q.prog_cnt.min(16) as usize] {
            if let Some(n) = bpf_prog(u64::from(*id))?["name"].as_str() {
                names.insert(n.to_string());
            }
        }
    }
    Ok(names)
}

/// Opens the link pinned at `pin` and reads its tcx attachment.
pub fn tcx_link(pin: &Path) -> Result<TcxLink> {
    let info = read_link_info(pin)?;
    if info.link_type != BPF_LINK_TYPE_TCX {
        return Err(err!(
            "{} is a link of type {}, not tcx ({BPF_LINK_TYPE_TCX})",
            pin.display(),
            info.link_type
        ));
    }
    let ingress = match info.tcx_attach_type {
        BPF_TCX_INGRESS => true,
        BPF_TCX_EGRESS => false,
        t => return Err(err!("{} has attach type {t}", pin.display())),
    };
    Ok(TcxLink {
        id: info.id,
        prog_id: info.prog_id,
        ifindex: info.tcx_ifindex,
        ingress,
    })
}

/// What the kernel says about a pinned netkit link: (link id, program id,
/// ifindex of the primary device, `true` for the peer hook `BPF_NETKIT_PEER`,
/// `false` for the primary's own). Its `bpf_link_info` member has the tcx
/// layout (ifindex, attach type).
pub fn netkit_link(pin: &Path) -> Result<(u32, u32, u32, bool)> {
    let info = read_link_info(pin)?;
    if info.link_type != BPF_LINK_TYPE_NETKIT {
        return Err(err!(
            "{} is a link of type {}, not netkit ({BPF_LINK_TYPE_NETKIT})",
            pin.display(),
            info.link_type
        ));
    }
    let peer = match info.tcx_attach_type {
        BPF_NETKIT_PEER => true,
        BPF_NETKIT_PRIMARY => false,
        t => return Err(err!("{} has attach type {t}", pin.display())),
    };
    Ok((info.id, info.prog_id, info.tcx_ifindex, peer))
}

/// Opens the BPF object (map, program, link) pinned at `pin` (`BPF_OBJ_GET`,
/// read-write).
pub fn bpf_obj_get(pin: &Path) -> Result<std::os::fd::OwnedFd> {
    use std::os::{fd::FromRawFd, unix::ffi::OsStrExt};
    let c_path = std::ffi::CString::new(pin.as_os_str().as_bytes())
        .map_err(|e| err!("{}: {e}", pin.display()))?;
    let mut get = ObjGetAttr {
        pathname: c_path.as_ptr() as u64,
        ..Default::default()
    };
    let fd = bpf(BPF_OBJ_GET, &mut get).map_err(|e| err!("BPF_OBJ_GET {}: {e}", pin.display()))?;
    let fd = i32::try_from(fd).map_err(|_| err!("BPF_OBJ_GET returned fd {fd}"))?;
    // SAFETY: the kernel just returned this descriptor to us; OwnedFd closes it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Opens the link pinned at `pin` and reads what the kernel says about it.
fn read_link_info(pin: &Path) -> Result<LinkInfo> {
    let fd = bpf_obj_get(pin)?;
    let mut info = LinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap_or(u32::MAX),
        info_len: u32::try_from(std::mem::size_of::<LinkInfo>()).unwrap_or(0),
        info: std::ptr::from_mut(&mut info) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)
        .map_err(|e| err!("BPF_OBJ_GET_INFO_BY_FD {}: {e}", pin.display()))?;
    Ok(info)
}

/// The IP counters of the namespace at `netns` (`/proc/net/snmp` read through
/// `nsenter --net=`, whose procfs shows the namespace of the reader): IPv4 ones
/// as `Ip.ForwDatagrams`, `Icmp.InMsgs`, ..., and the IPv6 ones of
/// `/proc/net/snmp6` under their own names (`Ip6OutForwDatagrams`, ...).
pub fn snmp(netns: &Path) -> Result<std::collections::BTreeMap<String, u64>> {
    let mut m = std::collections::BTreeMap::new();
    // `netstat` has the `TcpExt` group (PAWS, SYN retransmissions), in the
    // same two-line format.
    let v4 = exec::tool(Some(netns), "cat", &["/proc/net/snmp", "/proc/net/netstat"])?;
    let lines: Vec<&str> = v4.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (Some((group, names)), Some((_, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<i64>() {
                m.insert(format!("{group}.{n}"), u64::try_from(v).unwrap_or(0));
            }
        }
    }
    // Absent when IPv6 is disabled.
    if let Ok(v6) = exec::tool(Some(netns), "cat", &["/proc/net/snmp6"]) {
        for l in v6.lines() {
            let mut f = l.split_whitespace();
            if let (Some(n), Some(v)) = (f.next(), f.next()) {
                if let Ok(v) = v.parse::<u64>() {
                    m.insert(n.to_string(), v);
                }
            }
        }
    }
    if !m.contains_key("Ip.ForwDatagrams") {
        return Err(err!("no Ip ForwDatagrams in /proc/net/snmp: {v4}"));
    }
    Ok(m)
}

/// The ifindex of `dev` in `netns`.
pub fn ifindex(netns: &str, dev: &str) -> Result<u64> {
    link(netns, dev)?
        .and_then(|l| l["ifindex"].as_u64())
        .ok_or_else(|| err!("no interface {dev} in {netns}"))
}

/// The MAC address of `dev` in `netns`, as `ip` prints it (lower case).
pub fn mac(netns: &str, dev: &str) -> Result<String> {
    link(netns, dev)?
        .and_then(|l| l["address"].as_str().map(str::to_string))
        .ok_or_else(|| err!("no interface {dev} in {netns}"))
}

/// (link id, program id) of the BPF link pinned at `pin`, asked from the kernel
/// (`BPF_OBJ_GET_INFO_BY_FD`; works for every link type, tcx and XDP alike).
pub fn pinned_link_ids(pin: &Path) -> Result<(u32, u32)> {
    let info = read_link_info(pin)?;
    Ok((info.id, info.prog_id))
}
