//! The Kubernetes install path end to end (issue 19): the image `cargo xtask
//! image` builds, imported into a real containerd (Debian's, CRI plugin, runc,
//! as in `tests/cri.rs`) that starts with no network at all. The DaemonSet's
//! init container is run the way the kubelet runs it: a host-network pod, the
//! image's `sluice-node install`, the node's CNI directories mounted from the
//! host as `deploy/kubernetes/sluice.yaml` mounts them, `NODE_NAME` set, and the
//! Kubernetes API reached as a pod reaches it in a cluster: in-cluster config,
//! `KUBERNETES_SERVICE_HOST`/`_PORT` and the service account's token and CA
//! mounted at `/var/run/secrets/kubernetes.io/serviceaccount`, over HTTPS with a
//! certificate that CA signed (the API server is the stand-in of
//! `harness/apiserver.rs`: no kube-apiserver can be had from the registries
//! here). Then containerd must find the network by itself, and a pod must be
//! attached through the installed binary with an address from the Node's
//! `spec.podCIDRs` and answer from outside the node. The DaemonSet's other two
//! containers run next, with the manifest's capabilities and mounts: route-sync
//! makes the route to another Node's pods, the metrics container counts the
//! pod. Installing the same image again changes nothing; installing an image
//! whose plugin embeds another eBPF object replaces the binary, the next pod's
//! ADD upgrades the running datapath in place, and the first pod serves on.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use ipnetwork::IpNetwork;
use serde_json::{json, Value};
use sluice_tests::{
    apiserver::ApiServer,
    cri::{ContainerSpec, Containerd, HostMount, PodSpec, Sandbox},
    exec,
    fixtures::{external_host, NODE_IP, UPLINK},
    look, oci,
    prometheus::http_get,
    Node,
};

const CIDR: &str = "10.98.0.0/24";
const NODE_NAME: &str = "node-install";
/// The image's reference (`cargo xtask image`; the manifest's `image:`).
const IMAGE: &str = concat!("localhost/sluice:", env!("CARGO_PKG_VERSION"));
/// The same image with another eBPF object in its plugin (`SLUICE_NEXT_BIN`):
/// an upgrade.
const IMAGE_NEXT: &str = concat!("localhost/sluice:", env!("CARGO_PKG_VERSION"), "-next");
const INSTALL_WAIT: Duration = Duration::from_mins(1);
/// Where a pod finds its service account (token, ca.crt, namespace).
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const TOKEN: &str = "sluice-test-token";
/// Where the metrics container listens (in the node's namespace).
const METRICS_PORT: u16 = 19964;
/// Another Node of the cluster, on the uplink's subnet.
const OTHER_CIDR: &str = "10.98.1.0/24";
const OTHER_IP: &str = "192.168.50.9";
const LISTEN_WAIT: Duration = Duration::from_secs(10);

/// A bpffs of the test's own, mounted shared under the node's directory: the
/// node's bpffs as the DaemonSet sees it. containerd refuses `HostToContainer`
/// for a private source mount, and this machine's `/sys/fs/bpf` is private (a
/// systemd host's is shared); making our own mount shared changes nothing else.
/// Dropped before the node: pins removed, then unmounted.
struct OwnBpffs {
    path: PathBuf,
}

impl OwnBpffs {
    fn mount(at: PathBuf) -> Self {
        fs::create_dir(&at).unwrap();
        exec::tool(
            None,
            "mount",
            &["-t", "bpf", "bpf", &at.display().to_string()],
        )
        .unwrap();
        let me = Self { path: at };
        exec::tool(
            None,
            "mount",
            &["--make-shared", &me.path.display().to_string()],
        )
        .unwrap();
        me
    }

    /// The datapath's pin root on it, as the host sees it.
    fn pin_root(&self) -> PathBuf {
        self.path.join("sluice")
    }
}

impl Drop for OwnBpffs {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(self.pin_root()) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("cleanup: removing {}: {e}", self.pin_root().display());
            }
        }
        if let Err(e) = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("cleanup: unmounting {}: {e}", self.path.display());
        }
        let _ = fs::remove_dir(&self.path);
    }
}

/// `sluicectl args --json` on the datapath pinned at `pin_root`.
fn sluicectl_json(node: &Node, pin_root: &std::path::Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = node.sluicectl_at(pin_root, &all).unwrap();
    assert!(out.success(), "{out}");
    serde_json::from_str(&out.stdout).unwrap()
}

/// `sluicectl endpoints --json` of the datapath pinned at `pin_root`.
fn endpoints(node: &Node, pin_root: &std::path::Path) -> Vec<Value> {
    sluicectl_json(node, pin_root, &["endpoints"])
        .as_array()
        .cloned()
        .unwrap()
}

/// The image archive `cargo xtask test` built, from `$var`.
fn image_archive(var: &str) -> PathBuf {
    let p = PathBuf::from(
        std::env::var_os(var)
            .unwrap_or_else(|| panic!("{var} (cargo xtask test builds the image)")),
    );
    assert!(p.is_file(), "no image archive at {}", p.display());
    p
}

/// The pinned datapath's object hash (`sluicectl status --json`).
fn pinned_hash(node: &Node, pin_root: &std::path::Path) -> String {
    sluicectl_json(node, pin_root, &["status"])["objectHash"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// What the DaemonSet's `sluice-node` containers get: `NODE_NAME` (downward
/// API), the in-cluster API address the kubelet sets, and `extra`.
fn pod_env(api: &ApiServer, extra: (&str, String)) -> Vec<(String, String)> {
    vec![
        ("NODE_NAME".into(), NODE_NAME.into()),
        ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT".into(), api.port().to_string()),
        (extra.0.into(), extra.1),
    ]
}

/// Runs the image's `sluice-node install` as the DaemonSet's init container;
/// its exit code and log.
fn install(
    ctrd: &Containerd,
    node: &Node,
    bpffs: &OwnBpffs,
    api: &ApiServer,
    sa_dir: &std::path::Path,
    (image, attempt): (&str, u32),
) -> (i32, String) {
    let pod = ctrd
        .run_pod(&PodSpec::new(&format!("sluice-install-{attempt}")).host_network())
        .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)));
    // What the ConfigMap's plugin-config would carry, plus this test's own
    // pin root and directories (nothing machine-wide).
    let plugin_config = json!({
        "uplink": UPLINK,
        "pinRoot": bpffs.pin_root(),
        "stateDir": node.state_dir(),
        "ipam": {"dataDir": node.ipam_dir()},
    });
    let spec = ContainerSpec {
        name: "install".into(),
        image: image.into(),
        command: vec!["/usr/local/bin/sluice-node".into(), "install".into()],
        env: pod_env(api, ("SLUICE_PLUGIN_CONFIG", plugin_config.to_string())),
        mounts: vec![
            HostMount::new(ctrd.cni_bin_dir(), "/host/opt/cni/bin"),
            HostMount::new(ctrd.cni_conf_dir(), "/host/etc/cni/net.d"),
            HostMount::new(sa_dir, SERVICE_ACCOUNT).readonly(),
        ],
        // The manifest's: every capability dropped.
        capabilities: Some(Vec::new()),
    };
    let id = ctrd
        .run_container_spec(&pod, &spec)
        .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)));
    let done = ctrd
        .wait_exited(&pod, &id, "install", INSTALL_WAIT)
        .unwrap();
    ctrd.remove_pod(&pod).unwrap();
    done
}

/// Starts the DaemonSet's two long-running containers in a host-network pod,
/// with the manifest's capabilities and mounts: `route-sync` (in-cluster
/// config) and `metrics` on 127.0.0.1:[`METRICS_PORT`]. The pod and the
/// containers' ids.
fn run_agents(
    ctrd: &Containerd,
    node: &Node,
    bpffs: &OwnBpffs,
    api: &ApiServer,
    sa_dir: &std::path::Path,
) -> (Sandbox, Vec<String>) {
    let pod = ctrd
        .run_pod(&PodSpec::new("sluice").host_network())
        .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)));
    // Inside, the node's bpffs is at /sys/fs/bpf, as the manifest mounts it.
    let pin_root = "/sys/fs/bpf/sluice".to_string();
    let bpffs = HostMount::new(&bpffs.path, "/sys/fs/bpf").host_to_container();
    let route_sync = ContainerSpec {
        name: "route-sync".into(),
        image: IMAGE.into(),
        command: vec!["/usr/local/bin/sluice-node".into(), "route-sync".into()],
        env: pod_env(api, ("SLUICE_PIN_ROOT", pin_root.clone())),
        mounts: vec![
            bpffs.clone(),
            HostMount::new(sa_dir, SERVICE_ACCOUNT).readonly(),
            HostMount::new(node.state_dir(), "/var/lib/cni/sluice").readonly(),
            HostMount::new("/run/netns", "/run/netns")
                .host_to_container()
                .readonly(),
        ],
        capabilities: Some(vec!["NET_ADMIN".into(), "BPF".into(), "SYS_ADMIN".into()]),
    };
    let metrics = ContainerSpec {
        name: "metrics".into(),
        image: IMAGE.into(),
        command: ["/usr/local/bin/sluicectl", "metrics", "--listen"]
            .into_iter()
            .map(String::from)
            .chain([format!("127.0.0.1:{METRICS_PORT}")])
            .collect(),
        env: vec![("SLUICE_PIN_ROOT".into(), pin_root)],
        // The node's state directory where the manifest mounts the host's
        // /var/lib/cni/sluice (the conflist's stateDir here is the node's).
        mounts: vec![
            bpffs,
            HostMount::new(node.state_dir(), "/var/lib/cni/sluice").readonly(),
        ],
        capabilities: Some(vec!["BPF".into()]),
    };
    let ids = [route_sync, metrics]
        .iter()
        .map(|c| {
            ctrd.run_container_spec(&pod, c)
                .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)))
        })
        .collect();
    (pod, ids)
}

#[track_caller]
fn wait_listening(pod: &Sandbox, port: u16) {
    let deadline = Instant::now() + LISTEN_WAIT;
    while !look::listening(&pod.netns, port).unwrap() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port} in {}",
            pod.name
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// `wget` from the external host of the pod's whoami script.
fn fetch(ext: &std::path::Path, pod: &Sandbox) -> String {
    let url = format!("http://{}:{}{}", pod.ip, oci::WEB_PORT, oci::WHOAMI);
    exec::tool(Some(ext), oci::BUSYBOX, &["wget", "-q", "-O", "-", &url])
        .unwrap_or_else(|e| panic!("wget {url} from the external host: {e}"))
}

#[test]
fn the_image_installs_sluice_and_containerd_attaches_pods_with_it() {
    let node = Node::new().unwrap();
    let bpffs = OwnBpffs::mount(node.dir().join("bpffs"));
    let ext = external_host(&node, CIDR).unwrap();
    let api =
        ApiServer::start_tls(&node.netns_path(), "127.0.0.1:0", &node.dir().join("pki")).unwrap();
    api.set_node(NODE_NAME, &[CIDR], &[NODE_IP]);
    // What the kubelet mounts into a pod of a service account.
    let sa_dir = node.dir().join("serviceaccount");
    fs::create_dir(&sa_dir).unwrap();
    fs::copy(api.ca_cert().unwrap(), sa_dir.join("ca.crt")).unwrap();
    fs::write(sa_dir.join("token"), TOKEN).unwrap();
    fs::write(sa_dir.join("namespace"), "kube-system").unwrap();

    let ctrd = Containerd::start_with(
        &node.netns_path(),
        &node.dir().join("containerd"),
        None,
        &[],
        &[
            image_archive("SLUICE_IMAGE_ARCHIVE"),
            image_archive("SLUICE_IMAGE_NEXT_ARCHIVE"),
        ],
    )
    .unwrap();
    let plugin = ctrd.cni_bin_dir().join("sluice");
    assert!(!plugin.exists());

    let (code, log) = install(&ctrd, &node, &bpffs, &api, &sa_dir, (IMAGE, 1));
    assert_eq!(code, 0, "install failed:\n{log}");
    assert!(
        log.contains(&format!("Node \"{NODE_NAME}\" spec.podCIDRs: {CIDR}")),
        "{log}"
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with(&format!("GET /api/v1/nodes/{NODE_NAME}"))),
        "{:?}",
        api.requests()
    );
    // Over TLS (the stand-in only understands HTTPS here), with the token.
    assert!(
        api.authorizations()
            .iter()
            .all(|a| a == &format!("Bearer {TOKEN}"))
            && !api.authorizations().is_empty(),
        "{:?}",
        api.authorizations()
    );
    // The plugin the image carries, executable; the conflist from the Node.
    assert_eq!(
        fs::read(&plugin).unwrap(),
        fs::read(sluice_tests::sluice_bin().unwrap()).unwrap(),
        "the installed plugin is not the one built"
    );
    assert_eq!(
        fs::metadata(&plugin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let list: Value =
        serde_json::from_slice(&fs::read(ctrd.cni_conf_dir().join("10-sluice.conflist")).unwrap())
            .unwrap();
    assert_eq!(
        list["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], CIDR,
        "{list:#}"
    );
    // Nothing else was left in the host directories (no temporary files).
    let names = |d: PathBuf| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(ctrd.cni_conf_dir()), ["10-sluice.conflist"]);
    assert_eq!(names(ctrd.cni_bin_dir()), ["loopback", "sluice"]);

    // containerd finds the network by itself and attaches a pod through it.
    ctrd.wait_network_ready()
        .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)));
    let web = ctrd
        .run_pod(&PodSpec::new("web"))
        .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)));
    let cidr: IpNetwork = CIDR.parse().unwrap();
    assert!(
        cidr.contains(web.ip),
        "pod address {} outside {CIDR}",
        web.ip
    );
    ctrd.run_container(&web, "httpd", &oci::HTTPD).unwrap();
    wait_listening(&web, oci::WEB_PORT);
    let answer = fetch(&ext.netns_path(), &web);
    assert!(answer.contains("pod web"), "{answer}");
    let eps = endpoints(&node, &bpffs.pin_root());
    assert!(
        eps.iter().any(|e| e["ip"] == web.ip.to_string()),
        "the pod is not an endpoint of the datapath: {eps:?}"
    );

    // The DaemonSet's other two containers, as the manifest runs them: a
    // route to the other Node's pods, and /metrics counting the pod.
    api.set_node("node-other", &[OTHER_CIDR], &[OTHER_IP]);
    let (agents, agent_ids) = run_agents(&ctrd, &node, &bpffs, &api, &sa_dir);
    let routed = || {
        look::ip_json(node.name(), &["route", "show", "proto", "83"])
            .unwrap()
            .iter()
            .any(|r| r["dst"] == OTHER_CIDR && r["gateway"] == OTHER_IP)
    };
    let deadline = Instant::now() + INSTALL_WAIT;
    while !routed() {
        assert!(
            Instant::now() < deadline,
            "no route to {OTHER_CIDR} via {OTHER_IP}\ncontainerd:\n{}",
            ctrd.log_tail(20)
        );
        thread::sleep(Duration::from_millis(100));
    }
    let scrape = || http_get(&node.netns_path(), METRICS_PORT, "/metrics");
    let deadline = Instant::now() + LISTEN_WAIT;
    let text = loop {
        match scrape() {
            Ok(t) => break t,
            Err(e) => assert!(
                Instant::now() < deadline,
                "scraping the metrics container: {e}"
            ),
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert!(text.lines().any(|l| l == "sluice_endpoints 1"), "{text}");
    // The pod by its name, as containerd passed it in CNI_ARGS.
    assert!(
        text.contains("sluice_endpoint_packets_total{namespace=\"sluice-test\",pod=\"web\","),
        "{text}"
    );
    assert!(text.contains("sluice_datapath_info{"), "{text}");
    // route-sync sweeps the NAT tables and keeps the node's addresses with
    // the manifest's capabilities (both leases held), and gives both back
    // when stopped.
    let status = || {
        let out = node
            .sluicectl_at(&bpffs.path.join("sluice"), &["status", "--json"])
            .unwrap();
        assert!(out.success(), "{out}");
        serde_json::from_str::<Value>(&out.stdout).unwrap()
    };
    let sweep = || status()["natSweep"].clone();
    let deadline = Instant::now() + LISTEN_WAIT;
    while sweep()["by"] != "agent" || status()["hostPort"]["nodeAddressesBy"] != "agent" {
        assert!(
            Instant::now() < deadline,
            "route-sync holds not both leases: {}",
            status()
        );
        thread::sleep(Duration::from_millis(100));
    }
    // Deleted as the kubelet deletes a pod: its containers stopped with a
    // grace period first.
    for id in &agent_ids {
        ctrd.stop_container(id, 10).unwrap();
    }
    ctrd.remove_pod(&agents).unwrap();
    assert!(routed(), "the route went with the agent");
    let s = sweep();
    assert_eq!(
        s["agentLeaseSeconds"], 0.0,
        "route-sync kept its lease: {s}"
    );
    let hp = status()["hostPort"].clone();
    assert_eq!(
        hp["nodeAddressesBy"], "add",
        "route-sync kept its lease: {hp}"
    );

    // An upgrade with the same image: nothing to write, the pod keeps serving.
    let (code, log) = install(&ctrd, &node, &bpffs, &api, &sa_dir, (IMAGE, 2));
    assert_eq!(code, 0, "second install failed:\n{log}");
    assert_eq!(log.matches("already up to date").count(), 2, "{log}");
    let answer = fetch(&ext.netns_path(), &web);
    assert!(answer.contains("pod web"), "{answer}");

    // An upgrade: an image whose plugin embeds another eBPF object. The
    // binary is replaced, the conflist is not; the next ADD (a new pod) loads
    // the new programs into the running datapath, and the first pod keeps
    // serving across it.
    let (code, log) = install(&ctrd, &node, &bpffs, &api, &sa_dir, (IMAGE_NEXT, 3));
    assert_eq!(code, 0, "upgrade install failed:\n{log}");
    assert!(log.contains("wrote /host/opt/cni/bin/sluice"), "{log}");
    assert_eq!(log.matches("already up to date").count(), 1, "{log}");
    let next = sluice_tests::sluice_next_bin().unwrap();
    assert_eq!(
        fs::read(&plugin).unwrap(),
        fs::read(&next).unwrap(),
        "the upgrade did not install the next plugin"
    );
    let before = pinned_hash(&node, &bpffs.pin_root());
    let next_hash = sluice_tests::embedded_object_hash(&next).unwrap();
    assert_ne!(before, next_hash);
    let web2 = ctrd
        .run_pod(&PodSpec::new("web2"))
        .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", ctrd.log_tail(20)));
    ctrd.run_container(&web2, "httpd", &oci::HTTPD).unwrap();
    wait_listening(&web2, oci::WEB_PORT);
    assert_eq!(pinned_hash(&node, &bpffs.pin_root()), next_hash);
    for pod in [&web, &web2] {
        let answer = fetch(&ext.netns_path(), pod);
        assert!(answer.contains(&format!("pod {}", pod.name)), "{answer}");
    }

    ctrd.remove_pod(&web2).unwrap();
    ctrd.remove_pod(&web).unwrap();
    assert!(endpoints(&node, &bpffs.pin_root()).is_empty());
}
