//! A stand-in for kube-apiserver serving Nodes, for `sluice-node`'s tests.
//!
//! None of the registries this project builds from carries a Kubernetes API
//! server (Debian has kubectl and etcd, not kube-apiserver; nothing on PyPI,
//! npm or crates.io ships it), so the tests talk to this. It speaks the part
//! of the API that kube-rs uses for Nodes, over plain HTTP/1.1:
//! - `GET /api/v1/nodes/<name>`: the Node, or a 404 `Status`;
//! - `GET /api/v1/nodes` (paging parameters ignored): a `NodeList` with the
//!   current `resourceVersion`;
//! - `GET /api/v1/nodes?watch=true&resourceVersion=N`: the events after `N` as
//!   JSON lines (`ADDED`, `MODIFIED`, `DELETED`), then every new one as it
//!   happens, until `timeoutSeconds`, the stand-in's end, or the client leaves.
//!
//! Each request line is recorded ([`ApiServer::requests`]), so a test can see
//! that the client watched instead of polling.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{err, masq::in_netns, Result};

/// Longest a watch stays open when the client asks for longer.
const MAX_WATCH: Duration = Duration::from_mins(5);
/// Timeout of reading a request and of each write.
const IO: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Inner {
    rv: u64,
    nodes: BTreeMap<String, Value>,
    /// (resourceVersion, type, object) of every change.
    events: Vec<(u64, &'static str, Value)>,
    requests: Vec<String>,
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    changed: Condvar,
    stop: AtomicBool,
}

/// See the module documentation. Stops (closing every watch) when dropped.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Listens on `bind` (port 0: any) inside the network namespace `netns`.
    pub fn start(netns: &Path, bind: &str) -> Result<Self> {
        let bind = bind.to_string();
        let listener = in_netns(netns, move || Ok(TcpListener::bind(bind.as_str())?))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let accept = thread::spawn(move || accept_loop(&listener, &s));
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A kubeconfig (JSON, which is YAML) for a client reaching the stand-in
    /// at `host` (an address of the namespace it listens in).
    pub fn kubeconfig(&self, host: &str) -> String {
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": format!("http://{host}:{}", self.port())}}],
            "users": [{"name": "stand-in", "user": {}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in"}}],
            "current-context": "stand-in",
        })
        .to_string()
    }

    /// Creates or replaces Node `name` with these pod CIDRs and InternalIPs.
    pub fn set_node(&self, name: &str, pod_cidrs: &[&str], internal_ips: &[&str]) {
        let addresses: Vec<Value> = internal_ips
            .iter()
            .map(|a| json!({"type": "InternalIP", "address": a}))
            .chain([json!({"type": "Hostname", "address": name})])
            .collect();
        let mut spec = json!({});
        if let Some(first) = pod_cidrs.first() {
            spec = json!({"podCIDR": first, "podCIDRs": pod_cidrs});
        }
        self.change(|inner, rv| {
            let node = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv.to_string()},
                "spec": spec,
                "status": {"addresses": addresses},
            });
            let kind = if inner.nodes.contains_key(name) { "MODIFIED" } else { "ADDED" };
            inner.nodes.insert(name.to_string(), node.clone());
            Some((kind, node))
        });
    }

    /// Deletes Node `name` (nothing if there is none).
    pub fn delete_node(&self, name: &str) {
        self.change(|inner, rv| {
            let mut node = inner.nodes.remove(name)?;
            node["metadata"]["resourceVersion"] = json!(rv.to_string());
            Some(("DELETED", node))
        });
    }

    fn change(&self, f: impl FnOnce(&mut Inner, u64) -> Option<(&'static str, Value)>) {
        if let Ok(mut inner) = self.shared.inner.lock() {
            let rv = inner.rv + 1;
            if let Some((kind, obj)) = f(&mut inner, rv) {
                inner.rv = rv;
                inner.events.push((rv, kind, obj));
            }
        }
        self.shared.changed.notify_all();
    }

    /// The request lines served so far (`GET /api/v1/nodes?watch=true...`).
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .inner
            .lock()
            .map(|i| i.requests.clone())
            .unwrap_or_default()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut conns = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let sh = Arc::clone(shared);
                conns.push(thread::spawn(move || {
                    let _ = serve(s, &sh);
                }));
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

fn serve(s: TcpStream, shared: &Shared) -> Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(IO))?;
    s.set_write_timeout(Some(IO))?;
    let mut reader = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end().to_string();
    // The headers: nothing in them changes the answer.
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    if let Ok(mut i) = shared.inner.lock() {
        i.requests.push(line.clone());
    }
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    let mut out = s;
    if method != "GET" {
        return respond(&mut out, 405, &status(405, "MethodNotAllowed", method));
    }
    if path == "/api/v1/nodes" {
        if param("watch").is_some_and(|w| w == "true" || w == "1") {
            let from = param("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let secs = param("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(60);
            return watch(
                &mut out,
                shared,
                from,
                Duration::from_secs(secs).min(MAX_WATCH),
            );
        }
        let list = {
            let i = shared
                .inner
                .lock()
                .map_err(|_| err!("stand-in state poisoned"))?;
            json!({
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {"resourceVersion": i.rv.to_string()},
                "items": i.nodes.values().cloned().collect::<Vec<_>>(),
            })
        };
        return respond(&mut out, 200, &list);
    }
    if let Some(name) = path.strip_prefix("/api/v1/nodes/") {
        let node = shared
            .inner
            .lock()
            .map_err(|_| err!("stand-in state poisoned"))?
            .nodes
            .get(name)
            .cloned();
        return match node {
            Some(n) => respond(&mut out, 200, &n),
            None => respond(
                &mut out,
                404,
                &status(404, "NotFound", &format!("nodes \"{name}\" not found")),
            ),
        };
    }
    respond(&mut out, 404, &status(404, "NotFound", path))
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(s: &mut TcpStream, code: u16, body: &Value) -> Result<()> {
    let body = body.to_string();
    let text = match code {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    write!(
        s,
        "HTTP/1.1 {code} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    Ok(())
}

/// The events after `from`, then new ones as they come; the body ends when the
/// connection closes (no length: HTTP/1.1 with `Connection: close`).
fn watch(s: &mut TcpStream, shared: &Shared, from: u64, limit: Duration) -> Result<()> {
    write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let end = Instant::now() + limit;
    let mut sent = from;
    let mut guard = shared
        .inner
        .lock()
        .map_err(|_| err!("stand-in state poisoned"))?;
    while Instant::now() < end && !shared.stop.load(Ordering::Relaxed) {
        let new: Vec<String> = guard
            .events
            .iter()
            .filter(|(rv, _, _)| *rv > sent)
            .map(|(_, kind, obj)| json!({"type": kind, "object": obj}).to_string())
            .collect();
        sent = guard.rv;
        if !new.is_empty() {
            drop(guard);
            for e in new {
                s.write_all(e.as_bytes())?;
                s.write_all(b"\n")?;
            }
            s.flush()?;
            guard = shared
                .inner
                .lock()
                .map_err(|_| err!("stand-in state poisoned"))?;
            continue;
        }
        guard = shared
            .changed
            .wait_timeout(guard, Duration::from_millis(200))
            .map_err(|_| err!("stand-in state poisoned"))?
            .0;
    }
    Ok(())
}
