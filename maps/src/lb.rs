//! The Services Sluice translates itself (the agent's Service mode): each
//! Service port has an id; its frontends (`sl_lb_svc`: address, port,
//! protocol) name the id and how many backends it has, its backends sit in
//! slots `0..count` of `sl_lb_be`. See `sluice_common::lb`.
//!
//! Writes are ordered so the socket hooks never see a count whose slots are
//! not all there: a Service port's backends are written before its
//! frontends (with the new count), and slots past a smaller new count go
//! only after the frontends say it.
use std::net::IpAddr;

use aya::maps::{Array, HashMap, MapData, MapError};
use sluice_common::{
    map_sizes, maps, programs::LB_HOOKS, Backend, BackendKey, IpKey, LbConfig, SvcKey, SvcValue,
};

use crate::{
    endpoint::{ip_key, key_ip},
    error::is_not_found,
    sock_hooks, Error, PinRoot, Result,
};

/// A frontend's key: `addr`:`port` (host byte order) over `proto`.
pub fn frontend(addr: IpAddr, port: u16, proto: u8) -> SvcKey {
    SvcKey::new(ip_key(addr), port.to_be(), proto)
}

/// A backend: `addr`:`port` (host byte order).
pub fn backend(addr: IpAddr, port: u16) -> Backend {
    Backend {
        addr: ip_key(addr),
        port: port.to_be(),
        _pad: 0,
    }
}

/// The address and port (host byte order) of a frontend key or a backend.
pub fn addr_port(addr: &IpKey, port_be: u16) -> (IpAddr, u16) {
    (key_ip(addr), u16::from_be(port_be))
}

/// A frontend as operators read it, `addr:port/proto` (`10.96.0.10:53/udp`):
/// how `sluicectl services lb` prints it and the agent's state file names
/// it (the two are compared).
pub fn frontend_text(k: &SvcKey) -> String {
    let (ip, port) = addr_port(&k.addr, k.port);
    let proto = match k.proto {
        6 => "tcp".to_string(),
        17 => "udp".to_string(),
        n => n.to_string(),
    };
    format!("{}/{proto}", std::net::SocketAddr::new(ip, port))
}

/// Writes the hooks' view of the node (`sl_lb_cfg`) unless it holds that
/// already; a datapath without the map (an older sluice loaded it) is left
/// alone.
pub fn write_config(root: &PinRoot, cfg: &LbConfig) -> Result<()> {
    if !root.has(&maps::LB_CONFIG) {
        return Ok(());
    }
    let mut m: Array<MapData, LbConfig> = root.typed(&maps::LB_CONFIG)?;
    if m.get(&0, 0).ok().as_ref() == Some(cfg) {
        return Ok(());
    }
    m.set(0, *cfg, 0)
        .map_err(|e| Error::map("write", maps::LB_CONFIG.name, e))
}

/// What the hooks know of the node (`sl_lb_cfg`); `None` without the map.
pub fn config(root: &PinRoot) -> Result<Option<LbConfig>> {
    if !root.has(&maps::LB_CONFIG) {
        return Ok(None);
    }
    let m: Array<MapData, LbConfig> = root.typed(&maps::LB_CONFIG)?;
    Ok(m.get(&0, 0).ok())
}

/// The Service maps of a pin root, opened.
pub struct LbMaps {
    svc: HashMap<MapData, SvcKey, SvcValue>,
    backends: HashMap<MapData, BackendKey, Backend>,
    stats: Array<MapData, u64>,
}

/// Whether a write failed because the map is full (a hash map answers
/// `E2BIG`; one without preallocation may answer `ENOMEM`).
fn is_full(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s)
        if matches!(s.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOMEM)))
}

fn write_error(map: &'static str, max: u32, e: MapError) -> Error {
    if is_full(&e) {
        Error::Full { map, max }
    } else {
        Error::map("write", map, e)
    }
}

impl LbMaps {
    /// `None` when the datapath predates the Service maps (an older sluice
    /// loaded it).
    pub fn open(root: &PinRoot) -> Result<Option<Self>> {
        if !root.has(&maps::LB_SVC) {
            return Ok(None);
        }
        Ok(Some(Self {
            svc: root.typed(&maps::LB_SVC)?,
            backends: root.typed(&maps::LB_BACKENDS)?,
            stats: root.typed(&maps::LB_STATS)?,
        }))
    }

    /// Every frontend and what it leads to.
    pub fn frontends(&self) -> Vec<(SvcKey, SvcValue)> {
        self.svc
            .iter()
            .filter_map(std::result::Result::ok)
            .collect()
    }

    /// The backends of Service port `id` in slots `0..count` (a slot that
    /// is missing is left out).
    pub fn backends(&self, id: u32, count: u32) -> Vec<Backend> {
        (0..count)
            .filter_map(|slot| self.backends.get(&BackendKey { id, slot }, 0).ok())
            .collect()
    }

    /// Translations of Service port `id` at the socket so far.
    pub fn translations(&self, id: u32) -> u64 {
        self.stats.get(&id, 0).unwrap_or(0)
    }

    /// Makes Service port `id` lead from `frontends` to `backends` (in that
    /// slot order), with `flags` and session affinity `affinity_secs`,
    /// `old_count` being the slots it had. See the module's note on the
    /// order.
    pub fn write(
        &mut self,
        id: u32,
        frontends: &[SvcKey],
        backends: &[Backend],
        (flags, affinity_secs): (u32, u32),
        old_count: u32,
    ) -> Result<()> {
        if id >= map_sizes::LB_STATS {
            return Err(Error::Full {
                map: maps::LB_STATS.name,
                max: map_sizes::LB_STATS,
            });
        }
        let count = u32::try_from(backends.len()).unwrap_or(u32::MAX);
        for (slot, b) in (0..count).zip(backends) {
            self.backends
                .insert(BackendKey { id, slot }, b, 0)
                .map_err(|e| write_error(maps::LB_BACKENDS.name, map_sizes::LB_BACKENDS, e))?;
        }
        let v = SvcValue {
            id,
            count,
            flags,
            affinity_secs,
        };
        for k in frontends {
            self.svc
                .insert(k, v, 0)
                .map_err(|e| write_error(maps::LB_SVC.name, map_sizes::LB_SVC, e))?;
        }
        self.remove_slots(id, count, old_count)
    }

    /// Removes frontends `keys` (a Service port gone, or an address it no
    /// longer has).
    pub fn remove_frontends(&mut self, keys: &[SvcKey]) -> Result<()> {
        for k in keys {
            match self.svc.remove(k) {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::map("remove", maps::LB_SVC.name, e)),
            }
        }
        Ok(())
    }

    /// Removes the slots `from..to` of Service port `id` (after its
    /// frontends no longer count them), and zeroes its counter when all go.
    pub fn remove_slots(&mut self, id: u32, from: u32, to: u32) -> Result<()> {
        for slot in from..to {
            match self.backends.remove(&BackendKey { id, slot }) {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::map("remove", maps::LB_BACKENDS.name, e)),
            }
        }
        Ok(())
    }

    /// Starts Service port `id`'s counter again (an id given to another
    /// Service port).
    pub fn reset_translations(&mut self, id: u32) -> Result<()> {
        if id < map_sizes::LB_STATS {
            self.stats
                .set(id, 0, 0)
                .map_err(|e| Error::map("write", maps::LB_STATS.name, e))?;
        }
        Ok(())
    }
}

// --- the socket hooks ------------------------------------------------------------

/// Whether every Service socket hook is attached (its link is pinned).
pub fn hooks_attached(root: &PinRoot) -> bool {
    sock_hooks::attached(root, &LB_HOOKS)
}

/// Attaches the pinned Service socket hooks to the cgroup v2 directory
/// `cgroup` (every socket of its processes, in any network namespace) and
/// pins their links, so they outlive the agent. Attached ones stay.
pub fn attach_hooks(root: &PinRoot, cgroup: &std::path::Path) -> Result<()> {
    let dir = std::fs::File::open(cgroup)
        .map_err(|e| Error::io(format!("open cgroup {}", cgroup.display()), e))?;
    sock_hooks::attach(root, &LB_HOOKS, &dir, cgroup)
}

/// Unpins the Service socket hooks' links (back to kube-proxy): the kernel
/// detaches each once its last reference goes.
pub fn detach_hooks(root: &PinRoot) -> Result<()> {
    sock_hooks::detach(root, &LB_HOOKS)
}
