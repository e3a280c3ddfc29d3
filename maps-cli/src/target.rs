//! Which pinned datapath `sluicectl` works on: `--pin-root`, `--network`, or
//! the only network under the default pin base; refused unless a load of this
//! map layout finished there. Everything read or written goes through
//! `sluice_maps`.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sluice_common::{pin_dirs, DEFAULT_PIN_BASE, LAYOUT_VERSION};
use sluice_maps::PinRoot;

use crate::args::Target;

/// The pinned datapath of one network.
pub(crate) struct Datapath {
    pub root: PinRoot,
    pub pin_root: PathBuf,
}

impl Datapath {
    /// Resolves the target and checks that a datapath of our layout is pinned there.
    pub(crate) fn open(t: &Target) -> Result<Self> {
        let pin_root = match (&t.pin_root, &t.network) {
            (Some(p), _) => p.clone(),
            (None, Some(n)) => sluice_common::user::default_pin_root(n),
            (None, None) => {
                let nets = list_networks();
                match nets.as_slice() {
                    [one] => Path::new(DEFAULT_PIN_BASE).join(one),
                    [] => bail!(
                        "no Sluice datapath under {DEFAULT_PIN_BASE}; pass --pin-root or --network"
                    ),
                    many => bail!(
                        "several networks under {DEFAULT_PIN_BASE} ({}); pick one with --network",
                        many.join(", ")
                    ),
                }
            }
        };
        let root = PinRoot::new(&pin_root);
        let meta = sluice_maps::node::read_meta(&root)?;
        if meta.layout_version == 0 {
            bail!(
                "the datapath at {} is not loaded (a first load did not finish); the next ADD loads it",
                pin_root.display()
            );
        }
        if meta.layout_version != LAYOUT_VERSION {
            bail!(
                "the datapath at {} uses map layout v{}, this sluicectl reads v{LAYOUT_VERSION}; use the sluicectl that matches the installed sluice",
                pin_root.display(),
                meta.layout_version
            );
        }
        Ok(Self { root, pin_root })
    }

    /// The datapath's exclusive lock (`flock` on the pin root, the lock every
    /// ADD holds shared and every load exclusive): while it is held no ADD
    /// runs, so no endpoint is written between a read and a write of ours.
    /// Waits for the ADDs in flight (each bounded by its own lock timeout);
    /// released when the returned file is dropped.
    pub(crate) fn lock_exclusive(&self) -> Result<std::fs::File> {
        let dir = std::fs::File::open(&self.pin_root)
            .with_context(|| format!("opening {} to lock it", self.pin_root.display()))?;
        if let Err(std::fs::TryLockError::WouldBlock) = dir.try_lock() {
            eprintln!(
                "waiting for the ADDs in flight on {} to finish",
                self.pin_root.display()
            );
        }
        dir.lock()
            .with_context(|| format!("locking {}", self.pin_root.display()))?;
        Ok(dir)
    }
}

/// Network directories under the default pin base.
fn list_networks() -> Vec<String> {
    std::fs::read_dir(DEFAULT_PIN_BASE)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().join(pin_dirs::MAPS).is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}
