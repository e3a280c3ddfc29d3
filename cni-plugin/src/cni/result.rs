//! The CNI Success result (spec section 5) as one internal type, read from and
//! written in the shape of each supported version:
//! - 0.3.0, 0.3.1, 0.4.0: every `ips` entry carries `"version": "4"|"6"`;
//! - 1.0.0: no `version` in `ips`;
//! - 1.1.0: adds interface `mtu`/`socketPath`/`pciID` and route `mtu`/`advmss`/
//!   `priority`/`table`/`scope`.
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{json, Map, Value};

use super::{
    json::{array, bad, string, uint},
    keys::{Fields, Match},
    version::Version,
};
use crate::error::Error;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    /// Netns path for interfaces in the container; `None` on the host.
    pub sandbox: Option<String>,
    pub socket_path: Option<String>,
    pub pci_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with its prefix length, e.g. `10.1.0.5/16`.
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`; absent in IPAM (abbreviated) results.
    pub interface: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>) -> Self {
        Self {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

impl CniResult {
    /// The result as JSON in the shape of `version`.
    pub fn to_json(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.to_string()));
        if !self.interfaces.is_empty() {
            let ifs: Vec<Value> = self.interfaces.iter().map(|i| i.to_json(version)).collect();
            out.insert("interfaces".into(), Value::Array(ifs));
        }
        if !self.ips.is_empty() {
            let ips: Vec<Value> = self.ips.iter().map(|i| i.to_json(version)).collect();
            out.insert("ips".into(), Value::Array(ips));
        }
        if !self.routes.is_empty() {
            let routes: Vec<Value> = self.routes.iter().map(|r| r.to_json(version)).collect();
            out.insert("routes".into(), Value::Array(routes));
        }
        if !self.dns.is_empty() {
            out.insert("dns".into(), self.dns.to_json());
        }
        Value::Object(out)
    }

    /// Reads a result (a `prevResult`, or what a delegated plugin printed). `what`
    /// names it in errors (e.g. `prevResult`). Fields are read whatever their version;
    /// `version` only decides whether an `ips[].version` is checked.
    pub fn from_json(value: &Value, what: &str) -> Result<Self, Error> {
        let obj = value
            .as_object()
            .ok_or_else(|| bad(what, value, "must be a JSON object"))?;
        let version = match obj.get("cniVersion") {
            Some(Value::String(s)) => Some(s.parse::<Version>()?),
            Some(other) => return Err(bad(&format!("{what}.cniVersion"), other, "not a string")),
            None => None,
        };
        let mut r = Self::default();
        for (i, v) in array(obj, "interfaces", what)?.iter().enumerate() {
            r.interfaces
                .push(Interface::from_json(v, &format!("{what}.interfaces[{i}]"))?);
        }
        for (i, v) in array(obj, "ips", what)?.iter().enumerate() {
            let ip = IpConfig::from_json(v, &format!("{what}.ips[{i}]"), version)?;
            if let Some(idx) = ip.interface {
                if idx >= r.interfaces.len() {
                    return Err(bad(
                        &format!("{what}.ips[{i}].interface"),
                        &json!(idx),
                        "index out of range of interfaces",
                    ));
                }
            }
            r.ips.push(ip);
        }
        for (i, v) in array(obj, "routes", what)?.iter().enumerate() {
            r.routes
                .push(Route::from_json(v, &format!("{what}.routes[{i}]"))?);
        }
        if let Some(d) = obj.get("dns") {
            r.dns = Dns::from_json(d, &format!("{what}.dns"))?;
        }
        Ok(r)
    }

    /// Appends `other` (e.g. this plugin's part) to `self` (e.g. a prevResult),
    /// shifting its interface indexes.
    pub fn merge(&mut self, other: CniResult) {
        let base = self.interfaces.len();
        self.interfaces.extend(other.interfaces);
        self.ips.extend(other.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + base);
            ip
        }));
        self.routes.extend(other.routes);
        if self.dns.is_empty() {
            self.dns = other.dns;
        }
    }
}

impl Interface {
    fn to_json(&self, v: Version) -> Value {
        let mut o = Map::new();
        o.insert("name".into(), json!(self.name));
        if let Some(mac) = &self.mac {
            o.insert("mac".into(), json!(mac));
        }
        if v.has_extended_result() {
            if let Some(mtu) = self.mtu {
                o.insert("mtu".into(), json!(mtu));
            }
        }
        if let Some(s) = &self.sandbox {
            o.insert("sandbox".into(), json!(s));
        }
        if v.has_extended_result() {
            if let Some(s) = &self.socket_path {
                o.insert("socketPath".into(), json!(s));
            }
            if let Some(s) = &self.pci_id {
                o.insert("pciID".into(), json!(s));
            }
        }
        Value::Object(o)
    }

    fn from_json(v: &Value, what: &str) -> Result<Self, Error> {
        let o = v
            .as_object()
            .ok_or_else(|| bad(what, v, "must be an object"))?;
        let name = string(o, "name", what)?
            .ok_or_else(|| bad(&format!("{what}.name"), &Value::Null, "is required"))?;
        Ok(Self {
            name,
            mac: string(o, "mac", what)?,
            mtu: uint(o, "mtu", what)?,
            sandbox: string(o, "sandbox", what)?.filter(|s| !s.is_empty()),
            socket_path: string(o, "socketPath", what)?,
            pci_id: string(o, "pciID", what)?,
        })
    }
}

impl IpConfig {
    fn to_json(&self, v: Version) -> Value {
        let mut o = Map::new();
        if v.ips_have_version() {
            let fam = if self.address.is_ipv4() { "4" } else { "6" };
            o.insert("version".into(), json!(fam));
        }
        o.insert("address".into(), json!(self.address.to_string()));
        if let Some(gw) = self.gateway {
            o.insert("gateway".into(), json!(gw.to_string()));
        }
        if let Some(i) = self.interface {
            o.insert("interface".into(), json!(i));
        }
        Value::Object(o)
    }

    fn from_json(v: &Value, what: &str, version: Option<Version>) -> Result<Self, Error> {
        let o = v
            .as_object()
            .ok_or_else(|| bad(what, v, "must be an object"))?;
        let addr_s = string(o, "address", what)?
            .ok_or_else(|| bad(&format!("{what}.address"), &Value::Null, "is required"))?;
        let address: IpNetwork = super::parse_cidr(&addr_s).ok_or_else(|| {
            bad(
                &format!("{what}.address"),
                &json!(addr_s),
                "not an address in CIDR notation",
            )
        })?;
        let gateway = match string(o, "gateway", what)? {
            Some(s) if !s.is_empty() => Some(
                s.parse::<IpAddr>()
                    .map_err(|_| bad(&format!("{what}.gateway"), &json!(s), "not an IP address"))?,
            ),
            _ => None,
        };
        if let Some(gw) = gateway {
            if gw.is_ipv4() != address.is_ipv4() {
                return Err(bad(
                    &format!("{what}.gateway"),
                    &json!(gw.to_string()),
                    "address family differs from the address",
                ));
            }
        }
        // 0.3.x/0.4.0 name the family; if given it must match the address.
        if let Some(fam) = string(o, "version", what)? {
            let ok = matches!(
                (fam.as_str(), address.is_ipv4()),
                ("4", true) | ("6", false)
            );
            if !ok {
                return Err(bad(
                    &format!("{what}.version"),
                    &json!(fam),
                    "does not match the address family",
                ));
            }
        } else if version.is_some_and(super::version::Version::ips_have_version) {
            return Err(bad(
                &format!("{what}.version"),
                &Value::Null,
                "is required before CNI 1.0.0",
            ));
        }
        let interface = uint(o, "interface", what)?.map(|i| i as usize);
        Ok(Self {
            address,
            gateway,
            interface,
        })
    }
}

impl Route {
    fn to_json(&self, v: Version) -> Value {
        let mut o = Map::new();
        o.insert("dst".into(), json!(self.dst.to_string()));
        if let Some(gw) = self.gw {
            o.insert("gw".into(), json!(gw.to_string()));
        }
        if v.has_extended_result() {
            let extra = [
                ("mtu", self.mtu),
                ("advmss", self.advmss),
                ("priority", self.priority),
                ("table", self.table),
                ("scope", self.scope.map(u32::from)),
            ];
            for (k, val) in extra {
                if let Some(val) = val {
                    o.insert(k.into(), json!(val));
                }
            }
        }
        Value::Object(o)
    }

    pub(crate) fn from_json(v: &Value, what: &str) -> Result<Self, Error> {
        let o = v
            .as_object()
            .ok_or_else(|| bad(what, v, "must be an object"))?;
        let dst_s = string(o, "dst", what)?
            .ok_or_else(|| bad(&format!("{what}.dst"), &Value::Null, "is required"))?;
        let dst: IpNetwork = super::parse_cidr(&dst_s)
            .ok_or_else(|| bad(&format!("{what}.dst"), &json!(dst_s), "not a CIDR"))?;
        let gw = match string(o, "gw", what)? {
            Some(s) if !s.is_empty() => Some(
                s.parse::<IpAddr>()
                    .map_err(|_| bad(&format!("{what}.gw"), &json!(s), "not an IP address"))?,
            ),
            _ => None,
        };
        if let Some(gw) = gw {
            if gw.is_ipv4() != dst.is_ipv4() {
                return Err(bad(
                    &format!("{what}.gw"),
                    &json!(gw.to_string()),
                    "address family differs from dst",
                ));
            }
        }
        let scope = match uint(o, "scope", what)? {
            Some(s) => Some(
                u8::try_from(s)
                    .map_err(|_| bad(&format!("{what}.scope"), &json!(s), "must be 0..=255"))?,
            ),
            None => None,
        };
        Ok(Self {
            dst,
            gw,
            mtu: uint(o, "mtu", what)?,
            advmss: uint(o, "advmss", what)?,
            priority: uint(o, "priority", what)?,
            table: uint(o, "table", what)?,
            scope,
        })
    }
}

impl Dns {
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        if !self.nameservers.is_empty() {
            o.insert("nameservers".into(), json!(self.nameservers));
        }
        if let Some(d) = &self.domain {
            o.insert("domain".into(), json!(d));
        }
        if !self.search.is_empty() {
            o.insert("search".into(), json!(self.search));
        }
        if !self.options.is_empty() {
            o.insert("options".into(), json!(self.options));
        }
        Value::Object(o)
    }

    /// Reads DNS in the result's shape (`nameservers`, `domain`, `search`,
    /// `options`), as a network config's `dns` and a result carry it.
    pub fn from_json(v: &Value, what: &str) -> Result<Self, Error> {
        let f = Fields::of(v, what, Match::Exact)?;
        Self::read(&f, &["nameservers"], &["search"])
    }

    /// Reads `runtimeConfig.dns` (the `dns` capability). The CNI conventions
    /// name its keys `servers`, `searches`, `domain` and `options`; the result's
    /// `nameservers` and `search` are accepted too. Keys match as Go does
    /// ([`super::keys`]): containerd sends `Servers`, `Searches`, `Options`.
    pub fn from_runtime(v: &Value, what: &str) -> Result<Self, Error> {
        let f = Fields::of(v, what, Match::Go)?;
        Self::read(&f, &["servers", "nameservers"], &["searches", "search"])
    }

    fn read(f: &Fields<'_>, servers: &[&str], searches: &[&str]) -> Result<Self, Error> {
        let list = |names: &[&str]| -> Result<(String, Vec<String>), Error> {
            let Some(x) = f.get_any(names)? else {
                return Ok((f.join(names[0]), Vec::new()));
            };
            let items = x
                .value
                .as_array()
                .ok_or_else(|| bad(&x.path, x.value, "must be a list"))?
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(&x.path, s, "must be a list of strings"))
                })
                .collect::<Result<_, _>>()?;
            Ok((x.path, items))
        };
        let (servers_key, nameservers) = list(servers)?;
        if let Some(ns) = nameservers.iter().find(|ns| ns.parse::<IpAddr>().is_err()) {
            return Err(bad(&servers_key, &json!(ns), "not an IP address"));
        }
        let domain = match f.get("domain")? {
            None => None,
            Some(d) => Some(
                d.value
                    .as_str()
                    .ok_or_else(|| bad(&d.path, d.value, "must be a string"))?
                    .to_string(),
            ),
        };
        Ok(Self {
            nameservers,
            domain,
            search: list(searches)?.1,
            options: list(&["options"])?.1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "sl0123456789ab".into(),
                    mac: Some("02:00:00:00:00:01".into()),
                    mtu: Some(1500),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("02:00:00:00:00:02".into()),
                    mtu: Some(1500),
                    sandbox: Some("/run/netns/x".into()),
                    ..Default::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.22.0.5/24".parse().unwrap(),
                    gateway: Some("10.22.0.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                mtu: Some(1400),
                ..Route::new("0.0.0.0/0".parse().unwrap(), None)
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn old_versions_carry_ip_version() {
        for v in [Version::V0_3_0, Version::V0_3_1, Version::V0_4_0] {
            let j = sample().to_json(v);
            assert_eq!(j["cniVersion"], v.to_string());
            assert_eq!(j["ips"][0]["version"], "4");
            assert_eq!(j["ips"][1]["version"], "6");
            assert!(j["interfaces"][0].get("mtu").is_none());
            assert!(j["routes"][0].get("mtu").is_none());
        }
    }

    #[test]
    fn v1_has_no_ip_version_and_1_1_has_mtu() {
        let j = sample().to_json(Version::V1_0_0);
        assert!(j["ips"][0].get("version").is_none());
        assert!(j["interfaces"][0].get("mtu").is_none());
        let j = sample().to_json(Version::V1_1_0);
        assert!(j["ips"][0].get("version").is_none());
        assert_eq!(j["interfaces"][0]["mtu"], 1500);
        assert_eq!(j["routes"][0]["mtu"], 1400);
        assert_eq!(j["interfaces"][1]["sandbox"], "/run/netns/x");
        assert!(j["interfaces"][0].get("sandbox").is_none());
    }

    #[test]
    fn roundtrip_every_version() {
        for v in Version::SUPPORTED {
            let j = sample().to_json(v);
            let back = CniResult::from_json(&j, "prevResult").unwrap();
            let mut expect = sample();
            if !v.has_extended_result() {
                for i in &mut expect.interfaces {
                    i.mtu = None;
                }
                expect.routes[0].mtu = None;
            }
            assert_eq!(back, expect, "{v}");
        }
    }

    #[test]
    fn converts_old_prev_result_to_new_shape() {
        let old = sample().to_json(Version::V0_3_1);
        let r = CniResult::from_json(&old, "prevResult").unwrap();
        let new = r.to_json(Version::V1_0_0);
        assert!(new["ips"][0].get("version").is_none());
        assert_eq!(new["ips"][0]["address"], "10.22.0.5/24");
    }

    #[test]
    fn bad_results_name_the_field() {
        let cases = [
            (
                json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1"}]}),
                "prevResult.ips[0].address",
            ),
            (
                json!({"cniVersion":"0.4.0","ips":[{"address":"10.0.0.1/24"}]}),
                "prevResult.ips[0].version",
            ),
            (
                json!({"cniVersion":"0.4.0","ips":[{"version":"6","address":"10.0.0.1/24"}]}),
                "prevResult.ips[0].version",
            ),
            (
                json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/24","interface":3}]}),
                "prevResult.ips[0].interface",
            ),
            (
                json!({"cniVersion":"1.0.0","routes":[{"dst":"nope"}]}),
                "prevResult.routes[0].dst",
            ),
            (
                json!({"cniVersion":"1.0.0","interfaces":[{"mac":"x"}]}),
                "prevResult.interfaces[0].name",
            ),
            (
                json!({"cniVersion":"1.0.0","dns":{"nameservers":["x"]}}),
                "prevResult.dns.nameservers",
            ),
            (json!([1]), "prevResult"),
        ];
        for (j, key) in cases {
            let e = CniResult::from_json(&j, "prevResult").unwrap_err();
            assert_eq!(e.code(), 7, "{j}");
            assert!(e.to_string().contains(key), "{e} should name {key}");
        }
    }

    #[test]
    fn merge_shifts_interface_indexes() {
        let mut prev = sample();
        let mut ours = sample();
        ours.dns = Dns::default();
        prev.merge(ours);
        assert_eq!(prev.interfaces.len(), 4);
        assert_eq!(prev.ips[2].interface, Some(3));
    }
}
