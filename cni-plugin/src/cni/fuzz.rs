//! Property-based fuzzing (proptest) of everything the plugin parses from the
//! runtime: the network config on stdin, `CNI_ARGS`, and results (`prevResult`,
//! a delegated plugin's output). Each property feeds generated input and requires
//! an answer instead of a panic — `Ok`, or an error with a spec code — and, for
//! valid results, that reading back what was written gives the same result.
//!
//! Bounded: `PROPTEST_CASES` cases per property (default below), so it runs in
//! CI in seconds. A failing case proptest finds is written to
//! `proptest-regressions/` (committed) and replayed first on every later run,
//! which makes each crash found a regression test.
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::{args::CniArgs, config::NetConf, result::CniResult, version::Version};

/// Spec codes a parse error may carry (1 version, 2 field, 4 env, 6 decode,
/// 7 invalid config).
const PARSE_CODES: [u32; 5] = [1, 2, 4, 6, 7];

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(2048),
        ..ProptestConfig::default()
    }
}

/// Any JSON value, a few levels deep, with strings that look like what configs
/// hold (addresses, CIDRs, names) as well as arbitrary ones.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        "[0-9./:a-f-]{0,24}".prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        prop_oneof![
            Just("10.22.0.0/24"),
            Just("10.22.0.5"),
            Just("fd00::/64"),
            Just("0.0.0.0/0"),
            Just("1.1.0"),
            Just("tcp"),
            Just("eth0"),
            Just("host-local"),
            Just("sluice"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Keys the plugin reads, at the top level of a config.
const CONFIG_KEYS: [&str; 31] = [
    "cniVersion",
    "name",
    "type",
    "mtu",
    "ipMasq",
    "debug",
    "pinRoot",
    "stateDir",
    "ipam",
    "dns",
    "uplink",
    "xdp",
    "podAttach",
    "nodes",
    "nonMasqueradeCIDRs",
    "serviceCIDRs",
    "masqueradeAddress",
    "masqueradePorts",
    "natMaxFlows",
    "natTimeouts",
    "ingressRate",
    "ingressBurst",
    "egressRate",
    "egressBurst",
    "hostPortCgroup",
    "runtimeConfig",
    "args",
    "prevResult",
    "capabilities",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

fn base_config() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": "fuzz",
        "type": "sluice",
        "ipam": {"type": "sluice", "subnet": "10.22.0.0/24"},
    })
}

/// Whether a parse answered as the spec asks: `Ok`, or an error with a parse code.
fn answered<T>(r: &Result<T, crate::error::Error>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) => PARSE_CODES.contains(&e.code()),
    }
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes on stdin.
    #[test]
    fn config_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        prop_assert!(answered(&NetConf::parse(&bytes)));
    }

    /// A valid config with generated values at the keys the plugin reads.
    #[test]
    fn config_values_never_panic(
        edits in prop::collection::vec((prop::sample::select(&CONFIG_KEYS[..]), json_value()), 1..5)
    ) {
        let mut c = base_config();
        for (k, v) in edits {
            c[k] = v;
        }
        let bytes = serde_json::to_vec(&c).unwrap_or_default();
        let r = NetConf::parse(&bytes);
        prop_assert!(answered(&r), "{c}: {:?}", r.err());
    }

    /// Generated values inside the nested objects (ipam, runtimeConfig, ...).
    #[test]
    fn nested_config_values_never_panic(
        outer in prop::sample::select(&["ipam", "runtimeConfig", "natTimeouts", "args", "dns"][..]),
        inner in "[a-zA-Z]{1,14}",
        v in json_value(),
    ) {
        let mut c = base_config();
        if !c[outer].is_object() {
            c[outer] = json!({});
        }
        c[outer][&inner] = v;
        // Keys the plugin does read, too.
        for k in ["portMappings", "bandwidth", "ips", "mac", "ipRanges", "subnet", "ranges", "routes"] {
            if inner.len() % 3 == 0 {
                c[outer][k] = c[outer][&inner].clone();
            }
        }
        let bytes = serde_json::to_vec(&c).unwrap_or_default();
        let r = NetConf::parse(&bytes);
        prop_assert!(answered(&r), "{c}: {:?}", r.err());
    }

    /// `CNI_ARGS` strings: arbitrary, and made of key=value pairs.
    #[test]
    fn cni_args_never_panic(
        raw in ".{0,200}",
        pairs in prop::collection::vec(("[A-Za-z_]{0,12}", "[^;]{0,20}"), 0..6),
    ) {
        prop_assert!(answered(&CniArgs::parse(&raw)));
        let joined: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        prop_assert!(answered(&CniArgs::parse(&joined.join(";"))));
    }

    /// Arbitrary JSON as a result.
    #[test]
    fn results_never_panic(v in json_value()) {
        prop_assert!(answered(&CniResult::from_json(&v, "prevResult")));
        let mut with_version = v.clone();
        if with_version.is_object() {
            with_version["cniVersion"] = json!("1.0.0");
            prop_assert!(answered(&CniResult::from_json(&with_version, "prevResult")));
        }
    }

    /// A valid result written in each version reads back the same, and a config
    /// carrying it as prevResult parses.
    #[test]
    fn valid_results_roundtrip(
        octets in prop::collection::vec((1u8..=254, 0u8..=255, 1u8..=254), 1..4),
        prefix in 8u8..=30,
        with_route in any::<bool>(),
    ) {
        let ips: Vec<Value> = octets
            .iter()
            .map(|(a, b, c)| json!({"address": format!("10.{a}.{b}.{c}/{prefix}"), "gateway": format!("10.{a}.{b}.1")}))
            .collect();
        let mut r = json!({"cniVersion": "1.1.0", "ips": ips});
        if with_route {
            r["routes"] = json!([{"dst": "0.0.0.0/0"}]);
        }
        let parsed = CniResult::from_json(&r, "prevResult").map_err(|e| TestCaseError::fail(e.to_string()))?;
        for v in Version::SUPPORTED {
            let written = parsed.to_json(v);
            let back = CniResult::from_json(&written, "prevResult").map_err(|e| TestCaseError::fail(format!("{v}: {e}")))?;
            prop_assert_eq!(back.to_json(v), written);
        }
        let mut c = base_config();
        c["prevResult"] = r;
        prop_assert!(NetConf::parse(&serde_json::to_vec(&c).unwrap_or_default()).is_ok());
    }
}
