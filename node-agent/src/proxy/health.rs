//! The health check node ports of load balancers with
//! `externalTrafficPolicy: Local`, answered as kube-proxy's health check
//! server answers them (`pkg/proxy/healthcheck`): any HTTP request gets 200
//! while the node has a ready endpoint of the Service, 503 while it has none,
//! with kube-proxy's JSON body and its `X-Load-Balancing-Endpoint-Weight`
//! header, so a cloud load balancer sends only to nodes that can serve
//! locally (packets to a node without one are dropped, see the datapath's
//! `lb/uplink.rs`).
//!
//! One listener per port on every address of the node (as kube-proxy binds
//! without `nodePortAddresses`); a port that goes closes its listener.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::desired::HealthCheck;

/// How long a client gets to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a request read (the answer does not depend on it).
const MAX_REQUEST: usize = 4096;

type Table = Arc<Mutex<BTreeMap<u16, HealthCheck>>>;

/// The listeners, and what each port answers now.
#[derive(Default)]
pub(crate) struct HealthServers {
    listeners: BTreeMap<u16, JoinHandle<()>>,
    table: Table,
}

impl HealthServers {
    /// Answers exactly the ports of `want` from now on; returns what to log
    /// (ports opened, closed, or that could not be bound).
    pub(crate) fn update(&mut self, want: &BTreeMap<u16, HealthCheck>) -> Vec<String> {
        if let Ok(mut t) = self.table.lock() {
            t.clone_from(want);
        }
        let mut said = Vec::new();
        self.listeners.retain(|port, task| {
            if want.contains_key(port) && !task.is_finished() {
                return true;
            }
            task.abort();
            said.push(format!("proxy: health check node port {port} closed"));
            false
        });
        for (port, hc) in want {
            if self.listeners.contains_key(port) {
                continue;
            }
            match bind(*port) {
                Ok(l) => {
                    said.push(format!(
                        "proxy: health check node port {port} open for Service {}/{}",
                        hc.namespace, hc.name
                    ));
                    self.listeners
                        .insert(*port, tokio::spawn(serve(l, *port, self.table.clone())));
                }
                Err(e) => said.push(format!(
                    "proxy: health check node port {port} of Service {}/{}: cannot listen: {e}",
                    hc.namespace, hc.name
                )),
            }
        }
        said
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        for t in self.listeners.values() {
            t.abort();
        }
    }
}

/// A listener on every address: IPv6's wildcard (which takes IPv4 too), or
/// IPv4's where the node has no IPv6.
fn bind(port: u16) -> std::io::Result<TcpListener> {
    let six = std::net::TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)));
    let l = match six {
        Ok(l) => l,
        Err(_) => std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?,
    };
    l.set_nonblocking(true)?;
    TcpListener::from_std(l)
}

async fn serve(l: TcpListener, port: u16, table: Table) {
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let table = table.clone();
        tokio::spawn(async move {
            let hc = table.lock().ok().and_then(|t| t.get(&port).cloned());
            let _ = answer(s, hc.as_ref()).await;
        });
    }
}

/// Reads the request's head (bounded in size and time), then answers.
async fn answer(mut s: TcpStream, hc: Option<&HealthCheck>) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut got = 0;
    let read = async {
        while got < buf.len() {
            let n = s.read(&mut buf[got..]).await?;
            if n == 0 {
                break;
            }
            got += n;
            if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    if tokio::time::timeout(READ_TIMEOUT, read).await.is_err() {
        return Ok(());
    }
    s.write_all(&response(hc)).await?;
    s.shutdown().await
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    service: Name<'a>,
    local_endpoints: usize,
    service_proxy_healthy: bool,
}

#[derive(Serialize)]
struct Name<'a> {
    namespace: &'a str,
    name: &'a str,
}

/// The HTTP response for a port answering for `hc` (kube-proxy's: JSON
/// indented with tabs, 200 with a local endpoint, 503 without).
pub(crate) fn response(hc: Option<&HealthCheck>) -> Vec<u8> {
    let (ns, name, n) = hc.map_or(("", "", 0), |h| {
        (h.namespace.as_str(), h.name.as_str(), h.local_endpoints)
    });
    let body = Body {
        service: Name {
            namespace: ns,
            name,
        },
        local_endpoints: n,
        service_proxy_healthy: true,
    };
    let mut json = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut json,
        serde_json::ser::PrettyFormatter::with_indent(b"\t"),
    );
    // Serializing plain strings and numbers cannot fail.
    let _ = body.serialize(&mut ser);
    let status = if n > 0 {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {n}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        json.len()
    )
    .into_bytes();
    out.extend_from_slice(&json);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hc(n: usize) -> HealthCheck {
        HealthCheck {
            namespace: "default".into(),
            name: "wp-nginx-service".into(),
            local_endpoints: n,
        }
    }

    fn split(r: &[u8]) -> (String, String) {
        let s = String::from_utf8(r.to_vec()).unwrap();
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    #[test]
    fn a_node_with_a_local_endpoint_answers_200_with_kube_proxys_body() {
        let (head, body) = split(&response(Some(&hc(1))));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("X-Load-Balancing-Endpoint-Weight: 1"),
            "{head}"
        );
        assert!(head.contains("Content-Type: application/json"), "{head}");
        // kube-proxy's body for this Service is 127 bytes (Content-Length
        // of its answer), indented with tabs.
        assert_eq!(body.len(), 127, "{body}");
        assert!(head.contains("Content-Length: 127"), "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"service": {"namespace": "default", "name": "wp-nginx-service"},
                               "localEndpoints": 1, "serviceProxyHealthy": true})
        );
        assert!(
            body.contains("\n\t\"service\": {\n\t\t\"namespace\""),
            "{body}"
        );
    }

    #[test]
    fn a_node_without_one_answers_503() {
        let (head, body) = split(&response(Some(&hc(0))));
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(body.contains("\"localEndpoints\": 0"), "{body}");
    }
}
