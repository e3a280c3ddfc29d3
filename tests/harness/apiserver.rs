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
//! Each request line and `Authorization` header is recorded
//! ([`ApiServer::requests`], [`ApiServer::authorizations`]), so a test can see
//! that the client watched instead of polling and sent its token.
//!
//! [`ApiServer::start_tls`] serves HTTPS (rustls) with a certificate for
//! 127.0.0.1 signed by a CA of the test's own (made with `openssl`): what a
//! pod's in-cluster client meets, `ca.crt` and all.
use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    ServerConfig, ServerConnection, StreamOwned,
};

use crate::{err, exec, masq::in_netns, Result};

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
    authorizations: Vec<String>,
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
    /// With TLS: the CA's certificate (PEM).
    ca: Option<PathBuf>,
}

impl ApiServer {
    /// Listens on `bind` (port 0: any) inside the network namespace `netns`;
    /// plain HTTP.
    pub fn start(netns: &Path, bind: &str) -> Result<Self> {
        Self::listen(netns, bind, None, None)
    }

    /// [`Self::start`] with HTTPS: a CA and a server certificate for
    /// 127.0.0.1 are made under `dir`.
    pub fn start_tls(netns: &Path, bind: &str, dir: &Path) -> Result<Self> {
        let (config, ca) = tls_config(dir)?;
        Self::listen(netns, bind, Some(Arc::new(config)), Some(ca))
    }

    fn listen(
        netns: &Path,
        bind: &str,
        tls: Option<Arc<ServerConfig>>,
        ca: Option<PathBuf>,
    ) -> Result<Self> {
        let bind = bind.to_string();
        let listener = in_netns(netns, move || Ok(TcpListener::bind(bind.as_str())?))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let accept = thread::spawn(move || accept_loop(&listener, &s, tls.as_ref()));
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
            ca,
        })
    }

    /// The CA certificate (PEM file) of a TLS stand-in.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.ca.as_deref()
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

    /// The `Authorization` headers received (`Bearer <token>`).
    pub fn authorizations(&self) -> Vec<String> {
        self.shared
            .inner
            .lock()
            .map(|i| i.authorizations.clone())
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

/// A CA and a server certificate for 127.0.0.1 (and the in-cluster DNS name)
/// made with `openssl` under `dir`; the server's rustls config and the CA's path.
fn tls_config(dir: &Path) -> Result<(ServerConfig, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let p = |f: &str| dir.join(f).display().to_string();
    let (ca_key, ca_crt, key, csr) = (p("ca.key"), p("ca.crt"), p("server.key"), p("server.csr"));
    let openssl = |args: &[&str]| exec::tool(None, "openssl", args).map(drop);
    // `openssl req` making a P-256 key at `key_out` and, with `more`, a
    // certificate or a signing request.
    let new_key = |key_out: &str, more: &[&str]| {
        let mut args = vec![
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ];
        args.extend(["-nodes", "-keyout", key_out]);
        args.extend(more);
        openssl(&args)
    };
    new_key(
        &ca_key,
        &[
            "-x509",
            "-out",
            &ca_crt,
            "-days",
            "1",
            "-subj",
            "/CN=sluice-test-ca",
        ],
    )?;
    new_key(&key, &["-out", &csr, "-subj", "/CN=kube-apiserver"])?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n\
         basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("server.csr"),
        "-CA",
        &p("ca.crt"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-out",
        &p("server.crt"),
        "-days",
        "1",
        "-extfile",
        &p("ext.cnf"),
    ])?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.crt"))
        .map_err(|e| err!("reading server.crt: {e}"))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| err!("reading server.crt: {e}"))?;
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key"))
        .map_err(|e| err!("reading server.key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| err!("TLS certificate: {e}"))?;
    Ok((config, dir.join("ca.crt")))
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, tls: Option<&Arc<ServerConfig>>) {
    let mut conns = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let sh = Arc::clone(shared);
                let tls = tls.cloned();
                conns.push(thread::spawn(move || {
                    let _ = connection(s, &sh, tls);
                }));
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

fn connection(s: TcpStream, shared: &Shared, tls: Option<Arc<ServerConfig>>) -> Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(IO))?;
    s.set_write_timeout(Some(IO))?;
    match tls {
        None => serve(s, shared),
        Some(config) => {
            let conn = ServerConnection::new(config).map_err(|e| err!("TLS: {e}"))?;
            serve(StreamOwned::new(conn, s), shared)
        }
    }
}

/// Reads a request head (at most 64 KiB), byte by byte: nothing after it is read.
fn read_head(s: &mut impl Read) -> Result<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 || head.len() > 64 << 10 {
            break;
        }
        head.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn serve(mut s: impl Read + Write, shared: &Shared) -> Result<()> {
    let head = read_head(&mut s)?;
    let mut lines = head.lines();
    let line = lines.next().unwrap_or_default().to_string();
    let auth = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("authorization")
            .then(|| v.trim().to_string())
    });
    if let Ok(mut i) = shared.inner.lock() {
        i.requests.push(line.clone());
        i.authorizations.extend(auth);
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
    let out = &mut s;
    if method != "GET" {
        return respond(out, 405, &status(405, "MethodNotAllowed", method));
    }
    if path == "/api/v1/nodes" {
        if param("watch").is_some_and(|w| w == "true" || w == "1") {
            let from = param("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let secs = param("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(60);
            return watch(out, shared, from, Duration::from_secs(secs).min(MAX_WATCH));
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
        return respond(out, 200, &list);
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
            Some(n) => respond(out, 200, &n),
            None => respond(
                out,
                404,
                &status(404, "NotFound", &format!("nodes \"{name}\" not found")),
            ),
        };
    }
    respond(out, 404, &status(404, "NotFound", path))
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(s: &mut impl Write, code: u16, body: &Value) -> Result<()> {
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
    s.flush()?;
    Ok(())
}

/// The events after `from`, then new ones as they come; the body ends when the
/// connection closes (no length: HTTP/1.1 with `Connection: close`).
fn watch(s: &mut impl Write, shared: &Shared, from: u64, limit: Duration) -> Result<()> {
    write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    )?;
    s.flush()?;
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
