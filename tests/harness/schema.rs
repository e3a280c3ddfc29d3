//! ADD results: valid against the CNI result schema (`tests/schemas/`) and shaped
//! as the requested `cniVersion` says.
use std::{net::IpAddr, sync::OnceLock};

use serde_json::Value;

use crate::{err, node::Pod, Result};

const SCHEMA: &str = include_str!("../schemas/cni-result.schema.json");

fn validator() -> Result<&'static jsonschema::Validator> {
    static V: OnceLock<std::result::Result<jsonschema::Validator, String>> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(SCHEMA).map_err(|e| e.to_string())?;
        jsonschema::validator_for(&schema).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| err!("the result schema does not compile: {e}"))
}

/// Every schema violation of `result`, as `path: message`.
pub fn violations(result: &Value) -> Result<Vec<String>> {
    Ok(validator()?
        .iter_errors(result)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect())
}

/// What an ADD result says about the attachment Sluice made.
#[derive(Clone, Debug)]
pub struct Added {
    /// `interfaces[0]`: the host veth in the node namespace.
    pub host_veth: String,
    pub host_mac: String,
    /// `interfaces[1]`: the pod interface.
    pub pod_mac: String,
    /// `ips`: address and prefix length.
    pub ips: Vec<(IpAddr, u8)>,
    /// `ips[].gateway`.
    pub gateways: Vec<IpAddr>,
    /// The whole result (to pass on as prevResult).
    pub result: Value,
}

impl Added {
    /// The first IPv4 pod address (the first address when there is none).
    pub fn ip(&self) -> IpAddr {
        self.ips
            .iter()
            .find(|i| i.0.is_ipv4())
            .or(self.ips.first())
            .map_or(IpAddr::from([0, 0, 0, 0]), |i| i.0)
    }

    /// The IPv4 gateway, if the result names one.
    pub fn gateway4(&self) -> Option<IpAddr> {
        self.gateways.iter().copied().find(IpAddr::is_ipv4)
    }
}

fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, prefix) = s.split_once('/')?;
    Some((ip.parse().ok()?, prefix.parse().ok()?))
}

fn is_host_veth_name(n: &str) -> bool {
    n.len() == 14
        && n.starts_with("sl")
        && n[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Asserts that `result`, Sluice's answer to an ADD at `version` of `ifname` in
/// `pod` (without prevResult), is valid against the schema and has the shape of
/// that version: two interfaces (host veth `sl` + 12 hex digits, then the pod
/// interface with `sandbox`), `ips` pointing at interface 1, `ips[].version`
/// present iff the version is below 1.0.0, interface `mtu` only in 1.1.0.
#[track_caller]
pub fn check_add_result(result: &Value, version: &str, ifname: &str, pod: &Pod) -> Added {
    let bad = match violations(result) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    assert!(
        bad.is_empty(),
        "result violates the schema: {bad:?}\n{result:#}"
    );
    assert_eq!(result["cniVersion"], version, "{result:#}");

    let ifs = result["interfaces"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        ifs.len(),
        2,
        "expected [host veth, pod interface]: {result:#}"
    );
    let host = &ifs[0];
    let podif = &ifs[1];
    let host_veth = host["name"].as_str().unwrap_or_default().to_string();
    assert!(
        is_host_veth_name(&host_veth),
        "host veth name {host_veth:?} is not sl + 12 hex digits"
    );
    assert!(
        host["sandbox"].as_str().is_none_or(str::is_empty),
        "the host veth has a sandbox: {result:#}"
    );
    assert_eq!(podif["name"], ifname, "{result:#}");
    assert_eq!(podif["sandbox"], pod.netns(), "{result:#}");
    let mac = |i: &Value| {
        let m = i["mac"].as_str().unwrap_or_default().to_string();
        assert!(!m.is_empty(), "interface without mac: {result:#}");
        m
    };
    let host_mac = mac(host);
    let pod_mac = mac(podif);
    for i in &ifs {
        assert_eq!(
            i.get("mtu").is_some(),
            version == "1.1.0",
            "interface mtu must be present iff cniVersion is 1.1.0: {result:#}"
        );
    }

    let ips = result["ips"].as_array().cloned().unwrap_or_default();
    assert!(!ips.is_empty(), "no ips: {result:#}");
    let mut out_ips = Vec::new();
    let mut gateways = Vec::new();
    for ip in &ips {
        let Some((addr, prefix)) = ip["address"].as_str().and_then(parse_cidr) else {
            panic!("ips[].address is not ip/prefix: {result:#}");
        };
        assert_eq!(ip["interface"], 1, "ips[].interface must be 1: {result:#}");
        let old = matches!(version, "0.3.0" | "0.3.1" | "0.4.0");
        if old {
            let fam = if addr.is_ipv4() { "4" } else { "6" };
            assert_eq!(ip["version"], fam, "ips[].version below 1.0.0: {result:#}");
        } else {
            assert!(
                ip.get("version").is_none(),
                "ips[].version must be gone from 1.0.0: {result:#}"
            );
        }
        if let Some(gw) = ip["gateway"].as_str() {
            match gw.parse() {
                Ok(g) => gateways.push(g),
                Err(e) => panic!("ips[].gateway {gw:?} is not an address: {e}"),
            }
        }
        out_ips.push((addr, prefix));
    }
    Added {
        host_veth,
        host_mac,
        pod_mac,
        ips: out_ips,
        gateways,
        result: result.clone(),
    }
}
