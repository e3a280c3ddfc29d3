//! containerd end to end (issue 13): Debian's containerd 1.6 with its CRI plugin
//! and runc, in a node namespace of the test's own, driven through the CRI gRPC
//! API as the kubelet drives it (see `harness/cri.rs`), with Sluice as the only
//! plugin of its conflist, and the same with the reference chain
//! (bridge + host-local + portmap + bandwidth) as a check of the instrument.
//!
//! Three pods: `web` with a hostPort (18080 -> 8080/tcp) running busybox httpd,
//! `limited` with both bandwidth annotations (10M), `plain` with neither. What
//! is checked: the CNI result reached containerd (`PodSandboxStatus` has the
//! address); pod to pod (plain -> web, the server sees plain's address); to an
//! external namespace, masqueraded (the external server sees the node's
//! address); external to the hostPort (the pod sees the external client); the
//! limited pod's rates both ways within a band around 10 Mbit/s while the plain
//! pod is much faster; and that `StopPodSandbox` + `RemovePodSandbox` leave nothing:
//! pod namespaces, veths, records, reservations, endpoints, hostPort mappings,
//! bandwidth entries.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    net::{IpAddr, Ipv4Addr},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_tests::{
    bandwidth::{bw_get, bw_list, default_burst_bits, iperf3, Measured},
    cri::{Containerd, PodSpec, Sandbox},
    exec,
    fixtures::{external_host, EXT_IP, NODE_IP, UPLINK},
    host::Host,
    hostport::{ports_list, Cgroup},
    look, oci, Node, NETWORK,
};

const CIDR: &str = "10.95.0.0/24";
const HOST_PORT: u16 = 18080;
/// Port of the external namespace's web server.
const EXT_PORT: u16 = 8081;
/// The bandwidth annotations' value and what it means in bit/s.
const LIMIT: &str = "10M";
const LIMIT_BPS: u64 = 10_000_000;
/// The limited pod's measured rate must lie within these multiples of the
/// limit (generous: a shared 2-core machine; the bandwidth tests pin it down).
const LOW: f64 = 0.5;
const HIGH: f64 = 1.4;
/// Seconds of each iperf3 run.
const SECS: u32 = 4;
/// Longest wait for the external web server to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(10);

/// Which CNI plugins containerd runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Chain {
    Sluice,
    Reference,
}

/// The node namespace, the external host, the hostPort cgroup and containerd.
/// containerd is dropped first: removing its pods runs CNI DEL in the node.
struct World {
    ctrd: Containerd,
    ext: Host,
    _ext_web: exec::Running,
    _cgroup: Cgroup,
    node: Node,
    chain: Chain,
}

fn conflist(node: &Node, chain: Chain, cgroup: &Cgroup) -> Value {
    match chain {
        Chain::Sluice => {
            let mut p = node.conf("1.0.0", CIDR);
            if let Some(o) = p.as_object_mut() {
                o.remove("cniVersion");
                o.remove("name");
            }
            p["uplink"] = json!(UPLINK);
            p["ipMasq"] = json!(true);
            p["hostPortCgroup"] = json!(cgroup.display());
            p["capabilities"] = json!({"portMappings": true, "bandwidth": true});
            json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": [p]})
        }
        Chain::Reference => json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": node.ipam_dir(),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
                {"type": "bandwidth", "capabilities": {"bandwidth": true}},
            ],
        }),
    }
}

fn plugins(chain: Chain) -> Vec<PathBuf> {
    match chain {
        Chain::Sluice => vec![sluice_tests::sluice_bin().unwrap()],
        Chain::Reference => ["bridge", "host-local", "portmap", "bandwidth"]
            .iter()
            .map(|p| sluice_tests::reference_plugin(p).unwrap())
            .collect(),
    }
}

/// The external namespace's web root: a CGI script answering `ext <client>`.
fn ext_web_root(dir: &Path) -> PathBuf {
    let root = dir.join("ext-www");
    let cgi = root.join("cgi-bin");
    std::fs::create_dir_all(&cgi).unwrap();
    let script = cgi.join("whoami");
    std::fs::write(
        &script,
        "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\necho \"ext $REMOTE_ADDR\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}

impl World {
    fn new(chain: Chain) -> Self {
        let node = Node::new().unwrap();
        let ext = external_host(&node, CIDR).unwrap();
        let cgroup = Cgroup::new().unwrap();
        let root = ext_web_root(node.dir());
        let ext_web = exec::spawn(
            Some(&ext.netns_path()),
            Path::new(oci::BUSYBOX),
            &[
                "httpd",
                "-f",
                "-p",
                &format!("{EXT_IP}:{EXT_PORT}"),
                "-h",
                &root.display().to_string(),
            ],
            &[],
            b"",
        )
        .unwrap();
        wait_listening(&ext.netns_path(), EXT_PORT);
        let ctrd = Containerd::start(
            &node.netns_path(),
            &node.dir().join("containerd"),
            &conflist(&node, chain, &cgroup),
            &plugins(chain),
        )
        .unwrap();
        Self {
            ctrd,
            ext,
            _ext_web: ext_web,
            _cgroup: cgroup,
            node,
            chain,
        }
    }

    #[track_caller]
    fn run_pod(&self, spec: &PodSpec) -> Sandbox {
        self.ctrd
            .run_pod(spec)
            .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", self.ctrd.log_tail(20)))
    }

    #[track_caller]
    fn run_container(&self, sb: &Sandbox, name: &str, cmd: &[&str]) -> String {
        self.ctrd
            .run_container(sb, name, cmd)
            .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", self.ctrd.log_tail(20)))
    }

    /// `wget` of `url` from container `cid`: what the server answered. (No
    /// `-T`: Debian's static busybox 1.35 crashes with it; `ExecSync`'s timeout
    /// bounds the wait.)
    #[track_caller]
    fn fetch_from(&self, cid: &str, url: &str) -> String {
        let r = self
            .ctrd
            .exec(cid, &["wget", "-q", "-O", "-", url], 20)
            .unwrap();
        assert_eq!(r.exit_code, 0, "wget {url} in {cid}: {r:?}");
        unmapped(&r.stdout)
    }

    /// `wget` of `url` from the external namespace.
    #[track_caller]
    fn fetch_from_ext(&self, url: &str) -> String {
        let out = exec::tool(
            Some(&self.ext.netns_path()),
            oci::BUSYBOX,
            &["wget", "-q", "-O", "-", url],
        )
        .unwrap_or_else(|e| panic!("wget {url} from the external host: {e}"));
        unmapped(&out)
    }
}

/// An answer of the `whoami` scripts with the client address as IPv4: busybox
/// httpd listens on a dual-stack socket and reports `[::ffff:a.b.c.d]`.
fn unmapped(answer: &str) -> String {
    answer.trim().replace("[::ffff:", "").replace(']', "")
}

#[track_caller]
fn wait_listening(netns: &Path, port: u16) {
    let deadline = Instant::now() + LISTEN_WAIT;
    loop {
        if look::listening(netns, port).unwrap() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on port {port} in {} after {LISTEN_WAIT:?}",
            netns.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn v4(ip: IpAddr) -> Ipv4Addr {
    match ip {
        IpAddr::V4(v) => v,
        IpAddr::V6(v) => panic!("expected an IPv4 pod address, got {v}"),
    }
}

/// Asserts that `bps` is within [`LOW`, `HIGH`] x the limit.
#[track_caller]
fn assert_band(what: &str, bps: f64, m: &Measured) {
    let r = LIMIT_BPS as f64;
    println!("{what}: limit {LIMIT}, {m}, ratio {:.3}", bps / r);
    assert!(
        bps >= LOW * r && bps <= HIGH * r,
        "{what}: {:.2} Mbit/s ({m}) is outside [{LOW}, {HIGH}] x {LIMIT_BPS} bit/s",
        bps / 1e6
    );
}

/// The rate after the first second, bit/s.
fn steady_bps(m: &Measured) -> f64 {
    let rest = m.interval_bits.get(1..).unwrap_or_default();
    rest.iter().sum::<f64>() / (rest.len().max(1) as f64)
}

/// Checks a limited pod's run. Sluice: the whole run within the band, so the
/// 4294967295 "no burst" containerd sends did not become a burst at line rate.
/// The reference bandwidth plugin takes that value as a burst of 4294967295
/// bits (512 MiB): its first second runs at line rate, so only its steady state
/// is held to the band (and the test prints what the first second carried).
#[track_caller]
fn assert_limited(chain: Chain, what: &str, m: &Measured) {
    let what = format!("{chain:?}: {what}");
    match chain {
        Chain::Sluice => {
            assert_band(&what, m.received_bps, m);
            assert!(
                m.first_second_bps() < 2.0 * LIMIT_BPS as f64,
                "{what}: the first second carried a burst: {m}"
            );
        }
        Chain::Reference => {
            assert_band(&format!("{what} after the first second"), steady_bps(m), m);
            println!(
                "{what}: first second {:.1} Mbit (the reference's burst)",
                m.first_second_bps() / 1e6
            );
        }
    }
}

/// The whole scenario of the module documentation on `chain`.
fn pods_through_containerd(chain: Chain) {
    let w = World::new(chain);
    let bw = |k: &str| (format!("kubernetes.io/{k}-bandwidth"), LIMIT.to_string());
    let web = w.run_pod(&PodSpec::new("web").host_port(HOST_PORT, oci::WEB_PORT, "tcp"));
    let mut limited = PodSpec::new("limited");
    limited.annotations = vec![bw("ingress"), bw("egress")];
    let limited = w.run_pod(&limited);
    let plain = w.run_pod(&PodSpec::new("plain"));
    let pods = [&web, &limited, &plain];
    for p in pods {
        assert!(p.netns.exists(), "{p:?}");
        println!(
            "{chain:?}: pod {} is {} in {}",
            p.name,
            p.ip,
            p.netns.display()
        );
    }
    w.run_container(&web, "httpd", &oci::HTTPD);
    let plain_c = w.run_container(&plain, "client", &["/bin/sleep", "3600"]);
    wait_listening(&web.netns, oci::WEB_PORT);

    if chain == Chain::Sluice {
        // What Sluice made of containerd's Go-spelled capability arguments.
        let ends = w.node.endpoints().unwrap();
        assert_eq!(ends.len(), 3, "{ends:#?}");
        let ports = ports_list(&w.node, &[]).unwrap();
        assert_eq!(ports.len(), 1, "{ports:#?}");
        let mapping = ports[0].to_string();
        assert!(
            mapping.contains(&HOST_PORT.to_string())
                && mapping.contains(&format!("{}", web.ip))
                && mapping.contains(&oci::WEB_PORT.to_string()),
            "{mapping}"
        );
        let limits = bw_get(&w.node, &limited.ip.to_string()).unwrap();
        // containerd sends 4294967295 as "no burst": the default burst applies.
        let want = json!({"rate": LIMIT_BPS, "burst": default_burst_bits(LIMIT_BPS)});
        for dir in ["ingress", "egress"] {
            assert_eq!(limits[dir]["rate"], want["rate"], "{dir}: {limits:#}");
            assert_eq!(limits[dir]["burst"], want["burst"], "{dir}: {limits:#}");
        }
        assert_eq!(
            bw_list(&w.node).unwrap().len(),
            1,
            "only `limited` is limited"
        );
    }

    // Pod to pod: the server sees the client pod's own address.
    let url = format!("http://{}:{}{}", web.ip, oci::WEB_PORT, oci::WHOAMI);
    let got = w.fetch_from(&plain_c, &url);
    assert_eq!(got, format!("pod web {}", plain.ip), "pod to pod");

    // To the external namespace: masqueraded to the node's address.
    let url = format!("http://{EXT_IP}:{EXT_PORT}{}", oci::WHOAMI);
    let got = w.fetch_from(&plain_c, &url);
    assert_eq!(
        got,
        format!("ext {NODE_IP}"),
        "pod to external, masqueraded"
    );

    // External to the hostPort: reaches the web pod, which sees the client.
    let url = format!("http://{NODE_IP}:{HOST_PORT}{}", oci::WHOAMI);
    let got = w.fetch_from_ext(&url);
    assert_eq!(got, format!("pod web {EXT_IP}"), "external to hostPort");

    // Bandwidth: the limited pod both ways, the plain pod for comparison.
    let ext_ns = w.ext.netns_path();
    let ext_ip: Ipv4Addr = EXT_IP.parse().unwrap();
    let ingress = iperf3(&ext_ns, ext_ip, &limited.netns, SECS, &[]).unwrap();
    let egress = iperf3(&limited.netns, v4(limited.ip), &ext_ns, SECS, &[]).unwrap();
    let free = iperf3(&ext_ns, ext_ip, &plain.netns, SECS, &[]).unwrap();
    println!("{chain:?}: unlimited pod ingress: {free}");
    assert_limited(chain, "limited pod ingress", &ingress);
    assert_limited(chain, "limited pod egress", &egress);
    assert!(
        free.received_bps > 3.0 * LIMIT_BPS as f64,
        "the plain pod is limited too: {free}"
    );

    // The kubelet removes the pods: nothing may be left.
    for p in pods {
        w.ctrd.remove_pod(p).unwrap();
        assert!(!p.netns.exists(), "{} still exists", p.netns.display());
    }
    let links = look::link_names(w.node.name()).unwrap();
    match w.chain {
        Chain::Sluice => {
            w.node.assert_clean(NETWORK);
            assert!(w.node.endpoints().unwrap().is_empty(), "endpoints left");
            assert!(
                ports_list(&w.node, &[]).unwrap().is_empty(),
                "mappings left"
            );
            assert!(
                bw_list(&w.node).unwrap().is_empty(),
                "bandwidth entries left"
            );
            assert!(
                links.iter().all(|l| ["lo", UPLINK].contains(&l.as_str())),
                "links left in the node: {links:?}"
            );
        }
        Chain::Reference => {
            // The reference leaves its bridge (and the ifb of bandwidth goes with
            // the pod); every pod veth must be gone.
            assert!(
                links
                    .iter()
                    .all(|l| ["lo", UPLINK, "cni0"].contains(&l.as_str())),
                "links left in the node: {links:?}"
            );
        }
    }
}

#[test]
fn containerd_runs_pods_on_sluice() {
    pods_through_containerd(Chain::Sluice);
}

#[test]
fn containerd_runs_pods_on_the_reference_chain() {
    pods_through_containerd(Chain::Reference);
}
