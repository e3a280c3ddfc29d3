//! What a CNI plugin answered, and the checks every test makes on it.
use std::fmt;

use serde_json::Value;

use crate::exec::Output;

/// `conf` with `prevResult` set to `prev`, as a runtime passes a cached result
/// to CHECK and DEL, or one plugin's result to the next in a chain.
pub fn with_prev_result(conf: &Value, prev: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c
}

/// A plugin's exit code and output, with its stdout parsed when it is JSON.
#[derive(Clone, Debug)]
pub struct CniOutput {
    pub out: Output,
    pub json: Option<Value>,
}

/// A CNI error object (spec section 5, "Error").
#[derive(Clone, Debug)]
pub struct CniError {
    /// Sluice always sets it; the reference plugins (1.1.1) leave it out.
    pub cni_version: Option<String>,
    pub code: u64,
    pub msg: String,
    pub details: String,
}

impl CniError {
    /// `msg` and `details` together: where an error has to name what was wrong.
    pub fn text(&self) -> String {
        format!("{} {}", self.msg, self.details)
    }

    /// Asserts that the message names every one of `words`.
    #[track_caller]
    pub fn assert_names(&self, words: &[&str]) {
        let t = self.text();
        for w in words {
            assert!(t.contains(w), "error should name {w:?}: {self:?}");
        }
    }
}

impl CniOutput {
    pub fn new(out: Output) -> Self {
        let json = serde_json::from_str(out.stdout.trim()).ok();
        Self { out, json }
    }

    pub fn success(&self) -> bool {
        self.out.success()
    }

    /// Asserts exit 0 and returns the JSON result (ADD, VERSION).
    #[track_caller]
    pub fn result(&self) -> Value {
        assert!(self.out.success(), "expected success: {self}");
        match &self.json {
            Some(v @ Value::Object(_)) => v.clone(),
            _ => panic!("expected a JSON object on stdout: {self}"),
        }
    }

    /// Asserts exit 0 and an empty stdout (DEL, CHECK, GC, STATUS).
    #[track_caller]
    pub fn ok_silent(&self) {
        assert!(self.out.success(), "expected success: {self}");
        assert!(
            self.out.stdout.trim().is_empty(),
            "expected nothing on stdout: {self}"
        );
    }

    /// Asserts Sluice's error shape (exit 1, `code`, `msg`, `cniVersion` on
    /// stdout) with `code`, and returns it.
    #[track_caller]
    pub fn error(&self, code: u64) -> CniError {
        let e = self.any_error();
        assert_eq!(e.code, code, "expected CNI error code {code}: {self}");
        assert!(
            e.cni_version.is_some(),
            "the error has no cniVersion: {self}"
        );
        e
    }

    /// Asserts the CNI error shape (exit 1, `code` and `msg` on stdout) whatever
    /// the code.
    #[track_caller]
    pub fn any_error(&self) -> CniError {
        assert_eq!(self.out.status, Some(1), "expected exit code 1: {self}");
        let Some(Value::Object(o)) = &self.json else {
            panic!("expected a CNI error object on stdout: {self}");
        };
        let s = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
        let Some(code) = o.get("code").and_then(Value::as_u64) else {
            panic!("the error has no numeric code: {self}");
        };
        let Some(msg) = s("msg").filter(|m| !m.is_empty()) else {
            panic!("the error has no msg: {self}");
        };
        CniError {
            cni_version: s("cniVersion"),
            code,
            msg,
            details: s("details").unwrap_or_default(),
        }
    }
}

impl fmt::Display for CniOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.out.fmt(f)
    }
}
