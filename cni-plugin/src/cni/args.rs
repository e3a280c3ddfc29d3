//! `CNI_ARGS`: `KEY=VALUE` pairs separated by `;` (spec section 2, conventions).
use std::net::IpAddr;

use crate::error::Error;

/// What Sluice reads from `CNI_ARGS`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `IP=`: specific addresses to request from IPAM (comma-separated, as host-local).
    pub ips: Vec<IpAddr>,
    /// `MAC=`: MAC address for the container interface (as the bridge plugin).
    pub mac: Option<String>,
    /// Every pair, for delegation and diagnostics.
    pub pairs: Vec<(String, String)>,
}

/// Keys runtimes commonly pass; accepted even without `IgnoreUnknown`.
const KNOWN: [&str; 8] = [
    "IgnoreUnknown",
    "IP",
    "MAC",
    "K8S_POD_NAME",
    "K8S_POD_NAMESPACE",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
    "K8S_POD_RUNTIME",
];

impl CniArgs {
    /// Parses `CNI_ARGS`. As in the reference plugins, an unknown key is an error
    /// unless `IgnoreUnknown` is `1` or `true`; a pair without `=` is always one.
    pub fn parse(raw: &str) -> Result<Self, Error> {
        let mut out = Self::default();
        if raw.is_empty() {
            return Ok(out);
        }
        for pair in raw.split(';') {
            if pair.is_empty() {
                continue;
            }
            let Some((k, v)) = pair.split_once('=') else {
                return Err(Error::env(
                    "CNI_ARGS",
                    raw,
                    format!("{pair:?} is not KEY=VALUE"),
                ));
            };
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(Error::env(
                    "CNI_ARGS",
                    raw,
                    format!("key {k:?} must be alphanumeric"),
                ));
            }
            out.pairs.push((k.to_string(), v.to_string()));
        }
        let ignore_unknown = out
            .pairs
            .iter()
            .any(|(k, v)| k == "IgnoreUnknown" && (v == "1" || v.eq_ignore_ascii_case("true")));
        for (k, v) in &out.pairs {
            match k.as_str() {
                "IP" => {
                    for s in v.split(',').filter(|s| !s.is_empty()) {
                        let ip = s.parse::<IpAddr>().map_err(|_| {
                            Error::env("CNI_ARGS", raw, format!("IP={s:?} is not an IP address"))
                        })?;
                        out.ips.push(ip);
                    }
                }
                "MAC" => out.mac = Some(v.clone()),
                k if KNOWN.contains(&k) || ignore_unknown => {}
                _ => {
                    return Err(Error::env(
                        "CNI_ARGS",
                        raw,
                        format!("unknown key {k:?} (set IgnoreUnknown=1 to accept it)"),
                    ))
                }
            }
        }
        Ok(out)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_args() {
        let a = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;FOO=bar;IP=10.1.0.9,fd00::9",
        )
        .unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("web-0"));
        assert_eq!(
            a.ips,
            vec![
                "10.1.0.9".parse::<IpAddr>().unwrap(),
                "fd00::9".parse().unwrap()
            ]
        );
    }

    #[test]
    fn empty_is_fine() {
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert!(CniArgs::parse(";;").unwrap().pairs.is_empty());
    }

    #[test]
    fn bad_args_are_code_4_naming_cni_args() {
        for raw in ["FOO", "FOO=bar", "IP=10.1.0.300", "=x", "a b=c"] {
            let e = CniArgs::parse(raw).unwrap_err();
            assert_eq!(e.code(), 4, "{raw}");
            assert!(e.to_string().contains("CNI_ARGS"), "{e}");
        }
    }

    #[test]
    fn mac_is_read() {
        let a = CniArgs::parse("MAC=02:00:00:00:00:09").unwrap();
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:09"));
    }
}
