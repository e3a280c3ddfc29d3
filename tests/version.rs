//! VERSION: the versions Sluice speaks, whatever the input (spec section 2, "VERSION").
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::{json, Value};
use sluice_tests::{exec, sluice_bin, CniOutput, VERSIONS};

/// VERSION needs no namespace: it runs in the test's own.
fn version(stdin: &[u8]) -> CniOutput {
    let bin = sluice_bin().unwrap();
    let env = [("CNI_COMMAND".to_string(), "VERSION".to_string())];
    CniOutput::new(exec::run(None, &bin, &[], &env, stdin).unwrap())
}

fn supported() -> Value {
    json!(VERSIONS)
}

#[test]
fn version_echoes_each_supported_version() {
    for v in VERSIONS {
        let out = version(json!({"cniVersion": v}).to_string().as_bytes());
        let r = out.result();
        assert_eq!(r["cniVersion"], v, "{out}");
        assert_eq!(r["supportedVersions"], supported(), "{out}");
        assert_eq!(r.as_object().map(serde_json::Map::len), Some(2), "{out}");
    }
}

#[test]
fn version_with_a_full_network_config_on_stdin() {
    // Runtimes may send the whole config; only cniVersion matters.
    let conf = json!({"cniVersion": "0.4.0", "name": "n", "type": "sluice",
                      "ipam": {"type": "sluice", "subnet": "10.1.0.0/24"}});
    let r = version(conf.to_string().as_bytes()).result();
    assert_eq!(r["cniVersion"], "0.4.0");
    assert_eq!(r["supportedVersions"], supported());
}

#[test]
fn version_answers_garbage_with_the_latest_version() {
    let cases: [&[u8]; 6] = [
        b"",
        b"garbage",
        b"{\"cniVersion\":",
        b"{\"cniVersion\": 7}",
        b"{\"cniVersion\": \"x.y\"}",
        b"[1, 2, 3]",
    ];
    for stdin in cases {
        let out = version(stdin);
        let r = out.result();
        assert_eq!(r["cniVersion"], "1.1.0", "{out}");
        assert_eq!(r["supportedVersions"], supported(), "{out}");
    }
}
