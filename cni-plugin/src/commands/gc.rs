//! GC (spec 1.1.0): remove everything of this network that no attachment in
//! `cni.dev/valid-attachments` owns: records, address reservations, datapath
//! entries and links, and the host veths they name.
use std::collections::HashSet;

use super::del::{delete_host_veth, teardown};
use crate::{
    cni::{config::NetConf, env::Env, AttachmentId},
    datapath::{owned_by, Datapath},
    error::Error,
    ipam::Ipam,
    netlink::Netlink,
    state::StateStore,
};

pub async fn gc(env: &Env, conf: &NetConf) -> Result<(), Error> {
    let valid = conf
        .valid_attachments
        .as_ref()
        .ok_or_else(|| Error::config("cni.dev/valid-attachments", "null", "is required for GC"))?;
    let valid_set: HashSet<&AttachmentId> = valid.iter().collect();
    let ipam = Ipam::new(conf, &env.path)?;
    let store = StateStore::new(&conf.state_dir);
    let host_nl = Netlink::open()?;
    let dp = Datapath::new(&conf.pin_root);
    let mut first_err: Option<Error> = None;

    for rec in store.list()? {
        let id = rec.id();
        if !valid_set.contains(&id) {
            eprintln!(
                "sluice: GC removes stale attachment {}/{}",
                id.container_id, id.ifname
            );
            if let Err(e) = teardown(conf, &id, &ipam, &store, &host_nl).await {
                first_err.get_or_insert(e);
            }
        }
    }
    // Datapath entries and links whose record is gone (e.g. a crash before the
    // record was written, or a record removed by hand).
    for (ifindex, id, host_ifname) in dp.endpoint_owners()? {
        if !valid.iter().any(|v| owned_by(&id, v)) {
            if let Err(e) = dp.remove_endpoint(&host_ifname, Some(ifindex), &id) {
                first_err.get_or_insert(e);
            }
            if let Err(e) = delete_host_veth(&host_nl, &host_ifname).await {
                first_err.get_or_insert(e);
            }
        }
    }
    // hostPort mappings whose pod is gone (operator mappings included).
    match dp.endpoint_owners() {
        Ok(owners) => {
            let live: Vec<u32> = owners.iter().map(|(i, _, _)| *i).collect();
            if let Err(e) = dp.remove_orphan_ports(&live) {
                first_err.get_or_insert(e);
            }
        }
        Err(e) => {
            first_err.get_or_insert(e);
        }
    }
    if let Err(e) = ipam.gc(conf, valid) {
        first_err.get_or_insert(e);
    }
    first_err.map_or(Ok(()), Err)
}
