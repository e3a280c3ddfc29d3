//! VERSION: the versions Sluice speaks (spec section 5, "Version").
use serde_json::{json, Value};

use crate::cni::{config::peek_version, version::Version};

/// The VERSION result; `cniVersion` echoes the input's when it is well-formed.
pub fn version(stdin: &[u8]) -> Value {
    let v = peek_version(stdin)
        .filter(|s| s.parse::<Version>().is_ok() && !s.is_empty())
        .unwrap_or_else(|| Version::LATEST.to_string());
    json!({
        "cniVersion": v,
        "supportedVersions": Version::SUPPORTED.map(|v| v.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_supported_and_echoes_input() {
        let v = version(br#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(
            v["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
        assert_eq!(version(b"")["cniVersion"], "1.1.0");
        assert_eq!(version(b"{\"cniVersion\":\"x\"}")["cniVersion"], "1.1.0");
    }
}
