//! ADD: reserve addresses, create and configure the veth pair, attach the
//! datapath, record what was made, print the result. Any failure after the
//! preconditions undoes everything this ADD made (and, per spec section 4, runs
//! DEL on a delegated IPAM plugin).

use serde_json::Value;
use sluice_maps::{hostport::node_addrs_kept_by_agent, PinRoot};

use super::del::teardown;
use crate::{
    cni::{
        config::NetConf,
        env::Env,
        result::{CniResult, Interface, IpConfig},
        runtime_config::Mac,
        AttachmentId,
    },
    datapath::{self, masquerade, Attachment, Datapath, NodeSettings, PodDevice},
    error::Error,
    gateway, interface,
    ipam::Ipam,
    netlink::Netlink,
    netns::Netns,
    node,
    state::{host_veth_name, AttachmentRecord, PodRef, StateStore},
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
    let ctx = AddCtx {
        conf,
        id,
        ipam: &ipam,
        store: &store,
        host_ifname: &host_ifname,
        pod_ns: &pod_ns,
        host_nl: &host_nl,
        pod_nl: &pod_nl,
        pod: pod.as_ref(),
    };
    steps.done("ipam");
    match add_steps(&ctx, ipam_result, pod_mac, &mut steps).await {
        Ok(r) => Ok(r),
        Err(e) => {
            if let Err(undo) = teardown(conf, id, &ipam, &store, &host_nl).await {
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

/// Everything an ADD works with once its preconditions hold.
struct AddCtx<'a> {
    conf: &'a NetConf,
    id: &'a AttachmentId,
    ipam: &'a Ipam,
    store: &'a StateStore,
    host_ifname: &'a str,
    pod_ns: &'a Netns,
    host_nl: &'a Netlink,
    pod_nl: &'a Netlink,
    pod: Option<&'a PodRef>,
}

/// Everything after IPAM; any error here is undone by a full teardown.
async fn add_steps(
    ctx: &AddCtx<'_>,
    ipam_result: CniResult,
    pod_mac: Option<Mac>,
    steps: &mut Steps,
) -> Result<Value, Error> {
    let AddCtx {
        conf,
        id,
        ipam,
        store,
        host_ifname,
        pod_ns,
        host_nl,
        pod_nl,
        pod,
    } = *ctx;
    if ipam_result.ips.is_empty() {
        return Err(Error::Delegate {
            plugin: ipam.name().to_string(),
            code: 999,
            msg: "IPAM returned no addresses".into(),
            details: String::new(),
        });
    }
    let gws = interface::gateways(&ipam_result.ips);
    // Recorded before anything else exists, so a crash from here on leaves a
    // record that DEL and GC can follow.
    let mut record = AttachmentRecord {
        container_id: id.container_id.clone(),
        ifname: id.ifname.clone(),
        netns: Some(pod_ns.path().display().to_string()),
        host_ifname: host_ifname.to_string(),
        host_ifindex: None,
        ips: ipam_result.ips.iter().map(|i| i.address).collect(),
        gateways: gws.clone(),
        ipam: ipam.name().to_string(),
        port_mappings: conf.runtime.port_mappings.clone(),
        bandwidth: conf.bandwidth,
        created_unix: datapath::now_unix(),
        complete: false,
        pod: pod.cloned(),
    };
    store.save(&record)?;
    steps.done("record");

    let uplink = node::uplink(host_nl, conf.uplink.as_deref()).await?;
    let mtu = match conf.mtu {
        Some(m) => m,
        None => node::uplink_mtu(host_nl, uplink.as_ref()).await?,
    };
    steps.done("uplink");
    let pair = interface::create(
        host_nl,
        pod_nl,
        pod_ns,
        host_ifname,
        &id.ifname,
        mtu,
        pod_mac.map(|m| m.0),
        conf.pod_device,
    )
    .await?;
    steps.done("veth");
    // Saved with the final record; a DEL after a crash before that finds the
    // veth by its derived name, and its map entries by the veth's index.
    record.host_ifindex = Some(pair.host.index);

    interface::configure_pod(pod_nl, &pair, &ipam_result.ips, &ipam_result.routes, &gws).await?;
    steps.done("pod addressing");
    interface::configure_host(host_nl, &pair, &ipam_result.ips, &gws).await?;
    steps.done("host addressing");
    node::enable_forwarding(&ipam_result.ips)?;
    node::ensure_remote_routes(host_nl, &conf.nodes).await?;
    // Without GRO the pod end would drop XDP-redirected frames; the uplink's XDP
    // program then leaves this pod's traffic to tc. A netkit device takes no
    // XDP frames at all (no `ndo_xdp_xmit`).
    let xdp_ready = !pair.netkit
        && match interface::enable_gro(pod_ns, &id.ifname) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("sluice: {e}; XDP will not deliver to this pod");
                false
            }
        };

    let fq = datapath::bandwidth::prepare_device(
        pod_nl,
        pair.pod.index,
        conf.bandwidth.as_ref(),
        &id.container_id,
    )
    .await?;
    steps.done("forwarding, GRO, fq");
    let host_mac = pair.host.mac.unwrap_or_default();
    let pod_mac = pair.pod.mac.unwrap_or_default();
    let ips: Vec<_> = ipam_result.ips.iter().map(|i| i.address.ip()).collect();
    let dp = Datapath::new(&conf.pin_root);
    let settings = node_settings(conf, host_nl, uplink, mtu, ipam, &ipam_result.ips).await?;
    steps.done("node settings");
    let prepared = dp.prepare(host_nl, &settings).await?;
    gateway::readd(host_nl, &gws).await?;
    steps.done("datapath prepare");
    // A conflict on a hostPort fails the ADD, whose rollback removes the rest.
    dp.attach(
        &prepared,
        &Attachment {
            id,
            host_ifname,
            host_ifindex: pair.host.index,
            host_mac,
            pod_mac,
            ips: &ips,
            netns_ino: pod_ns.inode(),
            xdp_ready,
            attach: conf.pod_attach,
            netkit: pair.netkit,
            port_mappings: &conf.runtime.port_mappings,
            bandwidth: conf.bandwidth.as_ref(),
            device: Some(PodDevice {
                ns: pod_ns,
                nl: pod_nl,
                ifname: &id.ifname,
                ifindex: pair.pod.index,
                fq,
            }),
        },
    )?;
    steps.done("datapath attach");
    // Loaded where nothing was pinned (a new node, or a datapath lost with its
    // pins): the pods attached before are re-attached.
    if prepared.fresh() {
        let n = crate::repair::repair(&dp, &prepared, conf, store, host_nl, id).await?;
        if n > 0 {
            eprintln!("sluice: re-attached {n} pods to the new datapath");
        }
    }

    record.complete = true;
    store.rewrite(&record)?;
    steps.done("record complete");

    let ours = CniResult {
        interfaces: vec![
            Interface {
                name: host_ifname.to_string(),
                mac: Some(fmt_mac(host_mac)),
                mtu: Some(mtu),
                ..Default::default()
            },
            Interface {
                name: id.ifname.clone(),
                mac: Some(fmt_mac(pod_mac)),
                mtu: Some(mtu),
                sandbox: Some(pod_ns.path().display().to_string()),
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
        routes: ipam_result.routes.clone(),
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
    Ok(result.to_json(conf.cni_version))
}

/// What the node-wide part of the datapath is to be for this ADD.
async fn node_settings(
    conf: &NetConf,
    host_nl: &Netlink,
    uplink: Option<datapath::Uplink>,
    mtu: u32,
    ipam: &Ipam,
    ips: &[IpConfig],
) -> Result<NodeSettings, Error> {
    let maps_ports = !conf.runtime.port_mappings.is_empty();
    Ok(NodeSettings {
        masq: masquerade::spec(conf, host_nl, uplink.as_ref(), ipam, ips).await?,
        services: datapath::services::spec(conf, ipam, ips)?,
        uplink,
        xdp: conf.xdp,
        pod_mtu: mtu,
        nat_flows: conf.masq.max_flows,
        host_port_cgroup: if maps_ports {
            Some(conf.host_port_cgroup.clone().ok_or_else(|| {
                Error::config(
                    "hostPortCgroup",
                    "null",
                    "no cgroup v2 hierarchy is mounted on this node; mount one or name a cgroup v2 directory",
                )
            })?)
        } else {
            None
        },
        node_addrs: if maps_ports && !node_addrs_kept_by_agent(&PinRoot::new(&conf.pin_root)) {
            // Read here only without the node agent, which follows the
            // kernel's address events: the read walks the `local` table, which
            // the kernel shares with `main` (one route per pod) until a policy
            // rule splits them, so it grew with the pods (28 -> 165 µs, 20 ->
            // 1,000 pods). IPv6 addresses only for a pod with an IPv6 side.
            let v6 = ips.iter().any(|c| c.address.is_ipv6());
            Some(host_nl.local_addrs(v6).await?)
        } else {
            None
        },
        debug: conf.debug,
    })
}

pub fn fmt_mac(m: [u8; 6]) -> String {
    Mac(m).to_string()
}
