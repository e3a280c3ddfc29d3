//! Frames no kernel would send, made by hand and sent with an `AF_PACKET` socket
//! from inside a pod (to its host veth's MAC, its gateway neighbour, so that they
//! reach `from_pod`) or from the external host to the node's uplink: truncated
//! and inconsistent headers, non-IP, IPv4 options and fragments, TTL 1, and a
//! bounded flood. Each must be counted under its reason, the well-formed odd
//! ones must arrive, and nothing may break: CHECK passes, `sluicectl` works,
//! TCP still flows.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
#![expect(
    clippy::cast_possible_truncation,
    reason = "test packets and ports: values fit"
)]
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use sluice_tests::{
    fixtures::{add, check, del, external_host, EXT_IF, EXT_IP, UPLINK},
    look,
    raw::{
        ethernet, parse_mac, send_frames, udp, Ipv4, UdpReceiver, ETH_P_EXPERIMENTAL, ETH_P_IP,
        ETH_P_IPV6, IP_MF,
    },
    traffic::{tcp_echo, tcp_echo_via},
    Counters, Node,
};

/// Frames of the flood.
const FLOOD: usize = 3000;
/// How long the UDP receivers wait for what must arrive.
const RECEIVE: Duration = Duration::from_secs(5);

fn v4(ip: IpAddr) -> Ipv4Addr {
    match ip {
        IpAddr::V4(v) => v,
        IpAddr::V6(v) => panic!("{v} is not IPv4"),
    }
}

/// Who sends to whom on the wire.
#[derive(Clone, Copy)]
struct Ends {
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
}

impl Ends {
    fn frame(&self, ethertype: u16, payload: &[u8]) -> Vec<u8> {
        ethernet(self.dst_mac, self.src_mac, ethertype, payload)
    }

    fn ip(&self, p: &Ipv4) -> Vec<u8> {
        self.frame(ETH_P_IP, &p.build())
    }

    fn udp(&self, port: u16, data: &[u8]) -> Ipv4 {
        Ipv4::new(self.src, self.dst, udp(40000, port, data))
    }

    /// Frames whose IP header cannot be read as it claims: each must be dropped
    /// as `drop_malformed`.
    fn malformed(&self) -> Vec<(&'static str, Vec<u8>)> {
        let good = self.udp(9, b"malformed").build();
        let mut ihl15 = self.udp(9, b"").build();
        ihl15.truncate(28);
        ihl15.extend_from_slice(&[0, 0]);
        ihl15[0] = 0x4f; // IHL 15: a 60-byte header...
        ihl15[2..4].copy_from_slice(&30u16.to_be_bytes()); // ...in a 30-byte packet
        let mut short_total = self.udp(9, b"short").build();
        short_total[2..4].copy_from_slice(&10u16.to_be_bytes()); // total < header
        let mut v6_in_v4 = good.clone();
        v6_in_v4[0] = 0x65; // version 6 under EtherType IPv4
        let mut v6_short = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6_short.extend_from_slice(&[0xfd; 12]); // 20 of IPv6's 40 header bytes
        vec![
            ("Ethernet header only", self.frame(ETH_P_IP, &[])),
            (
                "IPv4 header cut at 10 bytes",
                self.frame(ETH_P_IP, &good[..10]),
            ),
            (
                "IPv4 IHL 15 in a 30-byte packet",
                self.frame(ETH_P_IP, &ihl15),
            ),
            (
                "IPv4 total length below the header length",
                self.frame(ETH_P_IP, &short_total),
            ),
            ("IPv4 EtherType, version 6", self.frame(ETH_P_IP, &v6_in_v4)),
            (
                "IPv6 header cut at 20 bytes",
                self.frame(ETH_P_IPV6, &v6_short),
            ),
        ]
    }

    /// Frames that are not IP: `pass_not_ip`.
    fn not_ip(&self) -> Vec<(&'static str, Vec<u8>)> {
        let arp = [
            0, 1, 8, 0, 6, 4, 0, 1, // Ethernet/IPv4 request
        ]
        .iter()
        .copied()
        .chain(self.src_mac)
        .chain(self.src.octets())
        .chain([0; 6])
        .chain(self.dst.octets())
        .collect::<Vec<u8>>();
        vec![
            (
                "local experimental EtherType",
                self.frame(ETH_P_EXPERIMENTAL, &[0x5a; 46]),
            ),
            ("ARP request", self.frame(0x0806, &arp)),
        ]
    }

    /// A UDP datagram to `port` with IPv4 options (NOP, NOP, NOP, EOL).
    fn with_options(&self, port: u16, data: &[u8]) -> Vec<u8> {
        let mut p = self.udp(port, data);
        p.options = vec![1, 1, 1, 0];
        self.ip(&p)
    }

    /// A UDP datagram to `port` in two fragments (the first and a later one).
    fn fragments(&self, port: u16, data: &[u8]) -> [Vec<u8>; 2] {
        let dgram = udp(40000, port, data);
        let cut = 48; // a multiple of 8
        assert!(dgram.len() > cut);
        let mut first = Ipv4::new(self.src, self.dst, dgram[..cut].to_vec());
        first.ident = 0x4242;
        first.frag = IP_MF;
        let mut later = Ipv4::new(self.src, self.dst, dgram[cut..].to_vec());
        later.ident = 0x4242;
        later.frag = (cut / 8) as u16;
        [self.ip(&first), self.ip(&later)]
    }

    /// A UDP datagram to `port` with TTL 1.
    fn ttl1(&self, port: u16) -> Vec<u8> {
        let mut p = self.udp(port, b"ttl 1");
        p.ttl = 1;
        self.ip(&p)
    }

    /// `n` frames cycling through the malformed and non-IP ones: (frames,
    /// malformed among them, non-IP among them).
    fn flood(&self, n: usize) -> (Vec<Vec<u8>>, u64, u64) {
        let kinds: Vec<(bool, Vec<u8>)> = self
            .malformed()
            .into_iter()
            .map(|(_, f)| (true, f))
            .chain(self.not_ip().into_iter().map(|(_, f)| (false, f)))
            .collect();
        let (mut malformed, mut not_ip) = (0, 0);
        let frames = (0..n)
            .map(|i| {
                let (bad, f) = &kinds[i % kinds.len()];
                if *bad {
                    malformed += 1;
                } else {
                    not_ip += 1;
                }
                f.clone()
            })
            .collect();
        (frames, malformed, not_ip)
    }
}

/// The datagrams the odd-but-valid frames carry; all must arrive.
fn payloads() -> (Vec<u8>, Vec<u8>) {
    let options = b"with IPv4 options".to_vec();
    let fragmented: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(3)).collect();
    (options, fragmented)
}

#[track_caller]
fn assert_rose(d: &Counters, reason: &str, at_least: u64) {
    assert!(
        d.get(reason) >= at_least,
        "{reason} rose by {}, expected at least {at_least}; counters that rose: {d}",
        d.get(reason)
    );
}

#[test]
fn hostile_frames_from_a_pod_are_counted_and_harmless() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.94.1.0/24");
    let added_a = add(&node, &conf, "hostile-a", &a);
    let added_b = add(&node, &conf, "hostile-b", &b);
    let ends = Ends {
        dst_mac: parse_mac(&added_a.host_mac).unwrap(),
        src_mac: parse_mac(&added_a.pod_mac).unwrap(),
        src: v4(added_a.ip()),
        dst: v4(added_b.ip()),
    };

    let rx = UdpReceiver::start(&b.path, SocketAddr::new(added_b.ip(), 0), 2, RECEIVE).unwrap();
    let port = rx.addr.port();
    let (options, fragmented) = payloads();
    let malformed = ends.malformed();
    let not_ip = ends.not_ip();
    let mut frames: Vec<Vec<u8>> = malformed.iter().map(|(_, f)| f.clone()).collect();
    frames.extend(not_ip.iter().map(|(_, f)| f.clone()));
    frames.push(ends.with_options(port, &options));
    frames.extend(ends.fragments(port, &fragmented));
    frames.push(ends.ttl1(port));
    let sent = frames.len() as u64;

    let c0 = node.counters().unwrap();
    let e0 = node.endpoints().unwrap();
    send_frames(&a.path, "eth0", frames).unwrap();
    let got: BTreeSet<Vec<u8>> = rx.finish().unwrap().into_iter().collect();
    let d = node.counters().unwrap().since(&c0);
    eprintln!("hostile frames from a pod: {d}");

    assert_eq!(
        d.get("drop_malformed"),
        malformed.len() as u64,
        "drop_malformed must count each of {:?} once: {d}",
        malformed.iter().map(|(n, _)| *n).collect::<Vec<_>>()
    );
    assert_rose(&d, "pass_not_ip", not_ip.len() as u64);
    // Options: 1, fragments: 2.
    assert_rose(&d, "ipv4_options_or_fragment", 3);
    assert_rose(&d, "pass_ttl", 1);
    // The options packet and both fragments went straight into pod b...
    assert_rose(&d, "from_pod_to_local_pod", 3);
    // ...which got both datagrams (the fragments reassembled), and not the TTL-1 one.
    let want: BTreeSet<Vec<u8>> = [options, fragmented].into_iter().collect();
    assert_eq!(got, want, "datagrams pod b received");
    // from_pod saw every frame.
    let e1 = node.endpoints().unwrap();
    let from_pod = |eps: &[serde_json::Value]| {
        eps.iter()
            .find(|e| e["ip"] == added_a.ip().to_string().as_str())
            .and_then(|e| e["fromPodPackets"].as_u64())
            .unwrap_or_else(|| panic!("no endpoint {}: {eps:?}", added_a.ip()))
    };
    assert!(
        from_pod(&e1) - from_pod(&e0) >= sent,
        "pod a's fromPodPackets rose by {}, {sent} frames were sent",
        from_pod(&e1) - from_pod(&e0)
    );

    // A bounded flood of the malformed and non-IP frames.
    let (flood, flood_bad, flood_not_ip) = ends.flood(FLOOD);
    let c1 = node.counters().unwrap();
    assert_eq!(send_frames(&a.path, "eth0", flood).unwrap(), FLOOD);
    let d = node.counters().unwrap().since(&c1);
    eprintln!("flood from a pod: {d}");
    assert_eq!(d.get("drop_malformed"), flood_bad, "flood: {d}");
    assert_rose(&d, "pass_not_ip", flood_not_ip);

    // Nothing broke.
    check(&node, &conf, "hostile-a", &a, &added_a);
    check(&node, &conf, "hostile-b", &b, &added_b);
    let st = node.status().unwrap();
    assert_eq!(st["endpoints"], 2, "{st:#}");
    tcp_echo(&b, added_b.ip(), &a, 128 << 10).unwrap();
    tcp_echo(&a, added_a.ip(), &b, 128 << 10).unwrap();
    del(&node, &conf, "hostile-a", &a);
    del(&node, &conf, "hostile-b", &b);
}

/// An IPv4 header whose IHL claims 60 bytes, in a frame that holds 30 of them, and
/// a total length that claims 60 too: the header is truncated, whatever the
/// total length says.
#[test]
fn ipv4_header_longer_than_the_frame_is_dropped_as_malformed() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.94.2.0/24");
    let added_a = add(&node, &conf, "trunc-a", &a);
    let added_b = add(&node, &conf, "trunc-b", &b);
    let ends = Ends {
        dst_mac: parse_mac(&added_a.host_mac).unwrap(),
        src_mac: parse_mac(&added_a.pod_mac).unwrap(),
        src: v4(added_a.ip()),
        dst: v4(added_b.ip()),
    };
    let mut p = ends.udp(9, b"").build();
    p.truncate(28);
    p.extend_from_slice(&[0, 0]);
    p[0] = 0x4f; // IHL 15: 60 bytes of header
    p[2..4].copy_from_slice(&60u16.to_be_bytes()); // total length 60; 30 bytes follow
    let c0 = node.counters().unwrap();
    send_frames(&a.path, "eth0", vec![ends.frame(ETH_P_IP, &p)]).unwrap();
    let d = node.counters().unwrap().since(&c0);
    assert_eq!(
        d.get("drop_malformed"),
        1,
        "an IPv4 header of 60 claimed bytes in a 30-byte packet was not dropped as \
         malformed; counters that rose: {d}"
    );
    assert_eq!(d.get("from_pod_to_local_pod"), 0, "it was delivered: {d}");
}

/// The same kinds of frames from the external host to the node's uplink MAC: the
/// XDP program hands what it does not take to tc, which counts and drops or
/// passes; fragments for a pod arrive.
fn hostile_on_the_uplink(subnet: &str, xdp: &str) {
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    if xdp == "native" {
        sluice_tests::host::tx_checksum_off(&ext.netns_path(), EXT_IF).unwrap();
    }
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    conf["uplink"] = serde_json::json!(UPLINK);
    conf["xdp"] = serde_json::json!(xdp);
    let added = add(&node, &conf, "hup-a", &a);
    let ends = Ends {
        dst_mac: parse_mac(&look::mac(node.name(), UPLINK).unwrap()).unwrap(),
        src_mac: parse_mac(&look::mac(ext.name(), EXT_IF).unwrap()).unwrap(),
        src: EXT_IP.parse().unwrap(),
        dst: v4(added.ip()),
    };
    let rx = UdpReceiver::start(&a.path, SocketAddr::new(added.ip(), 0), 2, RECEIVE).unwrap();
    let port = rx.addr.port();
    let (options, fragmented) = payloads();
    let malformed = ends.malformed();
    let not_ip = ends.not_ip();
    let mut frames: Vec<Vec<u8>> = malformed.iter().map(|(_, f)| f.clone()).collect();
    frames.extend(not_ip.iter().map(|(_, f)| f.clone()));
    frames.push(ends.with_options(port, &options));
    frames.extend(ends.fragments(port, &fragmented));
    frames.push(ends.ttl1(port));
    let (flood, flood_bad, flood_not_ip) = ends.flood(FLOOD);

    let c0 = node.counters().unwrap();
    send_frames(&ext.netns_path(), EXT_IF, frames).unwrap();
    let got: BTreeSet<Vec<u8>> = rx.finish().unwrap().into_iter().collect();
    assert_eq!(
        send_frames(&ext.netns_path(), EXT_IF, flood).unwrap(),
        FLOOD
    );
    let d = node.counters().unwrap().since(&c0);
    eprintln!("hostile frames on the uplink (xdp {xdp}): {d}");
    let xdp = sluice_tests::kernel::xdp_mode(xdp);

    let bad = malformed.len() as u64 + flood_bad;
    assert_eq!(d.get("drop_malformed"), bad, "uplink: {d}");
    // Non-IP (ARP included) is the kernel's.
    assert_rose(&d, "pass_not_ip", not_ip.len() as u64 + flood_not_ip);
    assert_rose(&d, "pass_ttl", 1);
    if xdp != "off" {
        // XDP handed every malformed and non-IP frame and the TTL-1 one to tc.
        assert_rose(
            &d,
            "xdp_pass_to_tc",
            bad + not_ip.len() as u64 + flood_not_ip + 1,
        );
    }
    assert!(
        d.sum(&["xdp_to_pod", "uplink_to_pod"]) >= 3,
        "the options packet and fragments did not go into the pod: {d}"
    );
    let want: BTreeSet<Vec<u8>> = [options, fragmented].into_iter().collect();
    assert_eq!(got, want, "datagrams the pod received");

    check(&node, &conf, "hup-a", &a, &added);
    node.status().unwrap();
    let ip = added.ip();
    tcp_echo_via(
        &a.path,
        SocketAddr::new(ip, 0),
        &ext.netns_path(),
        SocketAddr::new(ip, 0),
        128 << 10,
    )
    .unwrap();
    del(&node, &conf, "hup-a", &a);
}

#[test]
fn hostile_frames_on_the_uplink_generic_xdp() {
    hostile_on_the_uplink("10.94.3.0/24", "generic");
}

#[test]
fn hostile_frames_on_the_uplink_native_xdp() {
    hostile_on_the_uplink("10.94.4.0/24", "native");
}

#[test]
fn hostile_frames_on_the_uplink_without_xdp() {
    hostile_on_the_uplink("10.94.5.0/24", "off");
}

/// IPv4 with options and fragments coming in through the uplink are counted as
/// they are from a pod.
#[test]
fn options_and_fragments_on_the_uplink_are_counted() {
    let subnet = "10.94.6.0/24";
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    let a = node.pod("a").unwrap();
    let conf = node.conf("1.0.0", subnet);
    let added = add(&node, &conf, "hopt-a", &a);
    let ends = Ends {
        dst_mac: parse_mac(&look::mac(node.name(), UPLINK).unwrap()).unwrap(),
        src_mac: parse_mac(&look::mac(ext.name(), EXT_IF).unwrap()).unwrap(),
        src: EXT_IP.parse().unwrap(),
        dst: v4(added.ip()),
    };
    let rx = UdpReceiver::start(&a.path, SocketAddr::new(added.ip(), 0), 2, RECEIVE).unwrap();
    let port = rx.addr.port();
    let (options, fragmented) = payloads();
    let mut frames = vec![ends.with_options(port, &options)];
    frames.extend(ends.fragments(port, &fragmented));
    let c0 = node.counters().unwrap();
    send_frames(&ext.netns_path(), EXT_IF, frames).unwrap();
    assert_eq!(
        rx.finish().unwrap().len(),
        2,
        "the pod did not get both datagrams"
    );
    let d = node.counters().unwrap().since(&c0);
    assert_rose(&d, "ipv4_options_or_fragment", 3);
}

/// A pod sending with a source that is not its own — another pod's address, the
/// node's gateway address, an outside address — is dropped (`drop_spoofed`,
/// counted for the sending pod too) and nothing arrives; its own address still
/// works. This also keeps a pod from reaching a hostPort or another pod with the
/// node's address as its source.
#[test]
fn spoofed_sources_from_a_pod_are_dropped_and_counted() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.94.3.0/24");
    let added_a = add(&node, &conf, "spoof-a", &a);
    let added_b = add(&node, &conf, "spoof-b", &b);
    let gateway = v4(added_a.gateways[0]);
    let own = Ends {
        dst_mac: parse_mac(&added_a.host_mac).unwrap(),
        src_mac: parse_mac(&added_a.pod_mac).unwrap(),
        src: v4(added_a.ip()),
        dst: v4(added_b.ip()),
    };
    let forged = [
        v4(added_b.ip()),               // pod b itself: a reflection
        gateway,                        // the node
        Ipv4Addr::new(10, 94, 3, 200),  // a free address of the pod range
        Ipv4Addr::new(198, 51, 100, 7), // the outside
    ];

    let rx = UdpReceiver::start(&b.path, SocketAddr::new(added_b.ip(), 0), 1, RECEIVE).unwrap();
    let port = rx.addr.port();
    let mut frames: Vec<Vec<u8>> = forged
        .iter()
        .map(|src| Ends { src: *src, ..own }.ip(&Ends { src: *src, ..own }.udp(port, b"forged")))
        .collect();
    frames.push(own.ip(&own.udp(port, b"own")));
    let c0 = node.counters().unwrap();
    assert_eq!(
        send_frames(&a.path, "eth0", frames).unwrap(),
        forged.len() + 1
    );
    let got = rx.finish().unwrap();
    let d = node.counters().unwrap().since(&c0);
    assert_eq!(got, vec![b"own".to_vec()], "what pod b received: {got:?}");
    assert_eq!(d.get("drop_spoofed"), forged.len() as u64, "{d}");

    // Counted for the pod that sent them.
    let v = node
        .sluicectl_json(&["counters", "--json", "--pod", &added_a.ip().to_string()])
        .unwrap();
    let drops = &v["endpoints"][0]["drops"]["drop_spoofed"];
    assert!(
        drops.as_u64().is_some_and(|n| n >= forged.len() as u64),
        "pod a's drop_spoofed: {v:#}"
    );
    // Pod b sent nothing forged.
    let v = node
        .sluicectl_json(&["counters", "--json", "--pod", &added_b.ip().to_string()])
        .unwrap();
    assert!(
        v["endpoints"][0]["drops"].get("drop_spoofed").is_none(),
        "{v:#}"
    );

    // Real traffic is untouched.
    tcp_echo(&b, added_b.ip(), &a, 64 << 10).unwrap();
    del(&node, &conf, "spoof-a", &a);
    del(&node, &conf, "spoof-b", &b);
}

/// The same for IPv6: a dual-stack pod that gives itself an IPv6 address IPAM
/// did not allocate (or another pod's) and sends from it is dropped and
/// counted; its own IPv6 address still works. (Link-local sources pass:
/// neighbour discovery needs them.)
#[test]
fn spoofed_ipv6_sources_from_a_pod_are_dropped_and_counted() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let mut conf = node.conf("1.0.0", "10.94.4.0/24");
    conf["ipam"] = serde_json::json!({
        "type": "sluice",
        "ranges": [[{"subnet": "10.94.4.0/24"}], [{"subnet": "fd00:94:4::/64"}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        "dataDir": node.ipam_dir(),
    });
    let added_a = add(&node, &conf, "spoof6-a", &a);
    let added_b = add(&node, &conf, "spoof6-b", &b);
    let v6_of = |ips: &[(IpAddr, u8)]| {
        ips.iter()
            .find_map(|(ip, _)| ip.is_ipv6().then_some(*ip))
            .expect("an IPv6 address")
    };
    let (a6, b6) = (v6_of(&added_a.ips), v6_of(&added_b.ips));
    let forged: IpAddr = "fd00:94:4::99".parse().unwrap();
    let a_ns = a.path.file_name().unwrap().to_string_lossy().to_string();
    sluice_tests::host::ip(
        &a_ns,
        &[
            "-6",
            "addr",
            "add",
            "fd00:94:4::99/128",
            "dev",
            "eth0",
            "nodad",
        ],
    )
    .unwrap();
    // First, the path carries pod a's own datagrams: CI saw the single "own"
    // datagram below lost once under load, right after the ADDs, and it did
    // not happen again in many runs here; a try that needs more than one
    // says so, with the counters, for the next look. Bounded retries.
    let warm = (0..5).any(|attempt| {
        if attempt > 0 {
            eprintln!(
                "warm-up datagram {attempt} lost; counters: {}",
                node.counters().unwrap()
            );
        }
        let rx =
            UdpReceiver::start(&b.path, SocketAddr::new(b6, 0), 1, Duration::from_secs(1)).unwrap();
        let u = sluice_tests::masq::udp_socket(&a.path, SocketAddr::new(a6, 0)).unwrap();
        u.send_to(b"warm", rx.addr).unwrap();
        !rx.finish().unwrap().is_empty()
    });
    assert!(
        warm,
        "no UDP datagram from {a6} reached pod b at {b6} in 5 tries"
    );
    // The counters before the receiver starts: reading them runs sluicectl,
    // which must not eat into the receiver's window.
    let c0 = node.counters().unwrap();
    let rx = UdpReceiver::start(&b.path, SocketAddr::new(b6, 0), 2, RECEIVE).unwrap();
    let to = rx.addr;
    for (src, what) in [(forged, b"forged".as_slice()), (a6, b"own".as_slice())] {
        let u = sluice_tests::masq::udp_socket(&a.path, SocketAddr::new(src, 0)).unwrap();
        u.send_to(what, to).unwrap();
    }
    let got = rx.finish().unwrap();
    let d = node.counters().unwrap().since(&c0);
    assert_eq!(
        got,
        vec![b"own".to_vec()],
        "what pod b received: {got:?}; counters since: {d}"
    );
    assert!(d.get("drop_spoofed") >= 1, "{d}");
    let v = node
        .sluicectl_json(&["counters", "--json", "--pod", &a6.to_string()])
        .unwrap();
    let drops = &v["endpoints"][0]["drops"]["drop_spoofed"];
    assert!(
        drops.as_u64().is_some_and(|n| n >= 1),
        "pod a's drop_spoofed: {v:#}"
    );
    del(&node, &conf, "spoof6-a", &a);
    del(&node, &conf, "spoof6-b", &b);
}
