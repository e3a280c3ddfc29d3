//! The plugin's attachment records, as the agent reads them: every record
//! under `<state dir>/<network>/attachments/`, parsed as JSON. Unreadable
//! or unparsable records are skipped (a record being written, a file of
//! another tool): the callers treat a pod without one as unknown.
use std::path::Path;

/// Every record under `state_dir`, of every network.
pub(crate) fn all(state_dir: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let Ok(networks) = std::fs::read_dir(state_dir) else {
        return out;
    };
    for net in networks.flatten() {
        let Ok(records) = std::fs::read_dir(net.path().join("attachments")) else {
            continue;
        };
        for r in records.flatten() {
            let Some(v) = std::fs::read_to_string(r.path())
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
            else {
                continue;
            };
            out.push(v);
        }
    }
    out
}
