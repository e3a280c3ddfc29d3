//! The agent's state file (`--state-file`): each Service port it wrote, by
//! its id in the maps, with the Service's name, port and protocol, its
//! frontends and every endpoint's state (ready, serving, terminating, its
//! node, whether it is a backend here). The maps hold addresses only;
//! `sluicectl services lb` and the metrics read names from here, and trust
//! an entry only while its frontends are the ones the maps show under its id.
use std::path::Path;

use serde_json::{json, Value};
use sluice_common::svc_scope;
use sluice_maps::lb::frontend_text;

use super::{apply::Applied, desired::Ports};
use crate::log;

/// The state of what `applied` holds of `want`.
pub(crate) fn render(want: &Ports, applied: &Applied) -> Value {
    let ports: Vec<Value> = want
        .iter()
        .filter_map(|(name, p)| {
            let id = applied.id_of(name)?;
            let mut frontends: Vec<String> = p.frontends.iter().map(frontend_text).collect();
            frontends.sort();
            Some(json!({
                "id": id,
                "name": name,
                "fromOutside": p.frontends.first().is_some_and(|k| k.scope == svc_scope::EXTERNAL),
                "frontends": frontends,
                "about": p.about,
            }))
        })
        .collect();
    json!({ "servicePorts": ports })
}

/// Writes `state` to `path` (replaced in one step) unless it is what was
/// written last (`last`).
pub(crate) fn write(path: &Path, state: &Value, last: &mut Option<String>) {
    let text = match serde_json::to_string_pretty(state) {
        Ok(t) => t,
        Err(e) => {
            log(&format!("proxy: encoding the state: {e}"));
            return;
        }
    };
    if last.as_deref() == Some(text.as_str()) {
        return;
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match crate::atomic::replace(path, text.as_bytes(), 0o644) {
        Ok(_) => *last = Some(text),
        Err(e) => log(&format!("proxy: writing {}: {e}", path.display())),
    }
}
