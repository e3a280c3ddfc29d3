//! Typed reads from JSON objects that name the key path and the value on error
//! (code 7), so every config message says what was wrong and where.
use serde_json::{Map, Value};

use crate::error::Error;

pub type Object = Map<String, Value>;

/// `InvalidConfig` for `key` holding `value`.
pub fn bad(key: &str, value: &Value, reason: &str) -> Error {
    Error::config(key, value, reason)
}

/// `what` as an object.
pub fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Object, Error> {
    v.as_object()
        .ok_or_else(|| bad(what, v, "must be a JSON object"))
}

fn present<'a>(o: &'a Object, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

/// `o[k]` as a list (absent or null: empty).
pub fn array<'a>(o: &'a Object, k: &str, what: &str) -> Result<&'a [Value], Error> {
    match present(o, k) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(bad(&join(what, k), other, "must be a list")),
    }
}

/// `o[k]` as a string.
pub fn string(o: &Object, k: &str, what: &str) -> Result<Option<String>, Error> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(&join(what, k), other, "must be a string")),
    }
}

/// `o[k]` as a u32.
pub fn uint(o: &Object, k: &str, what: &str) -> Result<Option<u32>, Error> {
    match present(o, k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(&join(what, k), v, "must be a non-negative integer")),
    }
}

/// `o[k]` as a bool.
pub fn boolean(o: &Object, k: &str, what: &str) -> Result<Option<bool>, Error> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(&join(what, k), other, "must be true or false")),
    }
}

/// `what.k`, or `k` at the top level.
pub fn join(what: &str, k: &str) -> String {
    if what.is_empty() {
        k.to_string()
    } else {
        format!("{what}.{k}")
    }
}
