//! ADD, the CNI glue: the environment and the spec's preconditions, IPAM (a
//! delegated plugin's DEL after its failed ADD, spec section 4), then
//! [`pod::setup`] for everything the pod gets, and the result (merged into a
//! prevResult, spec section 5). Any failure after the preconditions undoes
//! everything this ADD made ([`pod::teardown`]).

use serde_json::Value;

use crate::{
    cni::{
        config::NetConf,
        env::Env,
        result::{CniResult, Interface, IpConfig},
        runtime_config::Mac,
    },
    error::Error,
    ipam::Ipam,
    netlink::Netlink,
    netns::Netns,
    pod::{self, Made, Setup},
    state::{host_veth_name, PodRef, StateStore},
    timing::Steps,
};

pub async fn add(env: &Env, conf: &NetConf) -> Result<Value, Error> {
    let mut steps = Steps::start();
    let id = env.attachment()?;
    let netns_path = env
        .netns
        .as_ref()
        .ok_or_else(|| Error::env("CNI_NETNS", "", "required for ADD"))?;
    let pod_ns = Netns::open(netns_path)?;
    let host_nl = Netlink::open()?;
    let pod_nl = Netlink::open_in(&pod_ns)?;

    // Spec section 2: an existing interface of that name is an error. Checked
    // before anything is made, so the rollback below never touches what another
    // attachment owns.
    if pod_nl.link_by_name(&id.ifname).await?.is_some() {
        return Err(Error::env(
            "CNI_IFNAME",
            id.ifname.clone(),
            format!(
                "an interface of that name already exists in {}",
                netns_path.display()
            ),
        ));
    }
    let pod_mac = pod_mac(conf, env)?;
    let ipam = Ipam::new(conf, &env.path)?;
    let store = StateStore::new(&conf.state_dir);
    let host_ifname = host_veth_name(&conf.name, id);
    // A runtime must DEL an attachment before ADDing it again (spec section 2).
    // Refused before anything is made: the rollback below would otherwise undo
    // the attachment that exists.
    if store.load(id)?.is_some() {
        return Err(Error::env(
            "CNI_CONTAINERID, CNI_IFNAME",
            format!("{}, {}", id.container_id, id.ifname),
            "this attachment already exists in this network; DEL it before ADDing it again",
        ));
    }
    steps.done("preconditions");
    let requested = conf.requested_ips(&env.args.ips);
    let ipam_result = match ipam.add(conf, id, &requested) {
        Ok(r) => r,
        Err(e) => {
            // The built-in allocator leaves nothing behind on error; a delegated
            // plugin gets a DEL (spec section 4). Nothing else exists yet.
            if let Ipam::Delegate(_) = ipam {
                if let Err(undo) = ipam.del(conf, id, None) {
                    eprintln!("sluice: DEL of the IPAM plugin after its failed ADD: {undo}");
                }
            }
            return Err(e);
        }
    };

    let pod = PodRef::from_args(&env.args);
    let setup = Setup {
        conf,
        id,
        ipam: &ipam,
        store: &store,
        host_ifname: &host_ifname,
        pod_ns: &pod_ns,
        host_nl: &host_nl,
        pod_nl: &pod_nl,
        pod: pod.as_ref(),
        pod_mac,
    };
    steps.done("ipam");
    match pod::setup(&setup, &ipam_result, &mut steps).await {
        Ok(made) => {
            // With NetworkPolicy on, a pod the runtime names starts with its
            // policy in place (see there); its flows are refused until then.
            if pod.is_some() {
                let ips: Vec<_> = ipam_result.ips.iter().map(|c| c.address.ip()).collect();
                pod::policy_wait::wait(&conf.pin_root, &ips);
                steps.done("policy");
            }
            Ok(result(conf, &setup, ipam_result, &made))
        }
        Err(e) => {
            if let Err(undo) = pod::teardown(conf, id, &ipam, &store, &host_nl).await {
                eprintln!(
                    "sluice: rollback after failed ADD of {}/{} was incomplete: {undo}",
                    id.container_id, id.ifname
                );
            }
            Err(e)
        }
    }
}

/// The MAC requested through the `mac` capability or `CNI_ARGS MAC=`.
fn pod_mac(conf: &NetConf, env: &Env) -> Result<Option<Mac>, Error> {
    if let Some(m) = conf.runtime.mac {
        return Ok(Some(m));
    }
    match &env.args.mac {
        Some(s) => s
            .parse::<Mac>()
            .map(Some)
            .map_err(|r| Error::env("CNI_ARGS", format!("MAC={s}"), r)),
        None => Ok(None),
    }
}

/// The ADD's result: both ends of the pair and the IPAM addresses on the
/// pod's (spec section 5: with a prevResult, it with ours merged in).
fn result(conf: &NetConf, s: &Setup<'_>, ipam_result: CniResult, made: &Made) -> Value {
    let ours = CniResult {
        interfaces: vec![
            Interface {
                name: s.host_ifname.to_string(),
                mac: Some(fmt_mac(made.host_mac)),
                mtu: Some(made.mtu),
                ..Default::default()
            },
            Interface {
                name: s.id.ifname.clone(),
                mac: Some(fmt_mac(made.pod_mac)),
                mtu: Some(made.mtu),
                sandbox: Some(s.pod_ns.path().display().to_string()),
                ..Default::default()
            },
        ],
        ips: ipam_result
            .ips
            .iter()
            .map(|i| IpConfig {
                interface: Some(1),
                ..i.clone()
            })
            .collect(),
        routes: ipam_result.routes,
        // runtimeConfig.dns, then config dns, then what IPAM found (bridge plugin order).
        dns: conf
            .runtime
            .dns
            .clone()
            .or_else(|| conf.dns.clone())
            .unwrap_or(ipam_result.dns),
    };
    // Spec section 5: with a prevResult, output it with our changes included.
    let result = match &conf.prev_result {
        Some(prev) => {
            let mut r = prev.clone();
            r.merge(ours);
            r
        }
        None => ours,
    };
    result.to_json(conf.cni_version)
}

pub fn fmt_mac(m: [u8; 6]) -> String {
    Mac(m).to_string()
}
