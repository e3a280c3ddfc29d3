//! DEL, the CNI glue: undo everything ADD made ([`crate::pod::teardown`]).
//! Works without `CNI_NETNS`, without prevResult, after the netns is gone and
//! twice in a row (spec section 2), and always releases the address
//! reservation.
use crate::{
    cni::{config::NetConf, env::Env},
    error::{Error, Errors},
    ipam::Ipam,
    netlink::Netlink,
    pod::teardown::{load_record, teardown, teardown_node},
    state::StateStore,
};

pub(super) async fn del(env: &Env, conf: &NetConf) -> Result<(), Error> {
    let id = env.attachment()?;
    // A runtime giving up on us mid-DEL must not leave half a pod behind
    // (netavark does the same): finish, then exit.
    ignore_termination_signals();
    let host_nl = Netlink::open()?;
    let store = StateStore::new(&conf.state_dir);
    match Ipam::new(conf, &env.path) {
        Ok(ipam) => teardown(conf, id, &ipam, &store, &host_nl).await,
        Err(e) => {
            // Without IPAM we still remove the interface and datapath state, then
            // report why the reservation could not be released.
            let mut errors = Errors::new();
            let record = load_record(&store, id);
            errors.note(teardown_node(conf, id, record.as_ref(), &host_nl, || Ok(())).await);
            errors.push(e);
            errors.finish()
        }
    }
}

fn ignore_termination_signals() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: installing SIG_IGN runs no handler code.
        let _ = unsafe { signal(s, SigHandler::SigIgn) };
    }
}
