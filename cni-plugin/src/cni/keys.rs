//! Finding keys in the objects a runtime fills in: `runtimeConfig` and every
//! object under it, and `args`.
//!
//! Runtimes are Go programs, and Go's `encoding/json` matches object keys to
//! struct fields without regard to case. containerd's go-cni serialises its
//! capability structs without JSON tags, so Sluice receives
//! `{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}`
//! where the CNI conventions write `hostPort`; the reference plugins accept
//! both because they decode with Go. Sluice does the same in those objects:
//!
//! - the conventions' spelling (`hostPort`) is used when it is there;
//! - otherwise any ASCII case variant of it (`HostPort`, `HOSTPORT`, `hostport`);
//! - two variants with different values and no exact spelling are refused (Go
//!   would silently take the last one in the document; which one that was is not
//!   kept here, and guessing would hide a runtime bug);
//! - `null` counts as absent, unknown keys are ignored;
//! - error messages name the key as the runtime wrote it.
//!
//! The operator's own network config (`mtu`, `ipMasq`, `ipam`, ...) keeps exact
//! spellings, as documented in the README ([`Match::Exact`]).
use serde_json::Value;

use super::json::Object;
use crate::error::Error;

/// How keys of one object are matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// Exactly as documented (operator-written config).
    Exact,
    /// As Go's `encoding/json` does (runtime-filled objects): see the module docs.
    Go,
}

/// The keys of one JSON object at a key path (e.g. `runtimeConfig.portMappings[0]`).
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    obj: &'a Object,
    path: &'a str,
    matching: Match,
}

/// A value found under a key, with the full key path as written.
#[derive(Clone, Debug)]
pub struct Field<'a> {
    pub path: String,
    pub value: &'a Value,
}

impl<'a> Fields<'a> {
    pub fn new(obj: &'a Object, path: &'a str, matching: Match) -> Self {
        Self {
            obj,
            path,
            matching,
        }
    }

    /// `v` as an object at `path`, or code 7 naming it.
    pub fn of(v: &'a Value, path: &'a str, matching: Match) -> Result<Self, Error> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::config(path, v, "must be an object"))?;
        Ok(Self::new(obj, path, matching))
    }

    pub fn path(&self) -> &'a str {
        self.path
    }

    /// `path.key`, or `key` at the top level.
    pub fn join(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The value of `name` (see the module docs for how keys match); `null` is absent.
    pub fn get(&self, name: &str) -> Result<Option<Field<'a>>, Error> {
        self.get_any(&[name])
    }

    /// The value of the first of `names` present (aliases of one field, in order
    /// of preference).
    pub fn get_any(&self, names: &[&str]) -> Result<Option<Field<'a>>, Error> {
        for name in names {
            if let Some(v) = self.obj.get(*name).filter(|v| !v.is_null()) {
                return Ok(Some(self.field(name, v)));
            }
        }
        if self.matching == Match::Exact {
            return Ok(None);
        }
        let mut found: Option<(&'a str, &'a Value)> = None;
        for (k, v) in self.obj {
            if v.is_null() || !names.iter().any(|n| k.eq_ignore_ascii_case(n)) {
                continue;
            }
            match found {
                Some((k0, v0)) if v0 != v => {
                    return Err(Error::config(
                        self.join(k),
                        v,
                        format!("conflicts with {} = {v0}", self.join(k0)),
                    ))
                }
                Some(_) => {}
                None => found = Some((k, v)),
            }
        }
        Ok(found.map(|(k, v)| self.field(k, v)))
    }

    fn field(&self, key: &str, value: &'a Value) -> Field<'a> {
        Field {
            path: self.join(key),
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(v: &Value) -> &Object {
        v.as_object().unwrap()
    }

    #[test]
    fn exact_spelling_wins_and_variants_match_like_go() {
        let v = json!({"hostPort": 1, "HostPort": 2, "CONTAINERPORT": 3, "protocol": null});
        let f = Fields::new(obj(&v), "pm[0]", Match::Go);
        let hp = f.get("hostPort").unwrap().unwrap();
        assert_eq!((hp.path.as_str(), hp.value), ("pm[0].hostPort", &json!(1)));
        let cp = f.get("containerPort").unwrap().unwrap();
        assert_eq!(cp.path, "pm[0].CONTAINERPORT");
        assert!(f.get("protocol").unwrap().is_none(), "null is absent");
        assert!(f.get("hostIP").unwrap().is_none());
    }

    #[test]
    fn exact_matching_ignores_variants() {
        let v = json!({"HostPort": 2});
        let f = Fields::new(obj(&v), "", Match::Exact);
        assert!(f.get("hostPort").unwrap().is_none());
    }

    #[test]
    fn conflicting_variants_are_refused_naming_both() {
        let v = json!({"HostPort": 2, "hostport": 3});
        let e = Fields::new(obj(&v), "pm[1]", Match::Go)
            .get("hostPort")
            .unwrap_err();
        assert_eq!(e.code(), 7);
        let s = e.to_string();
        assert!(
            s.contains("pm[1].HostPort") && s.contains("pm[1].hostport"),
            "{s}"
        );
        let same = json!({"HostPort": 2, "hostport": 2});
        let f = Fields::new(obj(&same), "", Match::Go);
        assert_eq!(f.get("hostPort").unwrap().unwrap().value, &json!(2));
    }

    #[test]
    fn aliases_in_order_of_preference() {
        let v = json!({"nameservers": ["10.0.0.1"], "Servers": ["10.0.0.2"]});
        let f = Fields::new(obj(&v), "dns", Match::Go);
        // An exact spelling of any alias beats a case variant of an earlier one.
        let s = f.get_any(&["servers", "nameservers"]).unwrap().unwrap();
        assert_eq!(s.path, "dns.nameservers");
        let v = json!({"Servers": ["10.0.0.2"]});
        let f = Fields::new(obj(&v), "dns", Match::Go);
        let s = f.get_any(&["servers", "nameservers"]).unwrap().unwrap();
        assert_eq!(s.path, "dns.Servers");
    }

    #[test]
    fn top_level_paths_have_no_leading_dot() {
        let v = json!({"IngressRate": 5});
        let f = Fields::new(obj(&v), "", Match::Go);
        assert_eq!(f.get("ingressRate").unwrap().unwrap().path, "IngressRate");
    }
}
