//! `runtimeConfig`: capability arguments a runtime passes (CNI conventions):
//! `portMappings`, `bandwidth`, `ipRanges`, `mac`, `ips`, `dns`. Unknown keys are
//! accepted; a known key with a bad value is code 7 naming the key and the value.
use std::{fmt, net::IpAddr, str::FromStr};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::result::Dns;
use crate::error::Error;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub port_mappings: Vec<PortMapping>,
    pub bandwidth: Option<Bandwidth>,
    /// Kept as JSON: the IPAM config parser reads it with the same rules as `ranges`.
    pub ip_ranges: Option<Value>,
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

impl Bandwidth {
    /// Parses and validates a `bandwidth` object found at `key`.
    pub fn parse(v: &Value, key: &str) -> Result<Self, Error> {
        let o = v
            .as_object()
            .ok_or_else(|| Error::config(key, v, "must be an object"))?;
        // Static plugin config keys sit at the top level (`key` empty).
        let name = |k: &str| {
            if key.is_empty() {
                k.to_string()
            } else {
                format!("{key}.{k}")
            }
        };
        let field = |k: &str| -> Result<Option<u64>, Error> {
            match o.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                    Error::config(
                        name(k),
                        x,
                        "must be a non-negative integer that fits in 64 bits",
                    )
                }),
            }
        };
        let b = Self {
            ingress_rate: field("ingressRate")?,
            ingress_burst: field("ingressBurst")?,
            egress_rate: field("egressRate")?,
            egress_burst: field("egressBurst")?,
        };
        for (dir, rate, burst) in [
            ("ingress", b.ingress_rate, b.ingress_burst),
            ("egress", b.egress_rate, b.egress_burst),
        ] {
            if let Some(r) = rate {
                if r == 0 || r > MAX_RATE_BPS {
                    return Err(Error::config(
                        name(&format!("{dir}Rate")),
                        r,
                        format!("must be between 1 and {MAX_RATE_BPS} bits per second"),
                    ));
                }
            }
            if let Some(bu) = burst {
                if rate.is_none() {
                    return Err(Error::config(
                        name(&format!("{dir}Burst")),
                        bu,
                        format!("is set without {dir}Rate"),
                    ));
                }
                if bu == 0 || bu > MAX_BURST_BITS {
                    return Err(Error::config(
                        name(&format!("{dir}Burst")),
                        bu,
                        format!("must be between 1 and {MAX_BURST_BITS} bits"),
                    ));
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

impl RuntimeConfig {
    /// Parses the `runtimeConfig` object.
    pub fn parse(v: &Value) -> Result<Self, Error> {
        let o = v
            .as_object()
            .ok_or_else(|| Error::config("runtimeConfig", v, "must be an object"))?;
        let mut rc = Self::default();
        if let Some(pm) = o.get("portMappings").filter(|v| !v.is_null()) {
            rc.port_mappings = parse_port_mappings(pm, "runtimeConfig.portMappings")?;
        }
        if let Some(b) = o.get("bandwidth").filter(|v| !v.is_null()) {
            rc.bandwidth = Some(Bandwidth::parse(b, "runtimeConfig.bandwidth")?);
        }
        if let Some(r) = o.get("ipRanges").filter(|v| !v.is_null()) {
            if !r.as_array().is_some_and(|a| a.iter().all(Value::is_array)) {
                return Err(Error::config(
                    "runtimeConfig.ipRanges",
                    r,
                    "must be a list of range sets (lists of ranges)",
                ));
            }
            rc.ip_ranges = Some(r.clone());
        }
        if let Some(m) = o.get("mac").filter(|v| !v.is_null()) {
            let s = m
                .as_str()
                .ok_or_else(|| Error::config("runtimeConfig.mac", m, "must be a string"))?;
            rc.mac = Some(
                s.parse()
                    .map_err(|r: String| Error::config("runtimeConfig.mac", s, r))?,
            );
        }
        if let Some(ips) = o.get("ips").filter(|v| !v.is_null()) {
            rc.ips = parse_ip_list(ips, "runtimeConfig.ips")?;
        }
        if let Some(d) = o.get("dns").filter(|v| !v.is_null()) {
            rc.dns = Some(Dns::from_json(d, "runtimeConfig.dns")?);
        }
        Ok(rc)
    }
}

/// Parses a `portMappings` list found at `key`: ports 1..=65535, protocol tcp/udp/sctp
/// (default tcp), `hostIP` an address or empty. Duplicates are refused.
pub fn parse_port_mappings(v: &Value, key: &str) -> Result<Vec<PortMapping>, Error> {
    let arr = v
        .as_array()
        .ok_or_else(|| Error::config(key, v, "must be a list"))?;
    let mut out: Vec<PortMapping> = Vec::with_capacity(arr.len());
    // (port, protocol, hostIP) seen: a set, lists can hold thousands.
    let mut seen = std::collections::HashSet::with_capacity(arr.len());
    for (i, e) in arr.iter().enumerate() {
        let k = format!("{key}[{i}]");
        let o = e
            .as_object()
            .ok_or_else(|| Error::config(&k, e, "must be an object"))?;
        let port = |name: &str| -> Result<u16, Error> {
            let x = o
                .get(name)
                .ok_or_else(|| Error::config(format!("{k}.{name}"), "null", "is required"))?;
            x.as_u64()
                .filter(|p| (1..=65535).contains(p))
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| Error::config(format!("{k}.{name}"), x, "must be a port 1..65535"))
        };
        let host_port = port("hostPort")?;
        let container_port = port("containerPort")?;
        let protocol = match o.get("protocol") {
            None | Some(Value::Null) => Protocol::Tcp,
            Some(Value::String(s)) if s.is_empty() => Protocol::Tcp,
            Some(Value::String(s)) => s
                .parse()
                .map_err(|r: String| Error::config(format!("{k}.protocol"), s, r))?,
            Some(x) => {
                return Err(Error::config(
                    format!("{k}.protocol"),
                    x,
                    "must be a string",
                ))
            }
        };
        let host_ip = match o.get("hostIP") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(
                s.parse::<IpAddr>()
                    .map_err(|_| Error::config(format!("{k}.hostIP"), s, "not an IP address"))?,
            ),
            Some(x) => return Err(Error::config(format!("{k}.hostIP"), x, "must be a string")),
        };
        let pm = PortMapping {
            host_port,
            container_port,
            protocol,
            host_ip,
        };
        if !seen.insert((pm.host_port, pm.protocol, pm.host_ip)) {
            return Err(Error::config(
                format!("{k}.hostPort"),
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
            "bandwidth": {"ingressRate": 1000000, "ingressBurst": 80000, "egressRate": 2000000},
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
                json!({"bandwidth": {"ingressRate": 0}}),
                "runtimeConfig.bandwidth.ingressRate",
                "0",
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
                json!({"bandwidth": {"ingressRate": 1000, "ingressBurst": 40000000000u64}}),
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

    #[test]
    fn mac_roundtrip() {
        let m: Mac = "0A:58:0a:f4:00:03".parse().unwrap();
        assert_eq!(m.to_string(), "0a:58:0a:f4:00:03");
        assert!("00:00:00:00:00:00".parse::<Mac>().is_err());
        assert!("0a:58:0a:f4:00".parse::<Mac>().is_err());
    }
}
