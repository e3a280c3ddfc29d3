//! `runtimeConfig`: capability arguments a runtime passes (CNI conventions):
//! `portMappings`, `bandwidth`, `ipRanges`, `mac`, `ips`, `dns`. Unknown keys are
//! accepted; a known key with a bad value is code 7 naming the key and the value.
use std::{fmt, net::IpAddr, str::FromStr};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    keys::{Field, Fields, Match},
    result::Dns,
};
use crate::error::Error;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub port_mappings: Vec<PortMapping>,
    pub bandwidth: Option<Bandwidth>,
    pub ip_ranges: Option<IpRanges>,
    pub mac: Option<Mac>,
    pub ips: Vec<IpAddr>,
    pub dns: Option<Dns>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// IANA protocol number (the value in the IP header).
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        })
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Self::Tcp),
            "udp" => Ok(Self::Udp),
            "sctp" => Ok(Self::Sctp),
            _ => Err("protocol must be tcp, udp or sctp".into()),
        }
    }
}

/// One `portMappings` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// `None`: every node address.
    #[serde(default, rename = "hostIP", skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<IpAddr>,
}

/// `bandwidth`: rates in bits per second, bursts in bits (CNI conventions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_burst: Option<u64>,
}

/// Largest burst: 4 GiB in bytes, as the reference bandwidth plugin (tbf) allows.
pub const MAX_BURST_BITS: u64 = sluice_common::bw_limits::MAX_BURST_BITS;
/// Largest rate: 1 Tbit/s; beyond that the token arithmetic would overflow.
pub const MAX_RATE_BPS: u64 = sluice_common::bw_limits::MAX_RATE_BITS;

/// Burst values runtimes send when the user gave a rate only: Kubernetes'
/// bandwidth annotations carry no burst, so each runtime fills in "as much as
/// possible". Taken literally they would let a pod send seconds at line rate
/// before the limit bites (containerd's 4294967295 bits is 43 s of a 100 Mbit/s
/// limit), so Sluice reads them as "no burst given" and uses its default burst.
///
/// | value | who sends it |
/// | --- | --- |
/// | 2147483647 (`math.MaxInt32`) | dockershim-era kubelet, some CNI runtimes |
/// | 4294967295 (`math.MaxUint32`) | containerd's CRI (`toCNIBandWidth`) |
/// | 34359738359 (`math.MaxUint32*8 - 1`) | CRI-O (`getBandwidth`, 1.22+) |
/// | 34359738360 (`math.MaxUint32*8`) | CRI-O before the `- 1` |
pub const RUNTIME_UNSET_BURSTS: [u64; 4] = [
    i32::MAX as u64,
    u32::MAX as u64,
    u32::MAX as u64 * 8 - 1,
    u32::MAX as u64 * 8,
];

impl Bandwidth {
    /// Parses and validates a `bandwidth` object found at `key` (empty: the
    /// plugin config's top level, where the static keys sit).
    ///
    /// Like the reference plugin, a rate of 0 (with no burst, or a burst of 0)
    /// is no limit in that direction: containerd sends `"EgressRate": 0,
    /// "EgressBurst": 0` for a pod with an ingress annotation only. A burst in
    /// [`RUNTIME_UNSET_BURSTS`] counts as no burst.
    pub fn parse(v: &Value, key: &str, matching: Match) -> Result<Self, Error> {
        let f = Fields::of(v, key, matching)?;
        let field = |k: &str| -> Result<(String, Option<u64>), Error> {
            match f.get(k)? {
                None => Ok((f.join(k), None)),
                Some(x) => {
                    let n = x.value.as_u64().ok_or_else(|| {
                        Error::config(
                            &x.path,
                            x.value,
                            "must be a non-negative integer that fits in 64 bits",
                        )
                    })?;
                    Ok((x.path, Some(n)))
                }
            }
        };
        let mut b = Self::default();
        for (dir, rate_slot, burst_slot) in [
            ("ingress", &mut b.ingress_rate, &mut b.ingress_burst),
            ("egress", &mut b.egress_rate, &mut b.egress_burst),
        ] {
            let (rate_key, rate) = field(&format!("{dir}Rate"))?;
            let (burst_key, burst) = field(&format!("{dir}Burst"))?;
            let rate = rate.filter(|r| *r != 0);
            let burst = burst.filter(|b| !RUNTIME_UNSET_BURSTS.contains(b));
            match (rate, burst) {
                (None, None | Some(0)) => {}
                (None, Some(bu)) => {
                    return Err(Error::config(
                        burst_key,
                        bu,
                        format!("is set without a rate ({rate_key} is absent or 0)"),
                    ))
                }
                (Some(r), _) if r > MAX_RATE_BPS => {
                    return Err(Error::config(
                        rate_key,
                        r,
                        format!("must be between 1 and {MAX_RATE_BPS} bits per second"),
                    ))
                }
                (Some(_), Some(bu)) if bu == 0 || bu > MAX_BURST_BITS => {
                    return Err(Error::config(
                        burst_key,
                        bu,
                        format!("must be between 1 and {MAX_BURST_BITS} bits"),
                    ))
                }
                (Some(r), bu) => {
                    *rate_slot = Some(r);
                    *burst_slot = bu;
                }
            }
        }
        Ok(b)
    }

    pub fn is_empty(&self) -> bool {
        self.ingress_rate.is_none() && self.egress_rate.is_none()
    }
}

/// A unicast Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 6];
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err("must be six hex octets separated by ':'".into());
        }
        for (o, p) in out.iter_mut().zip(parts) {
            if p.len() != 2 {
                return Err("must be six hex octets separated by ':'".into());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| format!("{p:?} is not a hex octet"))?;
        }
        if out[0] & 1 == 1 {
            return Err("is a multicast address; an interface needs a unicast one".into());
        }
        if out == [0; 6] {
            return Err("is all zeros".into());
        }
        Ok(Self(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Parses a list of `"10.1.0.5"` or `"10.1.0.5/24"` strings (the `ips` capability
/// and `args.cni.ips`); the prefix, if any, is dropped.
pub fn parse_ip_list(v: &Value, key: &str) -> Result<Vec<IpAddr>, Error> {
    let arr = v
        .as_array()
        .ok_or_else(|| Error::config(key, v, "must be a list of IP addresses"))?;
    arr.iter()
        .map(|x| {
            let s = x
                .as_str()
                .ok_or_else(|| Error::config(key, x, "must be a list of strings"))?;
            let ip_part = s.split_once('/').map_or(s, |(ip, _)| ip);
            ip_part
                .parse::<IpAddr>()
                .map_err(|_| Error::config(key, s, "not an IP address"))
        })
        .collect()
}

/// `runtimeConfig.ipRanges` as given: the IPAM config parser reads it with the
/// same rules as `ipam.ranges` (keys matched as Go does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpRanges {
    /// The key path as written (`runtimeConfig.ipRanges`).
    pub path: String,
    pub value: Value,
}

impl IpRanges {
    /// `value` as found at `runtimeConfig.ipRanges`.
    pub fn new(value: Value) -> Self {
        Self {
            path: "runtimeConfig.ipRanges".into(),
            value,
        }
    }
}

impl RuntimeConfig {
    /// Parses the `runtimeConfig` object; keys are matched as Go does (see
    /// [`super::keys`]).
    pub fn parse(v: &Value) -> Result<Self, Error> {
        let f = Fields::of(v, "runtimeConfig", Match::Go)?;
        let mut rc = Self::default();
        if let Some(pm) = f.get("portMappings")? {
            rc.port_mappings = parse_port_mappings(pm.value, &pm.path, Match::Go)?;
        }
        if let Some(b) = f.get("bandwidth")? {
            rc.bandwidth = Some(Bandwidth::parse(b.value, &b.path, Match::Go)?);
        }
        if let Some(r) = f.get("ipRanges")? {
            if !r
                .value
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_array))
            {
                return Err(Error::config(
                    &r.path,
                    r.value,
                    "must be a list of range sets (lists of ranges)",
                ));
            }
            rc.ip_ranges = Some(IpRanges {
                path: r.path,
                value: r.value.clone(),
            });
        }
        if let Some(m) = f.get("mac")? {
            let s = m
                .value
                .as_str()
                .ok_or_else(|| Error::config(&m.path, m.value, "must be a string"))?;
            rc.mac = Some(
                s.parse()
                    .map_err(|r: String| Error::config(&m.path, s, r))?,
            );
        }
        if let Some(ips) = f.get("ips")? {
            rc.ips = parse_ip_list(ips.value, &ips.path)?;
        }
        if let Some(d) = f.get("dns")? {
            rc.dns = Some(Dns::from_runtime(d.value, &d.path)?);
        }
        Ok(rc)
    }
}

/// Parses a `portMappings` list found at `key`: ports 1..=65535, protocol tcp/udp/sctp
/// (default tcp; SCTP keeps its port), `hostIP` an IP address or empty.
/// Duplicates are refused.
pub fn parse_port_mappings(
    v: &Value,
    key: &str,
    matching: Match,
) -> Result<Vec<PortMapping>, Error> {
    let arr = v
        .as_array()
        .ok_or_else(|| Error::config(key, v, "must be a list"))?;
    let mut out: Vec<PortMapping> = Vec::with_capacity(arr.len());
    // (port, protocol, hostIP) seen: a set, lists can hold thousands.
    let mut seen = std::collections::HashSet::with_capacity(arr.len());
    for (i, e) in arr.iter().enumerate() {
        let k = format!("{key}[{i}]");
        let f = Fields::of(e, &k, matching)?;
        let port = |name: &str| -> Result<(String, u16), Error> {
            let x = f
                .get(name)?
                .ok_or_else(|| Error::config(f.join(name), "null", "is required"))?;
            let p = x
                .value
                .as_u64()
                .filter(|p| (1..=65535).contains(p))
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| Error::config(&x.path, x.value, "must be a port 1..65535"))?;
            Ok((x.path, p))
        };
        let (host_port_key, host_port) = port("hostPort")?;
        let (container_port_key, container_port) = port("containerPort")?;
        let protocol = match f.get("protocol")? {
            None => Protocol::Tcp,
            Some(Field {
                value: Value::String(s),
                ..
            }) if s.is_empty() => Protocol::Tcp,
            Some(Field {
                path,
                value: Value::String(s),
            }) => s.parse().map_err(|r: String| Error::config(path, s, r))?,
            Some(x) => return Err(Error::config(x.path, x.value, "must be a string")),
        };
        let host_ip = match f.get("hostIP")? {
            None => None,
            Some(Field {
                value: Value::String(s),
                ..
            }) if s.is_empty() => None,
            Some(Field {
                path,
                value: Value::String(s),
            }) => match s.parse::<IpAddr>() {
                Ok(a) => Some(a),
                Err(_) => return Err(Error::config(path, s, "not an IP address")),
            },
            Some(x) => return Err(Error::config(x.path, x.value, "must be a string")),
        };
        // SCTP's checksum (CRC32c, RFC 4960 6.8) covers the ports and cannot be
        // updated incrementally: an SCTP mapping must keep its port.
        if protocol == Protocol::Sctp && host_port != container_port {
            return Err(Error::config(
                container_port_key,
                container_port,
                format!(
                    "an sctp mapping must keep the port (hostPort {host_port}): SCTP's CRC32c covers the ports"
                ),
            ));
        }
        let pm = PortMapping {
            host_port,
            container_port,
            protocol,
            host_ip,
        };
        if !seen.insert((pm.host_port, pm.protocol, pm.host_ip)) {
            return Err(Error::config(
                host_port_key,
                host_port,
                format!("{protocol} port is mapped twice in this list"),
            ));
        }
        out.push(pm);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_every_capability() {
        let rc = RuntimeConfig::parse(&json!({
            "portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 8000, "containerPort": 8001, "protocol": "UDP", "hostIP": "192.0.2.1"},
                {"hostPort": 9000, "containerPort": 9000}
            ],
            "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 80_000, "egressRate": 2_000_000},
            "ipRanges": [[{"subnet": "10.9.0.0/24"}]],
            "mac": "02:42:ac:11:00:02",
            "ips": ["10.9.0.7/24", "fd00::7"],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
            "someRuntimeKey": {"anything": true}
        }))
        .unwrap();
        assert_eq!(rc.port_mappings.len(), 3);
        assert_eq!(rc.port_mappings[1].protocol, Protocol::Udp);
        assert_eq!(rc.port_mappings[2].protocol, Protocol::Tcp);
        assert_eq!(
            rc.port_mappings[1].host_ip,
            Some("192.0.2.1".parse().unwrap())
        );
        assert_eq!(rc.bandwidth.unwrap().egress_rate, Some(2_000_000));
        assert_eq!(rc.mac.unwrap().to_string(), "02:42:ac:11:00:02");
        assert_eq!(rc.ips.len(), 2);
        assert!(rc.ip_ranges.is_some());
        assert_eq!(rc.dns.unwrap().nameservers, vec!["10.96.0.10"]);
    }

    #[test]
    fn bad_values_name_key_and_value() {
        let cases = [
            (
                json!({"portMappings": {}}),
                "runtimeConfig.portMappings",
                "{}",
            ),
            (
                json!({"portMappings": [{"hostPort": 0, "containerPort": 80}]}),
                "runtimeConfig.portMappings[0].hostPort",
                "0",
            ),
            (
                json!({"portMappings": [{"hostPort": 70000, "containerPort": 80}]}),
                "runtimeConfig.portMappings[0].hostPort",
                "70000",
            ),
            (
                json!({"portMappings": [{"hostPort": 80}]}),
                "runtimeConfig.portMappings[0].containerPort",
                "null",
            ),
            (
                json!({"portMappings": [{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]}),
                "runtimeConfig.portMappings[0].protocol",
                "icmp",
            ),
            (
                json!({"portMappings": [{"hostPort": 80, "containerPort": 80, "hostIP": "300.1.1.1"}]}),
                "runtimeConfig.portMappings[0].hostIP",
                "300.1.1.1",
            ),
            (
                json!({"portMappings": [{"hostPort": 80, "containerPort": 80}, {"hostPort": 80, "containerPort": 81}]}),
                "runtimeConfig.portMappings[1].hostPort",
                "80",
            ),
            (
                json!({"bandwidth": {"ingressRate": 0, "ingressBurst": 100}}),
                "runtimeConfig.bandwidth.ingressBurst",
                "100",
            ),
            (
                json!({"bandwidth": {"ingressRate": 1000, "ingressBurst": 0}}),
                "runtimeConfig.bandwidth.ingressBurst",
                "0",
            ),
            (
                json!({"bandwidth": {"ingressRate": 2_000_000_000_000u64}}),
                "runtimeConfig.bandwidth.ingressRate",
                "2000000000000",
            ),
            (
                json!({"Bandwidth": {"EgressRate": "fast"}}),
                "runtimeConfig.Bandwidth.EgressRate",
                "fast",
            ),
            (
                json!({"portMappings": [{"HostPort": 0, "ContainerPort": 80}]}),
                "runtimeConfig.portMappings[0].HostPort",
                "0",
            ),
            (
                json!({"portMappings": [{"HostPort": 80}]}),
                "runtimeConfig.portMappings[0].containerPort",
                "null",
            ),
            (
                json!({"portMappings": [{"HostPort": 80, "ContainerPort": 80, "Protocol": "icmp"}]}),
                "runtimeConfig.portMappings[0].Protocol",
                "icmp",
            ),
            (
                json!({"portMappings": [{"HostPort": 80, "ContainerPort": 80, "HostIP": "x"}]}),
                "runtimeConfig.portMappings[0].HostIP",
                "x",
            ),
            (
                json!({"portMappings": [{"hostPort": 9999, "containerPort": 9998, "protocol": "sctp"}]}),
                "runtimeConfig.portMappings[0].containerPort",
                "9998",
            ),
            (
                json!({"portMappings": [{"HostPort": 80, "hostport": 81, "ContainerPort": 80}]}),
                "runtimeConfig.portMappings[0].HostPort",
                "81",
            ),
            (
                json!({"dns": {"Servers": ["ns1"]}}),
                "runtimeConfig.dns.Servers",
                "ns1",
            ),
            (
                json!({"dns": {"searches": "x"}}),
                "runtimeConfig.dns.searches",
                "x",
            ),
            (json!({"MAC": "x"}), "runtimeConfig.MAC", "x"),
            (json!({"IPs": ["x"]}), "runtimeConfig.IPs", "x"),
            (
                json!({"IpRanges": [{"Subnet": "10.0.0.0/24"}]}),
                "runtimeConfig.IpRanges",
                "Subnet",
            ),
            (
                json!({"bandwidth": {"egressRate": -5}}),
                "runtimeConfig.bandwidth.egressRate",
                "-5",
            ),
            (
                json!({"bandwidth": {"egressBurst": 100}}),
                "runtimeConfig.bandwidth.egressBurst",
                "100",
            ),
            (
                json!({"bandwidth": {"ingressRate": 1000, "ingressBurst": 1e30}}),
                "runtimeConfig.bandwidth.ingressBurst",
                "1e+30",
            ),
            (
                json!({"bandwidth": {"ingressRate": 1000, "ingressBurst": 40_000_000_000_u64}}),
                "runtimeConfig.bandwidth.ingressBurst",
                "40000000000",
            ),
            (
                json!({"mac": "01:00:5e:00:00:01"}),
                "runtimeConfig.mac",
                "01:00:5e:00:00:01",
            ),
            (
                json!({"mac": "zz:00:00:00:00:01"}),
                "runtimeConfig.mac",
                "zz:00:00:00:00:01",
            ),
            (json!({"mac": 5}), "runtimeConfig.mac", "5"),
            (
                json!({"ips": ["10.1.1.300"]}),
                "runtimeConfig.ips",
                "10.1.1.300",
            ),
            (
                json!({"ipRanges": [{"subnet": "10.0.0.0/24"}]}),
                "runtimeConfig.ipRanges",
                "subnet",
            ),
            (
                json!({"dns": {"nameservers": "x"}}),
                "runtimeConfig.dns.nameservers",
                "x",
            ),
            (json!([]), "runtimeConfig", "[]"),
        ];
        for (v, key, val) in cases {
            let e = RuntimeConfig::parse(&v).unwrap_err();
            assert_eq!(e.code(), 7, "{v}");
            let s = e.to_string();
            assert!(
                s.contains(key) && s.contains(val),
                "{s} should name {key} and {val}"
            );
        }
    }

    /// Every member in every spelling a runtime sends: the conventions'
    /// camelCase, go-cni's Go field names, and any other case (as Go decodes).
    #[test]
    fn every_member_in_every_spelling() {
        fn respell(k: &str, how: usize) -> String {
            match how {
                0 => k.to_string(),
                1 => {
                    let mut c = k.chars();
                    c.next()
                        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                        // go-cni's field names: HostIP, not HostIp.
                        .replace("Ip", "IP")
                }
                2 => k.to_ascii_lowercase(),
                _ => k.to_ascii_uppercase(),
            }
        }
        for how in 0..4 {
            let k = |s: &str| respell(s, how);
            let mut pm = serde_json::Map::new();
            pm.insert(k("hostPort"), json!(8080));
            pm.insert(k("containerPort"), json!(80));
            pm.insert(k("protocol"), json!("UDP"));
            pm.insert(k("hostIP"), json!("192.0.2.1"));
            let mut bw = serde_json::Map::new();
            bw.insert(k("ingressRate"), json!(1_000_000));
            bw.insert(k("ingressBurst"), json!(80_000));
            bw.insert(k("egressRate"), json!(2_000_000));
            bw.insert(k("egressBurst"), json!(4_294_967_295u64));
            let mut dns = serde_json::Map::new();
            dns.insert(k("servers"), json!(["10.96.0.10"]));
            dns.insert(k("searches"), json!(["svc.cluster.local"]));
            dns.insert(k("domain"), json!("cluster.local"));
            dns.insert(k("options"), json!(["ndots:5"]));
            let mut range = serde_json::Map::new();
            range.insert(k("subnet"), json!("10.9.0.0/24"));
            range.insert(k("rangeStart"), json!("10.9.0.10"));
            range.insert(k("rangeEnd"), json!("10.9.0.20"));
            range.insert(k("gateway"), json!("10.9.0.1"));
            let mut rc = serde_json::Map::new();
            rc.insert(k("portMappings"), json!([pm]));
            rc.insert(k("bandwidth"), Value::Object(bw));
            rc.insert(k("dns"), Value::Object(dns));
            rc.insert(k("ipRanges"), json!([[range]]));
            rc.insert(k("mac"), json!("02:42:ac:11:00:02"));
            rc.insert(k("ips"), json!(["10.9.0.15/24"]));
            let v = Value::Object(rc);
            let rc = RuntimeConfig::parse(&v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(
                rc.port_mappings,
                vec![PortMapping {
                    host_port: 8080,
                    container_port: 80,
                    protocol: Protocol::Udp,
                    host_ip: Some("192.0.2.1".parse().unwrap()),
                }],
                "{v}"
            );
            assert_eq!(
                rc.bandwidth,
                Some(Bandwidth {
                    ingress_rate: Some(1_000_000),
                    ingress_burst: Some(80_000),
                    egress_rate: Some(2_000_000),
                    // containerd's "no burst".
                    egress_burst: None,
                }),
                "{v}"
            );
            let dns = rc.dns.unwrap();
            assert_eq!(dns.nameservers, vec!["10.96.0.10"], "{v}");
            assert_eq!(dns.search, vec!["svc.cluster.local"], "{v}");
            assert_eq!(dns.domain.as_deref(), Some("cluster.local"), "{v}");
            assert_eq!(dns.options, vec!["ndots:5"], "{v}");
            assert_eq!(rc.mac.unwrap().to_string(), "02:42:ac:11:00:02", "{v}");
            assert_eq!(rc.ips, vec!["10.9.0.15".parse::<IpAddr>().unwrap()], "{v}");
            // ipRanges is read by the IPAM config with the same key rules.
            let ipam = crate::ipam::config::HostLocalConfig::parse(
                &json!({"subnet": "10.8.0.0/24"}),
                rc.ip_ranges.as_ref(),
            )
            .unwrap_or_else(|e| panic!("{v}: {e}"));
            let first = &ipam.range_sets[0].ranges()[0];
            assert_eq!(first.range_start.to_string(), "10.9.0.10", "{v}");
            assert_eq!(first.range_end.to_string(), "10.9.0.20", "{v}");
            assert_eq!(first.gateway.to_string(), "10.9.0.1", "{v}");
        }
    }

    /// containerd's exact payload for a pod with an ingress annotation only.
    #[test]
    fn containerd_payload() {
        let rc = RuntimeConfig::parse(&json!({
            "portMappings": [{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}],
            "bandwidth": {"IngressRate": 100_000_000, "IngressBurst": 4_294_967_295u64, "EgressRate": 0, "EgressBurst": 0}
        }))
        .unwrap();
        assert_eq!(rc.port_mappings[0].host_port, 8080);
        assert_eq!(rc.port_mappings[0].host_ip, None);
        assert_eq!(
            rc.bandwidth,
            Some(Bandwidth {
                ingress_rate: Some(100_000_000),
                ..Bandwidth::default()
            })
        );
    }

    #[test]
    fn runtime_unset_bursts_are_no_burst_and_others_are_kept() {
        for sentinel in RUNTIME_UNSET_BURSTS {
            let b = Bandwidth::parse(
                &json!({"egressRate": 5_000_000, "egressBurst": sentinel}),
                "runtimeConfig.bandwidth",
                Match::Go,
            )
            .unwrap();
            assert_eq!(b.egress_burst, None, "{sentinel}");
            assert_eq!(b.egress_rate, Some(5_000_000));
        }
        // A sentinel without a rate is no limit at all (nothing was asked).
        let b = Bandwidth::parse(
            &json!({"IngressRate": 0, "IngressBurst": 4_294_967_295u64}),
            "x",
            Match::Go,
        )
        .unwrap();
        assert!(b.is_empty());
        // Any other burst is the user's and kept, the largest allowed included.
        for burst in [1, 2_000_000, 4_294_967_294, MAX_BURST_BITS - 2] {
            let b = Bandwidth::parse(
                &json!({"egressRate": 5_000_000, "egressBurst": burst}),
                "x",
                Match::Go,
            )
            .unwrap();
            assert_eq!(b.egress_burst, Some(burst));
        }
    }

    #[test]
    fn static_bandwidth_keys_are_exact() {
        // The operator's config keeps the documented spelling.
        let b = Bandwidth::parse(&json!({"IngressRate": 1000}), "", Match::Exact).unwrap();
        assert!(b.is_empty());
        let e = Bandwidth::parse(
            &json!({"ingressRate": 1000, "ingressBurst": 0}),
            "",
            Match::Exact,
        )
        .unwrap_err();
        assert!(e.to_string().contains("ingressBurst"), "{e}");
        assert!(!e.to_string().contains(".ingressBurst"), "{e}");
    }

    #[test]
    fn ipv6_host_addresses_are_accepted_and_bad_ones_name_the_key() {
        let rc = RuntimeConfig::parse(&json!({"portMappings": [
            {"hostPort": 80, "containerPort": 80},
            {"hostPort": 81, "containerPort": 81, "HostIP": "fd00::1"}
        ]}))
        .unwrap();
        assert_eq!(
            rc.port_mappings[1].host_ip,
            Some("fd00::1".parse().unwrap())
        );
        let e = RuntimeConfig::parse(&json!({"portMappings": [
            {"hostPort": 81, "containerPort": 81, "HostIP": "fd00::1::2"}
        ]}))
        .unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(
            e.to_string()
                .contains("runtimeConfig.portMappings[0].HostIP=fd00::1::2"),
            "{e}"
        );
    }

    #[test]
    fn mac_roundtrip() {
        let m: Mac = "0A:58:0a:f4:00:03".parse().unwrap();
        assert_eq!(m.to_string(), "0a:58:0a:f4:00:03");
        assert!("00:00:00:00:00:00".parse::<Mac>().is_err());
        assert!("0a:58:0a:f4:00".parse::<Mac>().is_err());
    }
}
