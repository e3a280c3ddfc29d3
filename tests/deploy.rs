//! The Kubernetes manifest, `deploy/kubernetes/sluice.yaml` (issue 19):
//! validated offline against the Kubernetes OpenAPI schemas by
//! `kubernetes-validate` (PyPI; `cargo xtask test` installs it in a virtualenv
//! under `target/tools`), strictly (an unknown field fails), for the oldest and
//! newest releases it covers that we support; the validator shown to refuse a
//! broken copy (so a pass means something); and the manifest checked against
//! the binaries: every container runs a subcommand they have, every environment
//! variable it sets is one they read, and the host paths are where
//! `sluice-node` looks by default.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;
use sluice_tests::{kube_validate_bin, sluice_node_bin, sluicectl_bin};

/// Kubernetes releases the manifest must be valid for (oldest supported, newest known).
const RELEASES: [&str; 2] = ["1.30.0", "1.37.0"];
/// The five objects of the manifest.
const OBJECTS: [&str; 5] = [
    "serviceaccount/sluice",
    "clusterrole/sluice-node",
    "clusterrolebinding/sluice-node",
    "configmap/sluice-config",
    "daemonset/sluice",
];

fn manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/sluice.yaml")
}

fn validator() -> PathBuf {
    kube_validate_bin().unwrap()
}

fn validate(file: &Path, release: &str) -> Output {
    Command::new(validator())
        .args(["--strict", "-k", release])
        .arg(file)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The manifest's documents as JSON (read with the virtualenv's PyYAML).
fn documents() -> Vec<Value> {
    let python = validator().with_file_name("python");
    let o = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(manifest())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_manifest_passes_strict_schema_validation() {
    for release in RELEASES {
        let o = validate(&manifest(), release);
        let said = text(&o);
        assert!(o.status.success(), "Kubernetes {release}: {said}");
        for obj in OBJECTS {
            assert!(
                said.contains(&format!("passed for resource {obj}")),
                "Kubernetes {release}: {obj} not validated: {said}"
            );
        }
    }
}

#[test]
fn the_validator_refuses_broken_copies() {
    let good = std::fs::read_to_string(manifest()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (from, to, named) in [
        ("hostNetwork: true", "hostNetwrk: true", "hostNetwrk"),
        (
            "mountPropagation: HostToContainer",
            "mountPropagation: 7",
            "mountPropagation",
        ),
        (
            "containerPort: 9964",
            "containerPort: \"metrics\"",
            "containerPort",
        ),
    ] {
        assert!(good.contains(from), "the manifest has no {from:?}");
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, good.replacen(from, to, 1)).unwrap();
        let o = validate(&bad, RELEASES[1]);
        assert!(!o.status.success(), "{to:?} passed: {}", text(&o));
        assert!(text(&o).contains(named), "{to:?}: {}", text(&o));
    }
}

#[test]
fn the_manifest_matches_the_binaries() {
    let docs = documents();
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("no DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let containers: Vec<&Value> = pod["initContainers"]
        .as_array()
        .into_iter()
        .chain(pod["containers"].as_array())
        .flatten()
        .collect();
    assert_eq!(containers.len(), 3);
    let version = env!("CARGO_PKG_VERSION");
    for c in &containers {
        let name = c["name"].as_str().unwrap();
        assert_eq!(c["image"], format!("localhost/sluice:{version}"), "{name}");
        let cmd: Vec<&str> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let bin = match cmd[0] {
            "/usr/local/bin/sluice-node" => sluice_node_bin().unwrap(),
            "/usr/local/bin/sluicectl" => sluicectl_bin().unwrap(),
            other => panic!("{name} runs {other}, which the image does not hold"),
        };
        let o = Command::new(&bin)
            .args(&cmd[1..])
            .arg("--help")
            .output()
            .unwrap();
        let help = text(&o);
        assert!(o.status.success(), "{name}: {cmd:?} --help: {help}");
        for e in c["env"].as_array().into_iter().flatten() {
            let var = e["name"].as_str().unwrap();
            assert!(
                help.contains(&format!("[env: {var}=")),
                "{name} sets {var}, which {cmd:?} does not read: {help}"
            );
        }
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let path = m["mountPath"].as_str().unwrap();
            assert!(
                path == "/sys/fs/bpf" || help.contains(path),
                "{name} mounts {path}, which {cmd:?} does not use: {help}"
            );
        }
    }
    // The plugin config the ConfigMap passes is a JSON object.
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let extra: Value = serde_json::from_str(cm["data"]["plugin-config"].as_str().unwrap()).unwrap();
    assert!(extra.is_object(), "{extra}");
}
