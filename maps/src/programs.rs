//! What is known of the pinned programs without loading anything.
use aya::programs::SchedClassifier;
use sluice_common::pin_dirs;

use crate::{Error, PinRoot, Result};

/// Kernel id of pinned program `name` (as `bpftool prog` shows it).
pub fn id(root: &PinRoot, name: &str) -> Result<u32> {
    // `from_pin` only opens the pin and reads its info, whatever the program
    // type, so it serves the XDP and cgroup programs too.
    let path = root.path().join(pin_dirs::PROGS).join(name);
    let p = SchedClassifier::from_pin(&path).map_err(|source| Error::Program {
        op: format!("open pinned program {}", path.display()),
        source,
    })?;
    p.info().map(|i| i.id()).map_err(|source| Error::Program {
        op: format!("read the info of {name}"),
        source,
    })
}
