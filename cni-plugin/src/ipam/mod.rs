//! IP address management: the built-in host-local-compatible allocator, or
//! delegation to another IPAM plugin through `CNI_PATH` (spec section 4).
pub mod allocator;
pub mod builtin;
pub mod config;
pub mod delegate;
pub mod range;
pub mod store;

use std::{net::IpAddr, path::PathBuf};

use crate::{
    cni::{
        config::{IpamKind, NetConf, Strictness},
        env::Command,
        result::CniResult,
        AttachmentId,
    },
    error::Error,
};

pub use builtin::BuiltinIpam;
pub use delegate::Delegate;

/// The IPAM of one network.
pub enum Ipam {
    Builtin(BuiltinIpam),
    Delegate(Delegate),
}

impl Ipam {
    /// The IPAM `conf` asks for; `ipam` is required.
    pub fn new(conf: &NetConf, cni_path: &[PathBuf]) -> Result<Self, Error> {
        let ipam = conf
            .ipam
            .as_ref()
            .ok_or_else(|| Error::config("ipam", "null", "is required"))?;
        Ok(match &ipam.kind {
            IpamKind::Builtin => Self::Builtin(
                match BuiltinIpam::new(&conf.name, &ipam.raw, conf.runtime.ip_ranges.as_ref()) {
                    Ok(b) => b,
                    // DEL and GC only release: a config whose ranges no longer
                    // validate must not keep the addresses reserved.
                    Err(e) if conf.strictness == Strictness::Teardown => {
                        eprintln!(
                            "sluice: releasing with ipam.dataDir only; the rest of ipam does not validate: {}",
                            e.details()
                        );
                        BuiltinIpam::for_release(&conf.name, &ipam.raw)?
                    }
                    Err(e) => return Err(e),
                },
            ),
            IpamKind::Delegate(t) => Self::Delegate(Delegate::find(t, cni_path)?),
        })
    }

    /// `sluice` or the delegated plugin's type (kept in attachment records).
    pub fn name(&self) -> &str {
        match self {
            Self::Builtin(_) => "sluice",
            Self::Delegate(d) => d.name(),
        }
    }

    /// The gateway and subnet of each configured range (none for a delegated
    /// IPAM, whose gateways only its results name).
    pub fn gateways(&self) -> Vec<(std::net::IpAddr, ipnetwork::IpNetwork)> {
        match self {
            Self::Builtin(b) => b.gateways(),
            Self::Delegate(_) => Vec::new(),
        }
    }

    /// Reserves addresses; an abbreviated result (no interfaces). The caller has
    /// made sure the attachment has no record, hence no addresses (see
    /// [`allocator::Duplicates::CheckedByCaller`]).
    pub fn add(
        &self,
        conf: &NetConf,
        id: &AttachmentId,
        requested: &[IpAddr],
    ) -> Result<CniResult, Error> {
        match self {
            Self::Builtin(b) => b.add(id, requested, allocator::Duplicates::CheckedByCaller),
            Self::Delegate(d) => d.add(&conf.raw),
        }
    }

    /// Releases the addresses of `id`; succeeds when there are none. `known`:
    /// the addresses its record names (the built-in allocator then reads only
    /// those), `None` without a record.
    pub fn del(
        &self,
        conf: &NetConf,
        id: &AttachmentId,
        known: Option<&[IpAddr]>,
    ) -> Result<(), Error> {
        match self {
            Self::Builtin(b) => b.del(id, known),
            Self::Delegate(d) => d.exec_as(Command::Del, &conf.raw, Some(id)).map(drop),
        }
    }

    /// CHECK: the reservation of `id` holds exactly `expected`.
    pub fn check(
        &self,
        conf: &NetConf,
        id: &AttachmentId,
        expected: &[IpAddr],
    ) -> Result<(), Error> {
        match self {
            Self::Builtin(b) => {
                if expected.is_empty() {
                    b.check(id).map(drop)
                } else {
                    b.check_held(id, expected)
                }
            }
            Self::Delegate(d) => d.exec(Command::Check, &conf.raw).map(drop),
        }
    }

    /// GC: releases every reservation not owned by `valid`.
    pub fn gc(&self, conf: &NetConf, valid: &[AttachmentId]) -> Result<(), Error> {
        match self {
            Self::Builtin(b) => {
                for (id, ip) in b.gc(valid)? {
                    eprintln!(
                        "sluice: GC released {ip} of {}/{}",
                        id.container_id, id.ifname
                    );
                }
                Ok(())
            }
            Self::Delegate(d) => Self::delegate_if_supported(d, Command::Gc, conf),
        }
    }

    /// STATUS: whether an ADD could get an address now.
    pub fn status(&self, conf: &NetConf) -> Result<(), Error> {
        match self {
            Self::Builtin(b) => b.status(),
            Self::Delegate(d) => Self::delegate_if_supported(d, Command::Status, conf),
        }
    }

    /// GC and STATUS exist from 1.1.0; a delegate that predates them has nothing
    /// to run, which is not an error of ours.
    fn delegate_if_supported(d: &Delegate, cmd: Command, conf: &NetConf) -> Result<(), Error> {
        let v = conf.cni_version.to_string();
        if d.supports(&v) {
            d.exec(cmd, &conf.raw).map(drop)
        } else {
            eprintln!(
                "sluice: IPAM plugin {} does not speak CNI {v}; skipping its {cmd}",
                d.name()
            );
            Ok(())
        }
    }
}
