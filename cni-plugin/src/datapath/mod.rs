//! The eBPF datapath of one network, behind a narrow interface: load once per node,
//! attach to each pod's host veth, keep the endpoint maps in step with the pods.
//! All aya calls are in [`bpf`].
mod bpf;
pub mod bpffs;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use sluice_common::{
    endpoint_flags, pin_dirs, to_cbuf, DatapathMeta, Endpoint, EndpointInfo, IpKey,
    CONTAINER_ID_LEN, IFNAME_LEN, LAYOUT_VERSION,
};

pub use bpf::{now_unix, object_hash};

use crate::{cni::AttachmentId, error::Error, lock::FileLock};

/// A pod's endpoint as the datapath sees it.
pub struct EndpointSpec<'a> {
    pub id: &'a AttachmentId,
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    pub ips: &'a [IpAddr],
    pub netns_ino: u64,
}

pub struct Datapath {
    pin_root: PathBuf,
    lock_path: PathBuf,
}

/// Held while attaching: an upgrade (exclusive) cannot swap programs meanwhile.
pub struct LoadedGuard {
    _lock: FileLock,
}

/// Whether the owner recorded in `sl_ep_info` is `id`. The map keeps the container
/// id cut at `CONTAINER_ID_LEN` bytes, so `id` is cut the same way first.
pub fn info_owned_by(info: &EndpointInfo, id: &AttachmentId) -> bool {
    let cid: [u8; CONTAINER_ID_LEN] = to_cbuf(id.container_id.as_bytes());
    let ifname: [u8; IFNAME_LEN] = to_cbuf(id.ifname.as_bytes());
    info.container_id == cid && info.ifname == ifname
}

/// The same test for an owner read back as an [`AttachmentId`] by
/// [`Datapath::endpoint_owners`].
pub fn owned_by(recorded: &AttachmentId, id: &AttachmentId) -> bool {
    let info = EndpointInfo {
        container_id: to_cbuf(recorded.container_id.as_bytes()),
        ifname: to_cbuf(recorded.ifname.as_bytes()),
        ..EndpointInfo::default()
    };
    info_owned_by(&info, id)
}

pub fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}

impl Datapath {
    /// The datapath pinned at `pin_root`, locked through a file in `state_dir`.
    pub fn new(pin_root: &Path, state_dir: &Path) -> Self {
        Self {
            pin_root: pin_root.to_path_buf(),
            lock_path: state_dir.join("datapath.lock"),
        }
    }

    fn dir(&self, sub: &str) -> PathBuf {
        self.pin_root.join(sub)
    }

    /// The pinned datapath's identity, if one is loaded.
    pub fn meta(&self) -> Result<Option<DatapathMeta>, Error> {
        bpf::read_meta(&self.dir(pin_dirs::MAPS))
    }

    fn is_current(&self) -> Result<bool, Error> {
        Ok(match self.meta()? {
            Some(m) => {
                if m.layout_version != LAYOUT_VERSION {
                    return Err(Error::datapath(
                        "reuse the pinned datapath",
                        format!(
                            "{} holds map layout v{}, this sluice uses v{LAYOUT_VERSION}",
                            self.pin_root.display(),
                            m.layout_version
                        ),
                    ));
                }
                m.object_hash == object_hash() && bpf::programs_pinned(&self.dir(pin_dirs::PROGS))
            }
            None => false,
        })
    }

    /// Makes sure this binary's programs are loaded and pinned. The first ADD on a
    /// node loads them (verifier work once); later ADDs only open the pins. When the
    /// pinned programs come from another object, they are replaced on every
    /// attached interface, keeping map contents.
    pub fn ensure_loaded(&self) -> Result<LoadedGuard, Error> {
        bpffs::ensure_bpffs(&self.pin_root)?;
        if let Some(parent) = self.lock_path.parent() {
            bpffs::create_dirs(parent)?;
        }
        {
            let shared = FileLock::shared(&self.lock_path)?;
            if self.is_current()? {
                return Ok(LoadedGuard { _lock: shared });
            }
        }
        let exclusive = FileLock::exclusive(&self.lock_path)?;
        // Another invocation may have loaded while this one waited.
        if !self.is_current()? {
            for d in [pin_dirs::MAPS, pin_dirs::PROGS, pin_dirs::LINKS] {
                bpffs::create_dirs(&self.dir(d))?;
            }
            bpf::check_pinned_maps(&self.dir(pin_dirs::MAPS))?;
            bpf::load_and_pin(
                &self.dir(pin_dirs::MAPS),
                &self.dir(pin_dirs::PROGS),
                &self.dir(pin_dirs::LINKS),
            )?;
        }
        drop(exclusive);
        Ok(LoadedGuard {
            _lock: FileLock::shared(&self.lock_path)?,
        })
    }

    /// Attaches the programs to the pod's host veth and publishes the endpoint.
    pub fn add_endpoint(&self, _guard: &LoadedGuard, ep: &EndpointSpec<'_>) -> Result<(), Error> {
        let mut maps = bpf::Maps::open(&self.dir(pin_dirs::MAPS))?;
        let info = EndpointInfo {
            container_id: to_cbuf(ep.id.container_id.as_bytes()),
            ifname: to_cbuf(ep.id.ifname.as_bytes()),
            host_ifname: to_cbuf(ep.host_ifname.as_bytes()),
            netns_ino: ep.netns_ino,
            created_unix: now_unix(),
        };
        // Counters first, so the programs count from the first packet.
        maps.insert_interface(ep.host_ifindex, &info)?;
        bpf::attach(
            &self.dir(pin_dirs::PROGS),
            &self.dir(pin_dirs::LINKS),
            ep.host_ifname,
        )?;
        for ip in ep.ips {
            let flags = if ip.is_ipv6() {
                endpoint_flags::IPV6
            } else {
                0
            };
            maps.insert_endpoint(
                ip_key(*ip),
                Endpoint {
                    ifindex: ep.host_ifindex,
                    flags,
                    pod_mac: ep.pod_mac,
                    host_mac: ep.host_mac,
                },
            )?;
        }
        Ok(())
    }

    /// Removes what [`Self::add_endpoint`] made. Best effort: it goes on past errors
    /// and returns the first. Nothing pinned yet means nothing to remove.
    pub fn remove_endpoint(
        &self,
        host_ifname: &str,
        host_ifindex: Option<u32>,
        id: &AttachmentId,
    ) -> Result<(), Error> {
        let mut first_err: Option<Error> = None;
        let links = self.dir(pin_dirs::LINKS);
        if let Err(e) = bpf::detach(&links, host_ifname) {
            first_err.get_or_insert(e);
        }
        let maps_dir = self.dir(pin_dirs::MAPS);
        if !maps_dir.join(sluice_common::map_names::ENDPOINTS).exists() {
            return first_err.map_or(Ok(()), Err);
        }
        let mut maps = bpf::Maps::open(&maps_dir)?;
        // The interface may be known by its recorded index or, after a crash before
        // the record was complete, only by the owner entry.
        let mut ifindexes: Vec<u32> = host_ifindex.into_iter().collect();
        for (idx, info) in maps.interfaces() {
            let owner = info_owned_by(&info, id);
            if owner && !ifindexes.contains(&idx) {
                ifindexes.push(idx);
            }
        }
        for (key, ep) in maps.endpoints() {
            if ifindexes.contains(&ep.ifindex) {
                if let Err(e) = maps.remove_endpoint(&key) {
                    first_err.get_or_insert(e);
                }
            }
        }
        for idx in ifindexes {
            if let Err(e) = maps.remove_interface(idx) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// CHECK: programs attached to the host veth, endpoint entries in place.
    pub fn check_endpoint(&self, ep: &EndpointSpec<'_>) -> Result<(), Error> {
        bpf::check_attached(&self.dir(pin_dirs::LINKS), ep.host_ifname)?;
        let maps = bpf::Maps::open(&self.dir(pin_dirs::MAPS))?;
        if !maps.has_counters(ep.host_ifindex) {
            return Err(Error::check(format!(
                "no counters for {} (ifindex {})",
                ep.host_ifname, ep.host_ifindex
            )));
        }
        for ip in ep.ips {
            match maps.endpoint(&ip_key(*ip)) {
                Some(e) if e.ifindex == ep.host_ifindex && e.pod_mac == ep.pod_mac => {}
                Some(e) => {
                    return Err(Error::check(format!(
                        "endpoint {ip} points at ifindex {} instead of {} ({})",
                        e.ifindex, ep.host_ifindex, ep.host_ifname
                    )))
                }
                None => {
                    return Err(Error::check(format!(
                        "endpoint {ip} missing from sl_endpoints"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Host veths with pinned links (for GC).
    pub fn attached_interfaces(&self) -> Result<Vec<String>, Error> {
        bpf::attached_interfaces(&self.dir(pin_dirs::LINKS))
    }

    /// Owners of the endpoint entries: (host ifindex, container id, ifname, host ifname).
    pub fn endpoint_owners(&self) -> Result<Vec<(u32, AttachmentId, String)>, Error> {
        let maps_dir = self.dir(pin_dirs::MAPS);
        if !maps_dir
            .join(sluice_common::map_names::ENDPOINT_INFO)
            .exists()
        {
            return Ok(Vec::new());
        }
        let maps = bpf::Maps::open(&maps_dir)?;
        Ok(maps
            .interfaces()
            .into_iter()
            .map(|(idx, info)| {
                let s =
                    |b: &[u8]| String::from_utf8_lossy(sluice_common::from_cbuf(b)).into_owned();
                (
                    idx,
                    AttachmentId {
                        container_id: s(&info.container_id),
                        ifname: s(&info.ifname),
                    },
                    s(&info.host_ifname),
                )
            })
            .collect())
    }

    /// Whether the embedded object can be loaded at all (STATUS).
    pub fn has_object(&self) -> bool {
        bpf::has_object()
    }

    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: &str, i: &str) -> AttachmentId {
        AttachmentId {
            container_id: c.into(),
            ifname: i.into(),
        }
    }

    #[test]
    fn owners_compare_with_the_cut_container_id() {
        let long = "a".repeat(99);
        let full = id(&long, "eth0");
        let recorded = id(&long[..CONTAINER_ID_LEN], "eth0");
        assert!(owned_by(&recorded, &full));
        assert!(!owned_by(&recorded, &id(&long, "eth1")));
        assert!(!owned_by(&id("abc", "eth0"), &id("abcd", "eth0")));
        assert!(owned_by(&id("abc", "eth0"), &id("abc", "eth0")));
    }
}
