//! STATUS (spec 1.1.0): whether an ADD can succeed now. Code 50 when it cannot
//! (no eBPF object, no bpffs, a pinned datapath of another layout, no free
//! address).
use std::path::Path;

use crate::{
    cni::{config::NetConf, env::Env},
    datapath::{self, bpffs, Datapath},
    error::Error,
    ipam::Ipam,
};

pub(super) fn status(env: &Env, conf: &NetConf) -> Result<(), Error> {
    let unavailable = |reason: String| Error::NotAvailable { reason };
    let dp = Datapath::new(&conf.pin_root);
    if !datapath::has_object() {
        return Err(unavailable(
            "this sluice binary carries no eBPF object".into(),
        ));
    }
    let mountable =
        conf.pin_root.starts_with(bpffs::BPFFS_MOUNT) && Path::new(bpffs::BPFFS_MOUNT).is_dir();
    if !bpffs::is_bpffs(&conf.pin_root) && !mountable {
        return Err(unavailable(format!(
            "pin root {} is not on a bpffs",
            conf.pin_root.display()
        )));
    }
    if let Some(meta) = dp.meta()? {
        if meta.layout_version != sluice_common::LAYOUT_VERSION {
            return Err(unavailable(format!(
                "the datapath pinned at {} uses map layout v{}, this sluice v{}",
                conf.pin_root.display(),
                meta.layout_version,
                sluice_common::LAYOUT_VERSION
            )));
        }
    }
    Ipam::new(conf, &env.path)?
        .status(conf)
        .map_err(|e| match e {
            Error::IpamExhausted { .. } | Error::NotAvailable { .. } => unavailable(e.to_string()),
            other => other,
        })
}
