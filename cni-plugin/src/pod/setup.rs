//! What an ADD makes once its preconditions hold and IPAM gave addresses, in
//! order: the record (first, so a crash leaves something DEL and GC can
//! follow), the pair, both ends' addressing, the node's forwarding and remote
//! routes, GRO and `fq` in the pod, the node-wide datapath, the pod's
//! attachment, a repair of the other pods when the datapath was loaded anew,
//! the record completed. The caller undoes a failure with [`super::teardown`].
use sluice_maps::{hostport::node_addrs_kept_by_agent, PinRoot};

use crate::{
    cni::{
        config::NetConf,
        result::{CniResult, IpConfig},
        runtime_config::Mac,
        AttachmentId,
    },
    datapath::{self, masquerade, Attachment, Datapath, NodeSettings},
    error::Error,
    gateway, interface,
    ipam::Ipam,
    netlink::Netlink,
    netns::Netns,
    node,
    state::{AttachmentRecord, PodRef, StateStore},
    timing::Steps,
};

/// Everything an ADD works with once its preconditions hold.
pub struct Setup<'a> {
    pub conf: &'a NetConf,
    pub id: &'a AttachmentId,
    pub ipam: &'a Ipam,
    pub store: &'a StateStore,
    pub host_ifname: &'a str,
    pub pod_ns: &'a Netns,
    pub host_nl: &'a Netlink,
    pub pod_nl: &'a Netlink,
    pub pod: Option<&'a PodRef>,
    /// The MAC the runtime asked for (`mac` capability, `CNI_ARGS MAC=`).
    pub pod_mac: Option<Mac>,
}

/// What the result needs of the pair [`setup`] made.
pub struct Made {
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    pub mtu: u32,
}

/// Attaches the pod `s` describes with the addresses IPAM gave
/// (`ipam_result`). Any error leaves what was made for a teardown.
pub async fn setup(
    s: &Setup<'_>,
    ipam_result: &CniResult,
    steps: &mut Steps,
) -> Result<Made, Error> {
    let Setup {
        conf,
        id,
        ipam,
        store,
        host_ifname,
        pod_ns,
        host_nl,
        pod_nl,
        pod,
        pod_mac,
    } = *s;
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
    let made = Made {
        host_mac: pair.host.mac.unwrap_or_default(),
        pod_mac: pair.pod.mac.unwrap_or_default(),
        mtu,
    };
    let dp = Datapath::new(&conf.pin_root);
    let settings = node_settings(conf, host_nl, uplink, mtu, ipam, &ipam_result.ips).await?;
    steps.done("node settings");
    let prepared = dp.prepare(host_nl, &settings).await?;
    gateway::readd(host_nl, &gws).await?;
    steps.done("datapath prepare");
    // A conflict on a hostPort fails the ADD, whose rollback removes the rest.
    let mut attachment = Attachment::paired(
        conf,
        id,
        record.addrs(),
        (&pair.host, &pair.pod),
        (pod_ns, pod_nl),
        fq,
    );
    attachment.xdp_ready = xdp_ready;
    dp.attach(&prepared, &attachment)?;
    steps.done("datapath attach");
    // Loaded where nothing was pinned (a new node, or a datapath lost with its
    // pins): the pods attached before are re-attached.
    if prepared.fresh() {
        let n = super::repair(&dp, &prepared, conf, store, host_nl, id).await?;
        if n > 0 {
            eprintln!("sluice: re-attached {n} pods to the new datapath");
        }
    }

    record.complete = true;
    store.rewrite(&record)?;
    steps.done("record complete");
    Ok(made)
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
