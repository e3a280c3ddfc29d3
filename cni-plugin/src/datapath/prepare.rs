//! The datapath's node-wide verb, [`Datapath::prepare`]: the programs loaded
//! (once per node, or when this binary carries another object: an upgrade),
//! the node's attachments (uplink, NAT sweeper, hostPort socket hooks) and
//! every feature's node settings; with the maintenance verbs over the whole
//! node (`reload`, `detach_all`).
use sluice_common::{monitor_slot, pin_dirs, LAYOUT_VERSION};

use super::{
    bpffs, endpoint, features, hostport, links, loader, object_hash, sweeper, uplink, Datapath,
    NodeSettings, Prepared, FEATURES,
};
use crate::{error::Error, lock::FileLock, netlink::Netlink};

impl Datapath {
    /// Makes the node-wide part as `settings` ask: this binary's programs loaded
    /// and pinned (the first ADD on a node pays the verifier; later ADDs open the
    /// pins; pinned programs of another object are replaced on every attached
    /// interface, keeping map contents), the uplink, sweeper and socket hooks
    /// attached, and the masquerade, debug and node-address settings written
    /// (cheap when unchanged: every ADD writes them, so a config change takes
    /// effect at the next ADD).
    pub async fn prepare(
        &self,
        host_nl: &Netlink,
        settings: &NodeSettings,
    ) -> Result<Prepared, Error> {
        bpffs::ensure_bpffs(self.root.path())?;
        bpffs::create_dirs(self.root.path())?;
        let prepared = 'load: {
            {
                let shared = FileLock::dir_shared(self.root.path())?;
                if self.is_current()? && self.node_attached(host_nl, settings).await? {
                    break 'load Prepared {
                        _lock: shared,
                        fresh: false,
                    };
                }
            }
            let exclusive = FileLock::dir_exclusive(self.root.path())?;
            let fresh = self.load_locked(host_nl, settings).await?;
            drop(exclusive);
            Prepared {
                _lock: FileLock::dir_shared(self.root.path())?,
                fresh,
            }
        };
        for f in FEATURES {
            f.prepare(&self.root, settings)?;
        }
        sluice_maps::node::set_monitor_slot(
            &self.root,
            monitor_slot::DEBUG,
            u64::from(settings.debug),
        )?;
        Ok(prepared)
    }

    fn is_current(&self) -> Result<bool, Error> {
        Ok(match self.meta()? {
            Some(m) => {
                if m.layout_version != LAYOUT_VERSION {
                    return Err(Error::datapath(
                        "reuse the pinned datapath",
                        format!(
                            "{} holds map layout v{}, this sluice uses v{LAYOUT_VERSION}",
                            self.root.path().display(),
                            m.layout_version
                        ),
                    ));
                }
                m.object_hash == object_hash() && loader::programs_pinned(&self.root)
            }
            None => false,
        })
    }

    /// The node-wide attachments are in place: the NAT sweeper, the socket hooks
    /// if asked for, and the uplink's programs as the settings ask.
    async fn node_attached(&self, host_nl: &Netlink, s: &NodeSettings) -> Result<bool, Error> {
        Ok(
            (sweeper::sweeper_attached(&self.root) || !features::get().sweeper)
                && (s.host_port_cgroup.is_none() || hostport::hooks_attached(&self.root))
                && uplink::current(&self.root, host_nl, s).await?,
        )
    }

    fn create_pin_dirs(&self) -> Result<(), Error> {
        for d in [pin_dirs::MAPS, pin_dirs::PROGS, pin_dirs::LINKS] {
            bpffs::create_dirs(&self.root.path().join(d))?;
        }
        Ok(())
    }

    /// Under the exclusive lock: load if needed, attach what is missing.
    /// Returns whether it loaded where no datapath was pinned.
    async fn load_locked(&self, host_nl: &Netlink, s: &NodeSettings) -> Result<bool, Error> {
        let mut fresh = false;
        // Another invocation may have loaded while this one waited.
        if !self.is_current()? {
            fresh = self.meta()?.is_none();
            self.create_pin_dirs()?;
            loader::load_and_pin(&self.root, &self.pod_ifnames(), s.nat_flows)?;
        }
        if features::get().sweeper && !sweeper::sweeper_attached(&self.root) {
            sweeper::ensure_sweeper(&self.root)?;
        }
        if let Some(cg) = &s.host_port_cgroup {
            if !hostport::hooks_attached(&self.root) {
                hostport::attach_hooks(&self.root, &hostport::open_cgroup(cg)?, cg)?;
            }
        }
        uplink::prepare(&self.root, host_nl, s).await?;
        Ok(fresh)
    }

    /// Reloads the programs from this binary's object even when the pinned ones
    /// look current (`sluicectl datapath reload`), moving every link to them.
    pub fn reload(&self) -> Result<(), Error> {
        bpffs::ensure_bpffs(self.root.path())?;
        bpffs::create_dirs(self.root.path())?;
        let _exclusive = FileLock::dir_exclusive(self.root.path())?;
        self.create_pin_dirs()?;
        loader::load_and_pin(
            &self.root,
            &self.pod_ifnames(),
            crate::cni::config::NAT_MAX_FLOWS_DEFAULT,
        )
    }

    /// The exclusive lock an ADD's shared one waits for; `None` when nothing
    /// was ever pinned here (no ADD has got that far, so none holds a lock).
    pub fn lock_exclusive(&self) -> Result<Option<FileLock>, Error> {
        if !self.root.path().is_dir() {
            return Ok(None);
        }
        Ok(Some(FileLock::dir_exclusive(self.root.path())?))
    }

    /// Detaches every program (pods, uplink, socket hooks, sweeper) under the
    /// exclusive lock; traffic falls back to the kernel's routes (the pods'
    /// routes and neighbours do not depend on the programs). The next ADD attaches
    /// the uplink again. Returns what was detached.
    pub fn detach_all(&self) -> Result<Vec<String>, Error> {
        let _exclusive = FileLock::dir_exclusive(self.root.path())?;
        links::detach_all(&self.root, &self.pod_ifnames())
    }

    /// The per-reason counters summed over CPUs (index = `sluice_common::reason`).
    pub fn counters(&self) -> Result<Vec<u64>, Error> {
        Ok(sluice_maps::counters::read(&self.root)?)
    }

    /// Host veths of every endpoint (an upgrade replaces their filters).
    fn pod_ifnames(&self) -> Vec<String> {
        endpoint::owners(&self.root)
            .map(|o| o.into_iter().map(|(_, _, ifname)| ifname).collect())
            .unwrap_or_default()
    }
}
