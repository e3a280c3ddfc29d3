//! A stand-in for kube-apiserver, for `sluice-node`'s tests.
//!
//! None of the registries this project builds from carries a Kubernetes API
//! server (Debian has kubectl and etcd, not kube-apiserver; nothing on PyPI,
//! npm or crates.io ships it), so the tests talk to this. It speaks the part
//! of the API that kube-rs uses (its `Api` calls, its `watcher`'s
//! list-then-watch, its reconnects and relists), over HTTP/1.1, for seven
//! resources: Nodes, Namespaces (v1, cluster-scoped), Services, Pods (v1,
//! namespaced), ServiceCIDRs (networking.k8s.io/v1, cluster-scoped),
//! NetworkPolicy objects (networking.k8s.io/v1, namespaced) and EndpointSlices
//! (discovery.k8s.io/v1, namespaced). Per resource (`R` being
//! `/api/v1/nodes`, `/api/v1/namespaces`, `/api/v1/services`,
//! `/api/v1/namespaces/<ns>/services`, `/api/v1/pods`,
//! `/api/v1/namespaces/<ns>/pods`, `/apis/networking.k8s.io/v1/servicecidrs`,
//! `/apis/networking.k8s.io/v1/networkpolicies`,
//! `/apis/networking.k8s.io/v1/namespaces/<ns>/networkpolicies`,
//! `/apis/discovery.k8s.io/v1/endpointslices`,
//! `/apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices`; so
//! `/api/v1/namespaces/<name>` is a Namespace, `/api/v1/namespaces/<ns>/pods`
//! the Pods in one):
//! - `GET R/<name>`: the object, or a 404 `Status`;
//! - `GET R`: a `<Kind>List` with the current `resourceVersion`; with
//!   `limit`, pages with a `continue` token over a snapshot taken at the first
//!   page ([`ApiServer::set_max_page`] makes pages smaller than the client
//!   asks for, as a server may); an unknown token is `410 Expired`;
//! - `GET R?watch=true&resourceVersion=N`: the changes after `N` as JSON
//!   lines (`ADDED`, `MODIFIED`, `DELETED`), then each new one as it happens,
//!   until `timeoutSeconds`, the stand-in's end, or the client leaves. Without
//!   `N` (or `0`), synthetic `ADDED` events of every object first. With
//!   `allowWatchBookmarks=true`, a `BOOKMARK` carrying the resource version
//!   the watch has got to, when nothing else was sent for
//!   [`ApiServer::set_bookmark_interval`] (1 s by default: kube-apiserver
//!   sends one about every minute). A watch from a resource version older
//!   than the history kept ([`ApiServer::expire`], [`ApiServer::compact`])
//!   gets what kube-apiserver sends: `200`, then one `ERROR` event with a
//!   `410` `Expired` `Status`, after which kube-rs lists again.
//! - `fieldSelector` (`spec.nodeName=node-a`, `metadata.name!=x`, terms
//!   separated by commas) filters lists and watches: a watch sends `ADDED`
//!   when an object comes to match and `DELETED` when it stops, as
//!   kube-apiserver does (any field path here, where kube-apiserver allows
//!   only those each resource indexes).
//!
//! Resource versions are one counter for every resource, as etcd's revision
//! is: a watch of Services falls behind while Nodes change, and only
//! bookmarks move it on. Discovery is served as kube-rs's `Discovery` reads it
//! (`/api`, `/api/v1`, `/apis`, `/apis/<group>` and `/apis/<group>/v1` for
//! `networking.k8s.io` and `discovery.k8s.io`, each group version listing
//! only the resources served here). [`ApiServer::set_service_cidr_api`]`(false)`
//! makes the cluster one from before Kubernetes 1.33: discovery leaves
//! ServiceCIDRs out, their paths answer `404 NotFound`, and open watches of
//! them end.
//!
//! Each request line and `Authorization` header is recorded
//! ([`ApiServer::requests`], [`ApiServer::authorizations`]), so a test can see
//! that the client watched instead of polling, listed again after a `410`,
//! and sent its token.
//!
//! [`ApiServer::start_tls`] serves HTTPS (rustls) with a certificate for
//! 127.0.0.1 signed by a CA of the test's own (made with `openssl`): what a
//! pod's in-cluster client meets, `ca.crt` and all.
//!
//! What it does not cover: the token is recorded, never checked, and there is
//! no RBAC (every request is allowed; the manifest's `ClusterRole` is checked
//! against the requests the agent makes only by reading it); no writes
//! (`POST`, `PUT`, `PATCH`, `DELETE` get `405`); label selectors are ignored
//! (every object matches); no `sendInitialEvents` (streaming lists),
//! no `resourceVersionMatch` (a list is always the latest state), no
//! aggregated discovery (`apidiscovery.k8s.io/v2`), no protobuf, no HTTP/2,
//! one connection per request (`Connection: close`); no admission, defaulting
//! or validation (objects are served as the test wrote them: no
//! EndpointSlice controller either, a test puts the slices of its Services
//! itself, and nothing ties them to the Services or Pods; no namespace
//! controller: a Namespace deleted leaves its objects; no scheduler or
//! kubelet: a Pod is bound and running as the test wrote it); only the `v1` of
//! each group (no `discovery.k8s.io/v1beta1`); and none of the
//! real server's behaviour under load (priority and fairness, `429`, watch
//! cache sizes).
use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
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
/// Default time between bookmarks of a quiet watch.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);
/// How often an open watch looks at its stop conditions without a change.
const WATCH_TICK: Duration = Duration::from_millis(100);

/// The API groups served besides the core one (`v1` of each).
const NETWORKING: &str = "networking.k8s.io";
const DISCOVERY: &str = "discovery.k8s.io";
const GROUPS: [&str; 2] = [NETWORKING, DISCOVERY];

/// A resource the stand-in serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    /// `nodes` (v1, cluster-scoped).
    Nodes,
    /// `services` (v1, namespaced).
    Services,
    /// `servicecidrs` (networking.k8s.io/v1, cluster-scoped).
    ServiceCidrs,
    /// `endpointslices` (discovery.k8s.io/v1, namespaced).
    EndpointSlices,
    /// `pods` (v1, namespaced).
    Pods,
    /// `namespaces` (v1, cluster-scoped).
    Namespaces,
    /// `networkpolicies` (networking.k8s.io/v1, namespaced).
    NetworkPolicies,
}

impl Resource {
    const ALL: [Self; 7] = [
        Self::Nodes,
        Self::Services,
        Self::ServiceCidrs,
        Self::EndpointSlices,
        Self::Pods,
        Self::Namespaces,
        Self::NetworkPolicies,
    ];

    fn kind(self) -> &'static str {
        match self {
            Self::Nodes => "Node",
            Self::Services => "Service",
            Self::ServiceCidrs => "ServiceCIDR",
            Self::EndpointSlices => "EndpointSlice",
            Self::Pods => "Pod",
            Self::Namespaces => "Namespace",
            Self::NetworkPolicies => "NetworkPolicy",
        }
    }

    fn singular(self) -> &'static str {
        match self {
            Self::Nodes => "node",
            Self::Services => "service",
            Self::ServiceCidrs => "servicecidr",
            Self::EndpointSlices => "endpointslice",
            Self::Pods => "pod",
            Self::Namespaces => "namespace",
            Self::NetworkPolicies => "networkpolicy",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Self::Nodes => "nodes",
            Self::Services => "services",
            Self::ServiceCidrs => "servicecidrs",
            Self::EndpointSlices => "endpointslices",
            Self::Pods => "pods",
            Self::Namespaces => "namespaces",
            Self::NetworkPolicies => "networkpolicies",
        }
    }

    /// The API group ("" for the core group).
    fn group(self) -> &'static str {
        match self {
            Self::Nodes | Self::Services | Self::Pods | Self::Namespaces => "",
            Self::ServiceCidrs | Self::NetworkPolicies => NETWORKING,
            Self::EndpointSlices => DISCOVERY,
        }
    }

    fn api_version(self) -> &'static str {
        match self.group() {
            "" => "v1",
            NETWORKING => "networking.k8s.io/v1",
            _ => "discovery.k8s.io/v1",
        }
    }

    fn namespaced(self) -> bool {
        matches!(
            self,
            Self::Services | Self::EndpointSlices | Self::Pods | Self::NetworkPolicies
        )
    }

    /// `kubectl`'s short names, as discovery lists them.
    fn short_names(self) -> &'static [&'static str] {
        match self {
            Self::Nodes => &["no"],
            Self::Services => &["svc"],
            Self::Pods => &["po"],
            Self::Namespaces => &["ns"],
            Self::NetworkPolicies => &["netpol"],
            Self::ServiceCidrs | Self::EndpointSlices => &[],
        }
    }

    /// What a `Status` calls it: `services`, `servicecidrs.networking.k8s.io`.
    fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_string(),
            g => format!("{}.{g}", self.plural()),
        }
    }

    /// The API resource entry discovery lists for it.
    fn discovery(self) -> Value {
        let mut v = json!({
            "name": self.plural(),
            "singularName": self.singular(),
            "namespaced": self.namespaced(),
            "kind": self.kind(),
            "verbs": ["get", "list", "watch"],
        });
        if !self.short_names().is_empty() {
            v["shortNames"] = json!(self.short_names());
        }
        v
    }
}

/// An object's key: resource, namespace ("" for cluster-scoped), name.
type Key = (Resource, String, String);

/// One change: (resourceVersion, resource, event type, object, and for a
/// `MODIFIED`, the object before: a watch with a field selector sends
/// `ADDED` or `DELETED` when an object starts or stops matching).
struct Change {
    rv: u64,
    res: Resource,
    ns: String,
    kind: &'static str,
    obj: Value,
    prev: Option<Value>,
}

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change since `compacted`.
    changes: Vec<Change>,
    /// Watches from a resource version below this get `410 Expired`.
    compacted: u64,
    /// Bumped to end every open watch.
    generation: u64,
    /// Open watches send nothing while set.
    held: bool,
    service_cidr_api: bool,
    bookmark_every: Duration,
    max_page: Option<usize>,
    /// Pages still to serve, by `continue` token: (resourceVersion, items).
    pages: BTreeMap<String, (u64, Vec<Value>)>,
    next_token: u64,
    requests: Vec<String>,
    authorizations: Vec<String>,
    expired: usize,
    bookmarks: usize,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            rv: 0,
            objects: BTreeMap::new(),
            changes: Vec::new(),
            compacted: 0,
            generation: 0,
            held: false,
            service_cidr_api: true,
            bookmark_every: BOOKMARK_EVERY,
            max_page: None,
            pages: BTreeMap::new(),
            next_token: 0,
            requests: Vec::new(),
            authorizations: Vec::new(),
            expired: 0,
            bookmarks: 0,
        }
    }
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    changed: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| err!("stand-in state poisoned"))
    }
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
        Self::serving(listener, tls, ca)
    }

    /// Serves on `listener`, bound wherever the caller chose (the unit tests:
    /// 127.0.0.1 of the namespace they run in, no privilege needed).
    fn serving(
        listener: TcpListener,
        tls: Option<Arc<ServerConfig>>,
        ca: Option<PathBuf>,
    ) -> Result<Self> {
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

    /// Changes the state under the lock, then wakes the watches.
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        if let Ok(mut inner) = self.shared.inner.lock() {
            f(&mut inner);
        }
        self.shared.changed.notify_all();
    }

    /// Creates or replaces `obj` (its `metadata.name`, and for a namespaced
    /// resource, its `metadata.namespace`, default `default`) as a `res`; `apiVersion`, `kind`, `uid` and
    /// `resourceVersion` are set here.
    pub fn put(&self, res: Resource, mut obj: Value) {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let ns = if res.namespaced() {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            obj["metadata"]["namespace"] = json!(ns);
            ns
        } else {
            String::new()
        };
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind());
        obj["metadata"]["uid"] = json!(format!("uid-{}-{ns}-{name}", res.plural()));
        self.with(|inner| {
            let rv = inner.rv + 1;
            inner.rv = rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            let key = (res, ns.clone(), name);
            let prev = inner.objects.insert(key, obj.clone());
            let kind = if prev.is_some() { "MODIFIED" } else { "ADDED" };
            inner.changes.push(Change {
                rv,
                res,
                ns,
                kind,
                obj,
                prev,
            });
        });
    }

    /// Deletes the `res` named `name` (in namespace `ns`, ignored for
    /// cluster-scoped resources); nothing if there is none.
    pub fn delete(&self, res: Resource, ns: &str, name: &str) {
        let ns = if res.namespaced() { ns } else { "" }.to_string();
        self.with(|inner| {
            let Some(mut obj) = inner.objects.remove(&(res, ns.clone(), name.to_string())) else {
                return;
            };
            let rv = inner.rv + 1;
            inner.rv = rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            inner.changes.push(Change {
                rv,
                res,
                ns,
                kind: "DELETED",
                obj,
                prev: None,
            });
        });
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
        self.put(
            Resource::Nodes,
            json!({
                "metadata": {"name": name},
                "spec": spec,
                "status": {"addresses": addresses},
            }),
        );
    }

    /// Deletes Node `name` (nothing if there is none).
    pub fn delete_node(&self, name: &str) {
        self.delete(Resource::Nodes, "", name);
    }

    /// Creates or replaces Service `ns/name` with this `spec` and `status`.
    pub fn set_service(&self, ns: &str, name: &str, spec: &Value, status: &Value) {
        self.put(
            Resource::Services,
            json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": spec,
                "status": status,
            }),
        );
    }

    /// Deletes Service `ns/name` (nothing if there is none).
    pub fn delete_service(&self, ns: &str, name: &str) {
        self.delete(Resource::Services, ns, name);
    }

    /// Creates or replaces ServiceCIDR `name` with these `spec.cidrs`.
    pub fn set_service_cidr(&self, name: &str, cidrs: &[&str]) {
        self.put(
            Resource::ServiceCidrs,
            json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}}),
        );
    }

    /// Deletes ServiceCIDR `name` (nothing if there is none).
    pub fn delete_service_cidr(&self, name: &str) {
        self.delete(Resource::ServiceCidrs, "", name);
    }

    /// Creates or replaces EndpointSlice `ns/name` of Service `service` (its
    /// `kubernetes.io/service-name` label, and the `managed-by` label of the
    /// EndpointSlice controller) with this `addressType` (`IPv4`, `IPv6`,
    /// `FQDN`), `endpoints` and `ports` (JSON arrays as in the API).
    pub fn set_endpoint_slice(
        &self,
        ns: &str,
        name: &str,
        service: &str,
        address_type: &str,
        endpoints: &Value,
        ports: &Value,
    ) {
        self.put(
            Resource::EndpointSlices,
            json!({
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {
                        "kubernetes.io/service-name": service,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    },
                },
                "addressType": address_type,
                "endpoints": endpoints,
                "ports": ports,
            }),
        );
    }

    /// Deletes EndpointSlice `ns/name` (nothing if there is none).
    pub fn delete_endpoint_slice(&self, ns: &str, name: &str) {
        self.delete(Resource::EndpointSlices, ns, name);
    }

    /// Creates or replaces Namespace `name` with these labels, and the
    /// `kubernetes.io/metadata.name` label kube-apiserver gives every
    /// namespace (what a `namespaceSelector` by name matches); `Active`.
    pub fn set_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let mut l = label_map(labels);
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
        self.put(
            Resource::Namespaces,
            json!({
                "metadata": {"name": name, "labels": l},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }),
        );
    }

    /// Deletes Namespace `name` (nothing if there is none). Its objects stay:
    /// there is no namespace controller to remove them, a test deletes them
    /// itself.
    pub fn delete_namespace(&self, name: &str) {
        self.delete(Resource::Namespaces, "", name);
    }

    /// Creates or replaces Pod `ns/name` on Node `node` (`""`: not scheduled,
    /// `Pending`; else `Running`), with these labels and addresses
    /// (`status.podIP` the first, `status.podIPs` all) and one container per
    /// element of `ports` (a JSON array of each container's `ports` array, as
    /// in the API: `[[{"name": "http", "containerPort": 80, "protocol":
    /// "TCP"}], []]`; one container without ports when it has none).
    pub fn set_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        ips: &[&str],
        ports: &Value,
    ) {
        let per_container: Vec<Value> = match ports.as_array() {
            Some(a) if !a.is_empty() => a.clone(),
            _ => vec![json!([])],
        };
        let containers: Vec<Value> = per_container
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut c = json!({
                    "name": format!("c{i}"),
                    "image": "registry.k8s.io/pause:3.10",
                });
                if p.as_array().is_some_and(|a| !a.is_empty()) {
                    c["ports"] = p.clone();
                }
                c
            })
            .collect();
        let mut spec = json!({"containers": containers});
        if !node.is_empty() {
            spec["nodeName"] = json!(node);
        }
        let mut status = json!({"phase": if node.is_empty() { "Pending" } else { "Running" }});
        if let Some(first) = ips.first() {
            status["podIP"] = json!(first);
            status["podIPs"] = json!(ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>());
        }
        self.put(
            Resource::Pods,
            json!({
                "metadata": {"name": name, "namespace": ns, "labels": label_map(labels)},
                "spec": spec,
                "status": status,
            }),
        );
    }

    /// Deletes Pod `ns/name` (nothing if there is none).
    pub fn delete_pod(&self, ns: &str, name: &str) {
        self.delete(Resource::Pods, ns, name);
    }

    /// Creates or replaces NetworkPolicy `ns/name` with this `spec` (as in
    /// the API: `podSelector`, `policyTypes`, `ingress`, `egress`).
    pub fn set_network_policy(&self, ns: &str, name: &str, spec: &Value) {
        self.put(
            Resource::NetworkPolicies,
            json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}),
        );
    }

    /// Deletes NetworkPolicy `ns/name` (nothing if there is none).
    pub fn delete_network_policy(&self, ns: &str, name: &str) {
        self.delete(Resource::NetworkPolicies, ns, name);
    }

    /// Serves the ServiceCIDR API (the default), or not: a cluster from
    /// before Kubernetes 1.33 (404s; open ServiceCIDR watches end).
    pub fn set_service_cidr_api(&self, on: bool) {
        self.with(|inner| inner.service_cidr_api = on);
    }

    /// Time between bookmarks of a quiet watch that asked for them.
    pub fn set_bookmark_interval(&self, every: Duration) {
        self.with(|inner| inner.bookmark_every = every);
    }

    /// At most this many items per list page, whatever `limit` the client
    /// asks for (`None`: the client's `limit`).
    pub fn set_max_page(&self, max: Option<usize>) {
        self.with(|inner| inner.max_page = max);
    }

    /// Open watches send nothing (no event, no bookmark past what they sent)
    /// until [`Self::expire`] or [`Self::close_watches`]: changes made
    /// meanwhile reach the clients only by a new watch or list.
    pub fn hold_watches(&self) {
        self.with(|inner| inner.held = true);
    }

    /// Ends every open watch (kube-rs watches again from the last resource
    /// version it saw).
    pub fn close_watches(&self) {
        self.with(|inner| {
            inner.generation += 1;
            inner.held = false;
        });
    }

    /// Forgets the history up to now (etcd's compaction) and ends a
    /// [`Self::hold_watches`]: a watch from an older resource version gets
    /// `410 Expired`, and so does an open watch that had not delivered
    /// everything (inside its stream, as kube-apiserver does); the others go on.
    pub fn compact(&self) {
        self.with(|inner| {
            inner.compacted = inner.rv;
            inner.changes.clear();
            inner.held = false;
        });
    }

    /// [`Self::compact`] and [`Self::close_watches`] at once: every client
    /// that had not seen the latest change must list again.
    pub fn expire(&self) {
        self.with(|inner| {
            inner.compacted = inner.rv;
            inner.changes.clear();
            inner.generation += 1;
            inner.held = false;
        });
    }

    /// How many watches were answered `410 Expired`.
    pub fn expired_watches(&self) -> usize {
        self.shared.lock().map(|i| i.expired).unwrap_or_default()
    }

    /// How many bookmarks were sent.
    pub fn bookmarks_sent(&self) -> usize {
        self.shared.lock().map(|i| i.bookmarks).unwrap_or_default()
    }

    /// The request lines served so far (`GET /api/v1/nodes?watch=true...`).
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .lock()
            .map(|i| i.requests.clone())
            .unwrap_or_default()
    }

    /// The `Authorization` headers received (`Bearer <token>`).
    pub fn authorizations(&self) -> Vec<String> {
        self.shared
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

/// Labels as an object's `metadata.labels`.
fn label_map(labels: &[(&str, &str)]) -> serde_json::Map<String, Value> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect()
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

/// What a request path names.
enum Target {
    Discovery(Value),
    /// A collection: of every namespace (`None`) or of one.
    List(Resource, Option<String>),
    /// One object: resource, namespace ("" if cluster-scoped), name.
    Object(Resource, String, String),
}

/// The `APIGroup` entry of `group` (its one version, `v1`), as `/apis` lists it.
fn api_group(group: &str) -> Value {
    let v1 = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({
        "name": group,
        "versions": [v1.clone()],
        "preferredVersion": v1,
    })
}

fn target(path: &str, inner: &Inner) -> Option<Target> {
    let cidr_api = inner.service_cidr_api;
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let discovery = match segs.as_slice() {
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [],
        })),
        ["api", "v1"] => Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "v1",
            "resources": Resource::ALL
                .iter()
                .filter(|r| r.group().is_empty())
                .map(|r| r.discovery())
                .collect::<Vec<_>>(),
        })),
        ["apis"] => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": GROUPS.map(api_group),
        })),
        ["apis", group] if GROUPS.contains(group) => {
            let mut g = api_group(group);
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            Some(g)
        }
        // Before 1.33 networking.k8s.io/v1 is there with other resources
        // (NetworkPolicies; Ingresses, not served here), without ServiceCIDRs.
        ["apis", group, "v1"] if GROUPS.contains(group) => {
            let resources: Vec<Value> = Resource::ALL
                .iter()
                .filter(|r| r.group() == *group && (cidr_api || **r != Resource::ServiceCidrs))
                .map(|r| r.discovery())
                .collect();
            Some(json!({
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": format!("{group}/v1"),
                "resources": resources,
            }))
        }
        _ => None,
    };
    if let Some(d) = discovery {
        return Some(Target::Discovery(d));
    }
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return None,
    };
    // `namespaces/<ns>/<plural>...` is inside a namespace; `namespaces` and
    // `namespaces/<name>` are the Namespaces themselves.
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest),
        _ => (None, rest),
    };
    let res = *Resource::ALL
        .iter()
        .find(|r| Some(&r.plural()) == rest.first() && r.group() == group)?;
    if (ns.is_some() && !res.namespaced()) || (res == Resource::ServiceCidrs && !cidr_api) {
        return None;
    }
    match rest {
        [_] => Some(Target::List(res, ns)),
        [_, name] if res.namespaced() == ns.is_some() => Some(Target::Object(
            res,
            ns.unwrap_or_default(),
            (*name).to_string(),
        )),
        _ => None,
    }
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
    let mut parts = line.split(' ');
    let (method, target_line) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target_line.split_once('?').unwrap_or((target_line, ""));
    let param = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .map(percent_decode)
    };
    let out = &mut s;
    let found = {
        let mut i = shared.lock()?;
        i.requests.push(line.clone());
        i.authorizations.extend(auth);
        target(path, &i)
    };
    if method != "GET" {
        return respond(out, 405, &status(405, "MethodNotAllowed", method));
    }
    match found {
        None => respond(
            out,
            404,
            &status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        ),
        Some(Target::Discovery(v)) => respond(out, 200, &v),
        Some(Target::Object(res, ns, name)) => {
            let obj = shared
                .lock()?
                .objects
                .get(&(res, ns, name.clone()))
                .cloned();
            match obj {
                Some(o) => respond(out, 200, &o),
                None => respond(
                    out,
                    404,
                    &status(
                        404,
                        "NotFound",
                        &format!("{} \"{name}\" not found", res.qualified()),
                    ),
                ),
            }
        }
        Some(Target::List(res, ns)) => {
            let selector = param("fieldSelector").unwrap_or_default();
            let Some(fields) = Fields::parse(&selector) else {
                return respond(
                    out,
                    400,
                    &status(
                        400,
                        "BadRequest",
                        &format!("invalid field selector {selector:?}"),
                    ),
                );
            };
            let sel = Selection { res, ns, fields };
            if param("watch").is_some_and(|w| w == "true" || w == "1") {
                let from = param("resourceVersion").and_then(|v| v.parse().ok());
                let secs = param("timeoutSeconds")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(60);
                let bookmarks = param("allowWatchBookmarks").is_some_and(|b| b == "true");
                return watch(
                    out,
                    shared,
                    &sel,
                    from,
                    Duration::from_secs(secs).min(MAX_WATCH),
                    bookmarks,
                );
            }
            let limit = param("limit").and_then(|v| v.parse().ok());
            list(out, shared, &sel, limit, param("continue"))
        }
    }
}

/// A page of the objects `sel` selects.
fn list(
    out: &mut impl Write,
    shared: &Shared,
    sel: &Selection,
    limit: Option<usize>,
    cont: Option<String>,
) -> Result<()> {
    let body = {
        let mut i = shared.lock()?;
        let (rv, mut items) = match cont.filter(|c| !c.is_empty()) {
            Some(token) => {
                let Some(p) = i.pages.remove(&token) else {
                    drop(i);
                    return respond(
                        out,
                        410,
                        &status(
                            410,
                            "Expired",
                            "the provided continue parameter is too old to display a consistent list result",
                        ),
                    );
                };
                p
            }
            None => (
                i.rv,
                i.objects
                    .iter()
                    .filter(|((r, n, _), o)| sel.has(*r, n, o))
                    .map(|(_, o)| o.clone())
                    .collect::<Vec<_>>(),
            ),
        };
        let page = match (limit.filter(|l| *l > 0), i.max_page) {
            (Some(l), Some(m)) => Some(l.min(m)),
            (l, m) => l.or(m),
        };
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(n) = page.filter(|n| items.len() > *n) {
            let rest = items.split_off(n);
            i.next_token += 1;
            let token = format!("page-{}", i.next_token);
            meta["remainingItemCount"] = json!(rest.len());
            meta["continue"] = json!(token);
            i.pages.insert(token, (rv, rest));
        }
        json!({
            "apiVersion": sel.res.api_version(),
            "kind": format!("{}List", sel.res.kind()),
            "metadata": meta,
            "items": items,
        })
    };
    respond(out, 200, &body)
}

/// A watch event as the line that carries it.
fn event(kind: &str, obj: &Value) -> String {
    json!({"type": kind, "object": obj}).to_string()
}

/// A query parameter's value with `%XX` and `+` decoded (kube-rs sends
/// `fieldSelector=spec.nodeName%3Dnode-a`).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%')
            .then(|| v.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (_, Some(x)) => {
                out.push(x);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            (c, None) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `fieldSelector`: terms `path=value`, `path==value` or `path!=value`,
/// separated by commas, all of which must hold. A path is the field's JSON
/// path (`spec.nodeName`, `metadata.name`, `status.phase`); a missing field
/// is `""`, a number or boolean its JSON text. kube-apiserver allows only
/// the fields each resource indexes (`spec.nodeName` of Pods, `metadata.*`
/// of all) and answers `400` to others; the stand-in takes any path.
#[derive(Clone, Debug, Default)]
struct Fields(Vec<(String, bool, String)>);

impl Fields {
    /// `None` for a term without an operator or path.
    fn parse(s: &str) -> Option<Self> {
        let mut terms = Vec::new();
        for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, eq, value) = if let Some((p, v)) = t.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = t.split_once("==") {
                (p, true, v)
            } else {
                let (p, v) = t.split_once('=')?;
                (p, true, v)
            };
            if path.trim().is_empty() {
                return None;
            }
            terms.push((path.trim().to_string(), eq, value.trim().to_string()));
        }
        Some(Self(terms))
    }

    fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let v = path.split('.').fold(obj, |v, k| &v[k]);
            let have = match v {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            (have == *want) == *eq
        })
    }
}

/// What a list or watch selects: a resource, a namespace (`None`: every
/// one), a field selector.
struct Selection {
    res: Resource,
    ns: Option<String>,
    fields: Fields,
}

impl Selection {
    /// Whether object `obj`, a `r` in namespace `ns`, is selected.
    fn has(&self, r: Resource, ns: &str, obj: &Value) -> bool {
        self.scope(r, ns) && self.fields.matches(obj)
    }

    fn scope(&self, r: Resource, ns: &str) -> bool {
        r == self.res && self.ns.as_deref().is_none_or(|n| n == ns)
    }

    /// The event a watch of this selection sends for change `c`, if any: as
    /// kube-apiserver's watch cache does, an object that starts matching the
    /// field selector is `ADDED`, one that stops is `DELETED` (its last state
    /// that matched, at the change's resource version).
    fn event(&self, c: &Change) -> Option<String> {
        if !self.scope(c.res, &c.ns) {
            return None;
        }
        if c.kind == "DELETED" {
            return self
                .fields
                .matches(&c.obj)
                .then(|| event("DELETED", &c.obj));
        }
        let now = self.fields.matches(&c.obj);
        let before = c.prev.as_ref().filter(|p| self.fields.matches(p));
        match (before, now) {
            (Some(_), true) => Some(event("MODIFIED", &c.obj)),
            (None, true) => Some(event("ADDED", &c.obj)),
            (Some(p), false) => {
                let mut p = p.clone();
                p["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                Some(event("DELETED", &p))
            }
            (None, false) => None,
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(s: &mut impl Write, code: u16, body: &Value) -> Result<()> {
    let body = body.to_string();
    let text = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        410 => "Gone",
        _ => "Error",
    };
    write!(
        s,
        "HTTP/1.1 {code} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()?;
    Ok(())
}

/// A watch of what `sel` selects from `from`: the changes after it, then
/// new ones as they come, bookmarks if asked for; the body ends when the
/// connection closes (no length: HTTP/1.1 with `Connection: close`).
fn watch(
    s: &mut impl Write,
    shared: &Shared,
    sel: &Selection,
    from: Option<u64>,
    limit: Duration,
    bookmarks: bool,
) -> Result<()> {
    write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    )?;
    s.flush()?;
    let res = sel.res;
    let expired = |from: u64, compacted: u64| {
        event(
            "ERROR",
            &status(
                410,
                "Expired",
                &format!("too old resource version: {from} ({compacted})"),
            ),
        )
    };
    let end = Instant::now() + limit;
    let mut guard = shared.lock()?;
    let generation = guard.generation;
    // The last resource version this watch has delivered everything up to.
    let mut sent;
    let mut pending: Vec<String> = Vec::new();
    match from.filter(|n| *n > 0) {
        Some(n) if n < guard.compacted => {
            guard.expired += 1;
            let e = expired(n, guard.compacted);
            drop(guard);
            s.write_all(e.as_bytes())?;
            s.write_all(b"\n")?;
            s.flush()?;
            return Ok(());
        }
        Some(n) => sent = n,
        None => {
            sent = guard.rv;
            pending = guard
                .objects
                .iter()
                .filter(|((r, n, _), o)| sel.has(*r, n, o))
                .map(|(_, o)| event("ADDED", o))
                .collect();
        }
    }
    let mut last_write = Instant::now();
    loop {
        if !pending.is_empty() {
            drop(guard);
            for e in pending.drain(..) {
                s.write_all(e.as_bytes())?;
                s.write_all(b"\n")?;
            }
            s.flush()?;
            last_write = Instant::now();
            guard = shared.lock()?;
            continue;
        }
        if Instant::now() >= end
            || shared.stop.load(Ordering::Relaxed)
            || guard.generation != generation
            || (res == Resource::ServiceCidrs && !guard.service_cidr_api)
        {
            break;
        }
        // The history this watch still needed was compacted away: what
        // etcd and kube-apiserver do, an ERROR event with 410, then the end.
        if sent < guard.compacted {
            guard.expired += 1;
            pending.push(expired(sent, guard.compacted));
            drop(guard);
            for e in pending.drain(..) {
                s.write_all(e.as_bytes())?;
                s.write_all(b"\n")?;
            }
            s.flush()?;
            return Ok(());
        }
        if !guard.held {
            pending = guard
                .changes
                .iter()
                .filter(|c| c.rv > sent)
                .filter_map(|c| sel.event(c))
                .collect();
            sent = sent.max(guard.rv);
            if !pending.is_empty() {
                continue;
            }
        }
        if bookmarks && last_write.elapsed() >= guard.bookmark_every {
            guard.bookmarks += 1;
            pending.push(
                json!({
                    "type": "BOOKMARK",
                    "object": {
                        "kind": res.kind(),
                        "apiVersion": res.api_version(),
                        "metadata": {"resourceVersion": sent.to_string()},
                    },
                })
                .to_string(),
            );
            continue;
        }
        guard = shared
            .changed
            .wait_timeout(guard, WATCH_TICK)
            .map_err(|_| err!("stand-in state poisoned"))?
            .0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The stand-in over plain HTTP on 127.0.0.1 (no namespace, no privilege):
    //! what it serves for EndpointSlices, Pods, Namespaces and NetworkPolicy
    //! objects, field selectors.
    use super::*;

    /// A stand-in on 127.0.0.1 of the namespace the test runs in.
    fn local() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        ApiServer::serving(listener, None, None).unwrap()
    }

    /// `GET path`: the status code and the body (whole: the stand-in closes
    /// the connection after each answer, a watch after its `timeoutSeconds`).
    fn get(api: &ApiServer, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", api.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let code = head.split(' ').nth(1).unwrap().parse().unwrap();
        (code, body.to_string())
    }

    fn get_json(api: &ApiServer, path: &str) -> Value {
        let (code, body) = get(api, path);
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The events of a watch body (one JSON object a line).
    fn events(body: &str) -> Vec<Value> {
        body.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn slice(api: &ApiServer, ns: &str, name: &str, ip: &str) {
        api.set_endpoint_slice(
            ns,
            name,
            "web",
            "IPv4",
            &json!([{"addresses": [ip], "conditions": {"ready": true}}]),
            &json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        );
    }

    fn names(items: &Value) -> Vec<String> {
        items
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let m = &o["metadata"];
                format!(
                    "{}/{}",
                    m["namespace"].as_str().unwrap(),
                    m["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// The resource names of an `APIResourceList`.
    fn resource_names(list: &Value) -> Vec<String> {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// Object names of a list's items, without namespace.
    fn plain_names(list: &Value) -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// `type name` of each event of a watch body but bookmarks.
    fn changes(body: &str) -> Vec<String> {
        events(body)
            .iter()
            .filter(|e| e["type"] != "BOOKMARK")
            .map(|e| {
                format!(
                    "{} {}",
                    e["type"].as_str().unwrap(),
                    e["object"]["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// Opens watches `paths` (each in its own thread, each with
    /// `timeoutSeconds=1`), waits until all asked and had time to start,
    /// runs `change`, and returns each watch's body.
    fn watching(api: &Arc<ApiServer>, paths: &[&str], change: impl FnOnce()) -> Vec<String> {
        let before = api.requests().len();
        let threads: Vec<_> = paths
            .iter()
            .map(|p| {
                let api = Arc::clone(api);
                let p = format!("{p}&timeoutSeconds=1");
                thread::spawn(move || get(&api, &p))
            })
            .collect();
        let asked = Instant::now();
        while api.requests().len() < before + paths.len() {
            assert!(asked.elapsed() < Duration::from_secs(5));
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(Duration::from_millis(200));
        change();
        threads
            .into_iter()
            .map(|t| {
                let (code, body) = t.join().unwrap();
                assert_eq!(code, 200, "{body}");
                body
            })
            .collect()
    }

    #[test]
    fn apiserver_discovery_lists_endpoint_slices() {
        let api = local();
        let groups = get_json(&api, "/apis");
        let discovery = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "discovery.k8s.io")
            .unwrap();
        assert_eq!(
            discovery["preferredVersion"]["groupVersion"],
            "discovery.k8s.io/v1"
        );
        let group = get_json(&api, "/apis/discovery.k8s.io");
        assert_eq!(group["kind"], "APIGroup");
        assert_eq!(group["versions"][0]["version"], "v1");
        let list = get_json(&api, "/apis/discovery.k8s.io/v1");
        assert_eq!(list["kind"], "APIResourceList");
        assert_eq!(list["groupVersion"], "discovery.k8s.io/v1");
        assert_eq!(
            list["resources"],
            json!([{
                "name": "endpointslices",
                "singularName": "endpointslice",
                "namespaced": true,
                "kind": "EndpointSlice",
                "verbs": ["get", "list", "watch"],
            }])
        );
        // networking.k8s.io/v1 lists ServiceCIDRs (not when the API is off)
        // and NetworkPolicies; discovery.k8s.io does not depend on it.
        let net = get_json(&api, "/apis/networking.k8s.io/v1");
        assert_eq!(resource_names(&net), ["servicecidrs", "networkpolicies"]);
        api.set_service_cidr_api(false);
        let net = get_json(&api, "/apis/networking.k8s.io/v1");
        assert_eq!(resource_names(&net), ["networkpolicies"]);
        assert_eq!(
            get_json(&api, "/apis/discovery.k8s.io/v1")["resources"][0]["name"],
            "endpointslices"
        );
        assert_eq!(get(&api, "/apis/discovery.k8s.io/v1beta1").0, 404);
        assert_eq!(get(&api, "/apis/apps").0, 404);
    }

    #[test]
    fn apiserver_lists_and_gets_endpoint_slices() {
        let api = local();
        slice(&api, "a", "web-1", "10.0.0.1");
        slice(&api, "b", "web-2", "10.0.0.2");
        api.set_service("a", "web", &json!({}), &json!({}));

        let all = get_json(&api, "/apis/discovery.k8s.io/v1/endpointslices");
        assert_eq!(all["kind"], "EndpointSliceList");
        assert_eq!(all["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(all["metadata"]["resourceVersion"], "3");
        assert_eq!(names(&all["items"]), ["a/web-1", "b/web-2"]);
        let one = &all["items"][0];
        assert_eq!(one["kind"], "EndpointSlice");
        assert_eq!(one["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(one["addressType"], "IPv4");
        assert_eq!(
            one["metadata"]["labels"]["kubernetes.io/service-name"],
            "web"
        );
        assert_eq!(one["endpoints"][0]["addresses"][0], "10.0.0.1");

        let b = get_json(
            &api,
            "/apis/discovery.k8s.io/v1/namespaces/b/endpointslices",
        );
        assert_eq!(names(&b["items"]), ["b/web-2"]);
        let got = get_json(
            &api,
            "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices/web-1",
        );
        assert_eq!(got["metadata"]["resourceVersion"], "1");

        let (code, body) = get(
            &api,
            "/apis/discovery.k8s.io/v1/namespaces/b/endpointslices/web-1",
        );
        assert_eq!(code, 404);
        assert!(
            body.contains(r#"endpointslices.discovery.k8s.io \"web-1\" not found"#),
            "{body}"
        );
        // Namespaced: no object path without a namespace; not in another group.
        assert_eq!(
            get(&api, "/apis/discovery.k8s.io/v1/endpointslices/web-1").0,
            404
        );
        assert_eq!(
            get(&api, "/apis/networking.k8s.io/v1/endpointslices").0,
            404
        );
        assert_eq!(get(&api, "/api/v1/endpointslices").0, 404);

        api.delete_endpoint_slice("a", "web-1");
        let all = get_json(&api, "/apis/discovery.k8s.io/v1/endpointslices");
        assert_eq!(names(&all["items"]), ["b/web-2"]);
        assert_eq!(all["metadata"]["resourceVersion"], "4");
    }

    #[test]
    fn apiserver_watches_endpoint_slices() {
        let api = Arc::new(local());
        slice(&api, "a", "web-1", "10.0.0.1");
        api.set_bookmark_interval(Duration::from_millis(200));
        // A watch from rv 1, open for a second, while a slice is added in
        // another namespace, a Node changes, a slice of "a" is deleted.
        let w = {
            let api = Arc::clone(&api);
            thread::spawn(move || {
                get(
                    &api,
                    "/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion=1\
                     &allowWatchBookmarks=true&timeoutSeconds=1",
                )
            })
        };
        let ns_a = {
            let api = Arc::clone(&api);
            thread::spawn(move || {
                get(
                    &api,
                    "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices?watch=true\
                     &timeoutSeconds=1",
                )
            })
        };
        // Both watches have asked (and had time to start) before the changes.
        let asked = Instant::now();
        while api.requests().len() < 2 {
            assert!(
                asked.elapsed() < Duration::from_secs(5),
                "{:?}",
                api.requests()
            );
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(Duration::from_millis(200));
        slice(&api, "b", "web-2", "10.0.0.2");
        api.set_node("n1", &[], &[]);
        api.delete_endpoint_slice("a", "web-1");
        let (code, body) = w.join().unwrap();
        assert_eq!(code, 200);
        let ev = events(&body);
        let changes: Vec<String> = ev
            .iter()
            .filter(|e| e["type"] != "BOOKMARK")
            .map(|e| {
                format!(
                    "{} {}",
                    e["type"].as_str().unwrap(),
                    e["object"]["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(changes, ["ADDED web-2", "DELETED web-1"], "{body}");
        let bookmark = ev.iter().find(|e| e["type"] == "BOOKMARK").unwrap();
        assert_eq!(bookmark["object"]["kind"], "EndpointSlice");
        assert_eq!(bookmark["object"]["apiVersion"], "discovery.k8s.io/v1");
        // The watch of namespace "a" without a resource version: the
        // synthetic ADDED of web-1, then its deletion; nothing of "b".
        let (code, body) = ns_a.join().unwrap();
        assert_eq!(code, 200);
        let ev: Vec<(String, String)> = events(&body)
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_string(),
                    e["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        assert_eq!(
            ev,
            [
                ("ADDED".into(), "web-1".into()),
                ("DELETED".into(), "web-1".into())
            ],
            "{body}"
        );

        // After the history is forgotten, a watch from an old version is
        // told 410 inside a 200, as kube-apiserver does.
        api.expire();
        let (code, body) = get(
            &api,
            "/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion=2&timeoutSeconds=1",
        );
        assert_eq!(code, 200);
        let ev = events(&body);
        assert_eq!(ev.len(), 1, "{body}");
        assert_eq!(ev[0]["type"], "ERROR");
        assert_eq!(ev[0]["object"]["code"], 410);
        assert_eq!(api.expired_watches(), 1);
    }

    #[test]
    fn apiserver_discovery_lists_pods_namespaces_and_network_policies() {
        let api = local();
        let core = get_json(&api, "/api/v1");
        assert_eq!(core["groupVersion"], "v1");
        assert_eq!(
            resource_names(&core),
            ["nodes", "services", "pods", "namespaces"]
        );
        let find = |list: &Value, name: &str| {
            list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .unwrap()
                .clone()
        };
        assert_eq!(
            find(&core, "pods"),
            json!({
                "name": "pods",
                "singularName": "pod",
                "namespaced": true,
                "kind": "Pod",
                "verbs": ["get", "list", "watch"],
                "shortNames": ["po"],
            })
        );
        let ns = find(&core, "namespaces");
        assert_eq!(ns["namespaced"], false);
        assert_eq!(ns["kind"], "Namespace");
        let net = get_json(&api, "/apis/networking.k8s.io/v1");
        let np = find(&net, "networkpolicies");
        assert_eq!(np["namespaced"], true);
        assert_eq!(np["kind"], "NetworkPolicy");
        assert_eq!(np["singularName"], "networkpolicy");
    }

    #[test]
    fn apiserver_lists_and_gets_namespaces_pods_and_network_policies() {
        let api = local();
        api.set_namespace("a", &[("team", "x")]);
        api.set_namespace("b", &[]);
        let ports = json!([
            [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
            [],
        ]);
        api.set_pod(
            "a",
            "web",
            "n1",
            &[("app", "web")],
            &["10.0.1.5", "fd00::5"],
            &ports,
        );
        api.set_pod("b", "db", "n2", &[], &["10.0.2.7"], &json!([]));
        api.set_network_policy(
            "a",
            "deny",
            &json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        );

        // `/api/v1/namespaces` is the Namespaces, not a namespace's objects.
        let all = get_json(&api, "/api/v1/namespaces");
        assert_eq!(all["kind"], "NamespaceList");
        assert_eq!(all["apiVersion"], "v1");
        assert_eq!(plain_names(&all), ["a", "b"]);
        assert_eq!(all["metadata"]["resourceVersion"], "5");
        let a = get_json(&api, "/api/v1/namespaces/a");
        assert_eq!(a["kind"], "Namespace");
        assert_eq!(a["metadata"]["labels"]["team"], "x");
        assert_eq!(a["metadata"]["labels"]["kubernetes.io/metadata.name"], "a");
        assert!(a["metadata"]["namespace"].is_null());
        assert_eq!(a["status"]["phase"], "Active");
        let (code, body) = get(&api, "/api/v1/namespaces/zz");
        assert_eq!(code, 404);
        assert!(body.contains(r#"namespaces \"zz\" not found"#), "{body}");
        // Namespaces are not inside a namespace.
        assert_eq!(get(&api, "/api/v1/namespaces/a/namespaces").0, 404);
        assert_eq!(get(&api, "/api/v1/namespaces/a/namespaces/a").0, 404);

        // Pods: of every namespace, of one, one.
        let pods = get_json(&api, "/api/v1/pods");
        assert_eq!(pods["kind"], "PodList");
        assert_eq!(names(&pods["items"]), ["a/web", "b/db"]);
        let in_a = get_json(&api, "/api/v1/namespaces/a/pods");
        assert_eq!(names(&in_a["items"]), ["a/web"]);
        assert_eq!(
            names(&get_json(&api, "/api/v1/namespaces/zz/pods")["items"]),
            Vec::<String>::new()
        );
        let web = get_json(&api, "/api/v1/namespaces/a/pods/web");
        assert_eq!(web["kind"], "Pod");
        assert_eq!(web["apiVersion"], "v1");
        assert_eq!(web["metadata"]["uid"], "uid-pods-a-web");
        assert_eq!(web["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(web["spec"]["nodeName"], "n1");
        let c = web["spec"]["containers"].as_array().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["name"], "c0");
        assert!(c[0]["image"].is_string());
        assert_eq!(c[0]["ports"][0]["containerPort"], 80);
        assert!(c[1]["ports"].is_null());
        assert_eq!(web["status"]["phase"], "Running");
        assert_eq!(web["status"]["podIP"], "10.0.1.5");
        assert_eq!(
            web["status"]["podIPs"],
            json!([{"ip": "10.0.1.5"}, {"ip": "fd00::5"}])
        );
        let db = get_json(&api, "/api/v1/namespaces/b/pods/db");
        assert_eq!(db["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(get(&api, "/api/v1/namespaces/b/pods/web").0, 404);
        assert_eq!(get(&api, "/api/v1/pods/web").0, 404);

        // NetworkPolicies.
        let pols = get_json(&api, "/apis/networking.k8s.io/v1/networkpolicies");
        assert_eq!(pols["kind"], "NetworkPolicyList");
        assert_eq!(pols["apiVersion"], "networking.k8s.io/v1");
        assert_eq!(names(&pols["items"]), ["a/deny"]);
        let deny = get_json(
            &api,
            "/apis/networking.k8s.io/v1/namespaces/a/networkpolicies/deny",
        );
        assert_eq!(deny["kind"], "NetworkPolicy");
        assert_eq!(deny["spec"]["policyTypes"], json!(["Ingress"]));
        assert_eq!(
            plain_names(&get_json(
                &api,
                "/apis/networking.k8s.io/v1/namespaces/b/networkpolicies"
            )),
            Vec::<String>::new()
        );
        assert_eq!(get(&api, "/api/v1/networkpolicies").0, 404);
        assert_eq!(get(&api, "/apis/networking.k8s.io/v1/pods").0, 404);
        // Off with ServiceCIDRs or not, NetworkPolicies stay.
        api.set_service_cidr_api(false);
        assert_eq!(
            get(&api, "/apis/networking.k8s.io/v1/networkpolicies").0,
            200
        );

        api.delete_pod("a", "web");
        api.delete_network_policy("a", "deny");
        api.delete_namespace("b");
        assert_eq!(names(&get_json(&api, "/api/v1/pods")["items"]), ["b/db"]);
        assert_eq!(plain_names(&get_json(&api, "/api/v1/namespaces")), ["a"]);
        assert_eq!(
            plain_names(&get_json(
                &api,
                "/apis/networking.k8s.io/v1/networkpolicies"
            )),
            Vec::<String>::new()
        );
    }

    #[test]
    fn apiserver_selects_pods_by_node() {
        let api = local();
        api.set_pod("a", "p1", "n1", &[], &["10.0.1.1"], &json!([]));
        api.set_pod("a", "p2", "n2", &[], &["10.0.2.1"], &json!([]));
        api.set_pod("b", "p3", "n1", &[], &["10.0.1.2"], &json!([]));
        api.set_pod("b", "pending", "", &[], &[], &json!([]));

        // As kube-rs sends it: the selector percent-encoded.
        let on_n1 = get_json(&api, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
        assert_eq!(names(&on_n1["items"]), ["a/p1", "b/p3"]);
        let on_n1 = get_json(&api, "/api/v1/pods?fieldSelector=spec.nodeName==n1");
        assert_eq!(names(&on_n1["items"]), ["a/p1", "b/p3"]);
        let b_on_n1 = get_json(
            &api,
            "/api/v1/namespaces/b/pods?fieldSelector=spec.nodeName%3Dn1",
        );
        assert_eq!(names(&b_on_n1["items"]), ["b/p3"]);
        let unscheduled = get_json(&api, "/api/v1/pods?fieldSelector=spec.nodeName%3D");
        assert_eq!(names(&unscheduled["items"]), ["b/pending"]);
        let pending = get_json(&api, "/api/v1/namespaces/b/pods/pending");
        assert_eq!(pending["status"]["phase"], "Pending");
        assert!(pending["spec"]["nodeName"].is_null());
        assert!(pending["status"]["podIP"].is_null());
        let elsewhere = get_json(
            &api,
            "/api/v1/pods?fieldSelector=spec.nodeName%21%3Dn1%2Cmetadata.namespace%3Da",
        );
        assert_eq!(names(&elsewhere["items"]), ["a/p2"]);
        // Pages hold what matches.
        api.set_max_page(Some(1));
        let first = get_json(
            &api,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=5",
        );
        assert_eq!(names(&first["items"]), ["a/p1"]);
        assert_eq!(first["metadata"]["remainingItemCount"], 1);
        let token = first["metadata"]["continue"].as_str().unwrap();
        let next = get_json(
            &api,
            &format!("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=5&continue={token}"),
        );
        assert_eq!(names(&next["items"]), ["b/p3"]);
        // A term without an operator.
        let (code, body) = get(&api, "/api/v1/pods?fieldSelector=spec.nodeName");
        assert_eq!(code, 400, "{body}");
    }

    #[test]
    fn apiserver_watches_pods_namespaces_and_network_policies() {
        let api = Arc::new(local());
        api.set_namespace("a", &[]);
        api.set_pod("a", "p1", "n1", &[], &["10.0.1.1"], &json!([]));
        api.set_pod("a", "p2", "", &[], &[], &json!([]));
        api.set_network_policy("a", "old", &json!({"podSelector": {}}));
        // rv 4. Each watch from rv 4 but the node's, which starts without
        // one (the synthetic ADDED of what is on n1 first).
        let bodies = watching(
            &api,
            &[
                "/api/v1/pods?watch=true&resourceVersion=4",
                "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn1",
                "/api/v1/namespaces?watch=true&resourceVersion=4",
                "/api/v1/namespaces/a/pods?watch=true&resourceVersion=4",
                "/apis/networking.k8s.io/v1/namespaces/a/networkpolicies?watch=true&resourceVersion=4",
                "/apis/networking.k8s.io/v1/networkpolicies?watch=true&resourceVersion=4",
            ],
            || {
                // p2 is scheduled to n1, p1 changes, p3 comes on n2.
                api.set_pod("a", "p2", "n1", &[], &["10.0.1.2"], &json!([]));
                api.set_pod("a", "p1", "n1", &[("v", "2")], &["10.0.1.1"], &json!([]));
                api.set_pod("b", "p3", "n2", &[], &["10.0.2.3"], &json!([]));
                api.set_namespace("b", &[("env", "prod")]);
                api.set_network_policy("b", "web", &json!({"podSelector": {}}));
                api.delete_network_policy("a", "old");
                // p1 leaves n1 (as no real pod does; what the watch cache
                // sends when an object stops matching), p2 is deleted.
                api.set_pod("a", "p1", "n2", &[], &["10.0.2.1"], &json!([]));
                api.delete_pod("a", "p2");
                api.delete_namespace("a");
            },
        );
        assert_eq!(
            changes(&bodies[0]),
            [
                "MODIFIED p2",
                "MODIFIED p1",
                "ADDED p3",
                "MODIFIED p1",
                "DELETED p2"
            ],
            "{}",
            bodies[0]
        );
        assert_eq!(
            changes(&bodies[1]),
            [
                "ADDED p1",
                "ADDED p2",
                "MODIFIED p1",
                "DELETED p1",
                "DELETED p2"
            ],
            "{}",
            bodies[1]
        );
        // p1's DELETED on leaving the node: its last state on n1, at the
        // change's resource version.
        let left = &events(&bodies[1])[3];
        assert_eq!(left["object"]["spec"]["nodeName"], "n1");
        assert_eq!(left["object"]["metadata"]["resourceVersion"], "11");
        assert_eq!(
            changes(&bodies[2]),
            ["ADDED b", "DELETED a"],
            "{}",
            bodies[2]
        );
        assert_eq!(events(&bodies[2])[0]["object"]["kind"], "Namespace");
        assert_eq!(
            changes(&bodies[3]),
            ["MODIFIED p2", "MODIFIED p1", "MODIFIED p1", "DELETED p2"],
            "{}",
            bodies[3]
        );
        assert_eq!(changes(&bodies[4]), ["DELETED old"], "{}", bodies[4]);
        assert_eq!(
            changes(&bodies[5]),
            ["ADDED web", "DELETED old"],
            "{}",
            bodies[5]
        );
        assert_eq!(events(&bodies[5])[0]["object"]["kind"], "NetworkPolicy");
    }
}
