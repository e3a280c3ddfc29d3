//! GC (spec 1.1.0): remove everything of this network that no attachment in
//! `cni.dev/valid-attachments` owns: records, address reservations, datapath
//! entries and links, the host veths they name, and this network's gateways
//! on the node's `lo` once no pod on the node uses them (the spec's warning:
//! shared resources stay while anyone may use them).
use std::collections::HashSet;

use crate::{
    cni::{config::NetConf, env::Env, AttachmentId},
    datapath::Datapath,
    error::{Error, Errors},
    gateway,
    ipam::Ipam,
    netlink::Netlink,
    pod::{teardown, VethRemoval},
    state::StateStore,
};

pub(super) async fn gc(env: &Env, conf: &NetConf) -> Result<(), Error> {
    let valid = conf
        .valid_attachments
        .as_ref()
        .ok_or_else(|| Error::config("cni.dev/valid-attachments", "null", "is required for GC"))?;
    let valid_set: HashSet<&AttachmentId> = valid.iter().collect();
    let ipam = Ipam::new(conf, &env.path)?;
    let store = StateStore::new(&conf.state_dir);
    let host_nl = Netlink::open()?;
    let mut errors = Errors::new();

    let mut gateways = gateway::Candidates::default();
    for (gw, subnet) in ipam.gateways() {
        gateways.note(gw, Some(subnet));
    }
    for rec in store.list()? {
        let id = rec.id();
        if !valid_set.contains(&id) {
            gateways.note_pod(&rec.gateways, &rec.ips);
            eprintln!(
                "sluice: GC removes stale attachment {}/{}",
                id.container_id, id.ifname
            );
            errors.note(teardown(conf, &id, &ipam, &store, &host_nl).await);
        }
    }
    // Datapath entries whose record is gone (e.g. a crash before the record was
    // written, or a record removed by hand), their host veths, and hostPort
    // mappings whose pod is gone.
    let dp = Datapath::new(&conf.pin_root);
    if let Some(orphans) = errors.note(dp.collect(valid)) {
        for host_ifname in orphans {
            let removal = VethRemoval::start(&host_nl, &host_ifname).await;
            if let Some(r) = errors.note(removal).flatten() {
                errors.note(r.finish().await);
            }
        }
    }
    errors.note(ipam.gc(conf, valid));
    // Last: the host veths and their routes are gone by now.
    errors.note(gateway::remove_unused(&host_nl, &dp, &store, &gateways).await);
    errors.finish()
}
