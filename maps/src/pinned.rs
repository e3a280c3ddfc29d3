//! A network's pin root and opening the maps pinned under it.
use std::path::{Path, PathBuf};

use aya::maps::{Map, MapData, MapError};
use sluice_common::{
    maps::{MapKind, MapSpec},
    pin_dirs, LAYOUT_VERSION,
};

use crate::{Error, Result};

/// The pinned datapath of one network: `<root>/maps`, `<root>/progs`,
/// `<root>/links` (see `sluice_common::pin_dirs`).
#[derive(Clone, Debug)]
pub struct PinRoot {
    root: PathBuf,
}

impl PinRoot {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.root.join(pin_dirs::MAPS)
    }

    pub fn progs_dir(&self) -> PathBuf {
        self.root.join(pin_dirs::PROGS)
    }

    pub fn links_dir(&self) -> PathBuf {
        self.root.join(pin_dirs::LINKS)
    }

    /// Where map `spec` is pinned.
    pub fn map_path(&self, spec: &MapSpec) -> PathBuf {
        self.maps_dir().join(spec.name)
    }

    /// Whether map `spec` is pinned (a datapath loaded by an older sluice may
    /// lack maps added since).
    pub fn has(&self, spec: &MapSpec) -> bool {
        self.map_path(spec).exists()
    }

    /// How many entries pinned map `spec` holds at most (its `max_entries`,
    /// fixed when it was created: `natMaxFlows` for the NAT maps).
    pub fn capacity(&self, spec: &MapSpec) -> Result<u32> {
        let path = self.map_path(spec);
        aya::maps::MapInfo::from_pin(&path)
            .map(|i| i.max_entries())
            .map_err(|e| Error::map(format!("read {}", path.display()), spec.name, e))
    }

    /// Opens pinned map `spec`. A pin the caller may not see (the pin root is
    /// root-only) is reported as such, not as missing.
    pub(crate) fn open(&self, spec: &MapSpec) -> Result<Map> {
        let path = self.map_path(spec);
        if let Err(e) = std::fs::metadata(&path) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return Err(Error::NeedsRoot { path, source: e });
            }
            return Err(Error::NotPinned {
                root: self.root.clone(),
                path,
            });
        }
        let data = MapData::from_pin(&path).map_err(|e| match e {
            MapError::SyscallError(s)
                if s.io_error.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Error::NeedsRoot {
                    path: path.clone(),
                    source: s.io_error,
                }
            }
            e => Error::map(format!("open {}", path.display()), spec.name, e),
        })?;
        Map::from_map_data(data).map_err(|e| Error::map("use the pinned map", spec.name, e))
    }

    /// Opens pinned map `spec` as the typed map `T` (`HashMap`, `Array`, ...).
    pub(crate) fn typed<T>(&self, spec: &MapSpec) -> Result<T>
    where
        T: TryFrom<Map, Error = MapError>,
    {
        T::try_from(self.open(spec)?).map_err(|e| Error::map("open", spec.name, e))
    }

    /// Refuses pinned maps whose kind or key/value sizes differ from this
    /// layout's registry (aya reuses a pinned map by name without comparing).
    /// `kinds`: maps whose type the loader chose for this kernel.
    pub fn check_shapes(&self, kinds: &[(&MapSpec, MapKind)]) -> Result<()> {
        for registered in &sluice_common::maps::ALL {
            let mut spec = *registered;
            if let Some((_, k)) = kinds.iter().find(|(m, _)| m.name == spec.name) {
                spec.kind = *k;
            }
            let spec = &spec;
            let path = self.map_path(spec);
            if !path.exists() {
                continue;
            }
            let data = MapData::from_pin(&path)
                .map_err(|e| Error::map(format!("open {}", path.display()), spec.name, e))?;
            let info = data
                .info()
                .map_err(|e| Error::map(format!("inspect {}", path.display()), spec.name, e))?;
            let found = (
                info.key_size() as usize,
                info.value_size() as usize,
                info.map_type(),
            );
            let kind_ok = info
                .map_type()
                .is_ok_and(|t| t as u32 == spec.kind.bpf_type());
            if (found.0, found.1) != (spec.key_size, spec.value_size) || !kind_ok {
                return Err(Error::Shape {
                    path,
                    found: format!(
                        "key/value sizes {}/{} and type {:?}",
                        found.0, found.1, found.2
                    ),
                    wanted: format!("{}/{} and {:?}", spec.key_size, spec.value_size, spec.kind),
                    layout: LAYOUT_VERSION,
                });
            }
        }
        Ok(())
    }

    /// Names of the pins in `sub` (`progs` or `links`), sorted; none when the
    /// directory is missing.
    pub fn pins(&self, sub: &str) -> Result<Vec<String>> {
        let dir = self.root.join(sub);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
        };
        let mut out: Vec<String> = rd
            .filter_map(std::result::Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        out.sort();
        Ok(out)
    }
}
