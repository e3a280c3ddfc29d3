//! Real traffic between pods without external tools: a TCP echo whose ends run
//! on fresh threads that enter the pods' namespaces (`setns` changes only the
//! calling thread). Bounded: a fixed byte count and a timeout on every socket
//! operation.
use std::{
    fs::File,
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use nix::sched::{setns, CloneFlags};

use crate::{err, node::Pod, Result};

/// Timeout of every connect, accept, read and write.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Moves the calling thread into the network namespace at `path`. Only for
/// threads the harness spawns and throws away.
pub fn enter_netns(path: &Path) -> Result<()> {
    let f = File::open(path).map_err(|e| err!("opening {}: {e}", path.display()))?;
    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| err!("setns into {}: {e}", path.display()))?;
    Ok(())
}

/// Deterministic payload: byte `i` is `i * 7 mod 251`.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7) % 251) as u8).collect()
}

fn timeouts(s: &TcpStream) -> Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(())
}

/// Echoes `bytes` bytes back on the first connection to `listener`.
fn serve_echo(listener: &TcpListener, bytes: usize) -> Result<usize> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let (mut s, _) = loop {
        match listener.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(err!("no connection within {IO_TIMEOUT:?}"));
                }
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    };
    s.set_nonblocking(false)?;
    timeouts(&s)?;
    let mut buf = vec![0u8; 16 << 10];
    let mut done = 0;
    while done < bytes {
        let want = buf.len().min(bytes - done);
        let n = s
            .read(&mut buf[..want])
            .map_err(|e| err!("server read after {done} bytes: {e}"))?;
        if n == 0 {
            return Err(err!("client closed after {done} of {bytes} bytes"));
        }
        s.write_all(&buf[..n])
            .map_err(|e| err!("server write after {done} bytes: {e}"))?;
        done += n;
    }
    Ok(done)
}

/// Sends `bytes` bytes from `client` to a TCP echo server in `server` listening
/// on `server_ip`, and checks that the same bytes come back. Returns the
/// client's local address (the address the server saw).
pub fn tcp_echo(server: &Pod, server_ip: IpAddr, client: &Pod, bytes: usize) -> Result<SocketAddr> {
    tcp_echo_via(
        &server.path,
        SocketAddr::new(server_ip, 0),
        &client.path,
        SocketAddr::new(server_ip, 0),
        bytes,
    )
}

/// The general echo: a server in namespace `server_ns` listening on `bind`, a
/// client in `client_ns` connecting to `connect` (a translated address, e.g. a
/// hostPort, or with port 0 the port the server got). Returns the client's
/// local address.
pub fn tcp_echo_via(
    server_ns: &Path,
    bind: SocketAddr,
    client_ns: &Path,
    connect: SocketAddr,
    bytes: usize,
) -> Result<SocketAddr> {
    let (port_tx, port_rx) = mpsc::channel();
    let server_path = server_ns.to_path_buf();
    let server_thread = thread::spawn(move || -> Result<usize> {
        enter_netns(&server_path)?;
        let listener = match TcpListener::bind(bind) {
            Ok(l) => l,
            Err(e) => {
                let _ = port_tx.send(None);
                return Err(err!("binding {bind} in {}: {e}", server_path.display()));
            }
        };
        let _ = port_tx.send(Some(listener.local_addr()?.port()));
        serve_echo(&listener, bytes)
    });
    let port = port_rx
        .recv_timeout(IO_TIMEOUT)
        .map_err(|e| err!("the echo server did not start: {e}"))?;
    let client_result = match port {
        Some(port) => {
            let mut to = connect;
            if to.port() == 0 {
                // (set_port keeps an IPv6 scope id.)
                to.set_port(port);
            }
            let path = client_ns.to_path_buf();
            thread::spawn(move || {
                enter_netns(&path)?;
                echo_client(to, bytes)
            })
            .join()
            .map_err(|_| err!("the echo client panicked"))
            .and_then(|r| r)
        }
        None => Err(err!("the echo server could not bind {bind}")),
    };
    let served = server_thread
        .join()
        .map_err(|_| err!("the echo server panicked"))?;
    // With the client failed, the server's own error (no connection) says less.
    let local = client_result?;
    let served = served?;
    if served != bytes {
        return Err(err!("the server echoed {served} of {bytes} bytes"));
    }
    Ok(local)
}

fn echo_client(to: SocketAddr, bytes: usize) -> Result<SocketAddr> {
    let s =
        TcpStream::connect_timeout(&to, IO_TIMEOUT).map_err(|e| err!("connecting to {to}: {e}"))?;
    timeouts(&s)?;
    let local = s.local_addr()?;
    let data = payload(bytes);
    // Write on another thread while this one reads: the echo comes back while
    // the rest is still being sent, and neither side's buffers can fill up.
    let mut w = s.try_clone()?;
    let to_send = data.clone();
    let writer = thread::spawn(move || w.write_all(&to_send));
    let mut back = vec![0u8; bytes];
    let read = (&s).read_exact(&mut back);
    let written = writer.join().map_err(|_| err!("the writer panicked"))?;
    written.map_err(|e| err!("client write to {to}: {e}"))?;
    read.map_err(|e| err!("client read from {to}: {e}"))?;
    if back != data {
        return Err(err!("the echo from {to} differs from what was sent"));
    }
    Ok(local)
}
