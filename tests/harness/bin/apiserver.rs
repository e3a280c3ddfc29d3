//! `sluice-test-apiserver`: the stand-in API server of the tests
//! (`harness/apiserver.rs`, which says what it covers) as a process of its
//! own, for `cargo xtask bench` (the agent's apply times, against the same
//! list, watch, resource version and bookmark protocol the tests use).
//!
//! ```text
//! sluice-test-apiserver NETNS
//! ```
//!
//! Listens on 127.0.0.1 (any port) in the network namespace at NETNS and
//! prints `{"port": N}`. Then reads one JSON command per line from stdin and
//! answers each with one line, `ok` once the change is what watches see, or
//! `{"error": "..."}`:
//! `{"put": RESOURCE, "object": {...}}` (create or replace) and
//! `{"delete": RESOURCE, "namespace": NS, "name": NAME}`, RESOURCE being
//! `nodes`, `services`, `servicecidrs`, `endpointslices`, `pods`,
//! `namespaces` or `networkpolicies`. It exits at the end of its input.
use std::{
    io::{BufRead, Write},
    path::Path,
    process::ExitCode,
};

use serde_json::{json, Value};
use sluice_tests::apiserver::{ApiServer, Resource};

fn resource(name: &str) -> Option<Resource> {
    match name {
        "nodes" => Some(Resource::Nodes),
        "services" => Some(Resource::Services),
        "servicecidrs" => Some(Resource::ServiceCidrs),
        "endpointslices" => Some(Resource::EndpointSlices),
        "pods" => Some(Resource::Pods),
        "namespaces" => Some(Resource::Namespaces),
        "networkpolicies" => Some(Resource::NetworkPolicies),
        _ => None,
    }
}

/// Runs one command; the error names what was wrong with it.
fn command(api: &ApiServer, line: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e}): {line}"))?;
    if let Some(r) = v["put"].as_str() {
        let res = resource(r).ok_or_else(|| format!("unknown resource {r:?}"))?;
        if !v["object"].is_object() {
            return Err(format!("put {r}: no \"object\""));
        }
        api.put(res, v["object"].clone());
        return Ok(());
    }
    if let Some(r) = v["delete"].as_str() {
        let res = resource(r).ok_or_else(|| format!("unknown resource {r:?}"))?;
        let name = v["name"]
            .as_str()
            .ok_or_else(|| format!("delete {r}: no \"name\""))?;
        api.delete(res, v["namespace"].as_str().unwrap_or(""), name);
        return Ok(());
    }
    Err(format!("neither put nor delete: {line}"))
}

fn main() -> ExitCode {
    let Some(netns) = std::env::args().nth(1) else {
        eprintln!("usage: sluice-test-apiserver NETNS");
        return ExitCode::from(2);
    };
    let api = match ApiServer::start(Path::new(&netns), "127.0.0.1:0") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sluice-test-apiserver: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{}", json!({"port": api.port()})).is_err() || out.flush().is_err() {
        return ExitCode::from(1);
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match command(&api, &line) {
            Ok(()) => "ok".to_string(),
            Err(e) => json!({"error": e}).to_string(),
        };
        if writeln!(out, "{answer}").is_err() || out.flush().is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}
