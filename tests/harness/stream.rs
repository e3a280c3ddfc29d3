//! One long TCP stream between two namespaces, to run while something changes
//! under it (a datapath upgrade): a client sends fixed chunks at a steady pace
//! until told to stop, the server checks every byte of a known pattern and
//! answers with the count it received. Bounded: at most [`MAX_DURATION`] and
//! [`MAX_CHUNKS`], a timeout on every socket operation.
use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::{
    err,
    traffic::{enter_netns, IO_TIMEOUT},
    Result,
};

/// Bytes per write of the client.
pub const CHUNK: usize = 16 << 10;
/// Pause between two chunks: about 3 MiB/s, so a few seconds make a long stream
/// without filling any buffer.
pub const PACE: Duration = Duration::from_millis(5);
/// The client stops by itself after this long (tests stop it sooner with
/// `finish`; emulated old kernels, where loading the datapath alone takes
/// ~15 s, need the margin)...
pub const MAX_DURATION: Duration = Duration::from_mins(2);
/// ...or after this many chunks.
pub const MAX_CHUNKS: u64 = 24_000;

/// Byte `i` of the stream.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(13) % 253) as u8
}

/// What a finished stream did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub sent: u64,
    pub received: u64,
    pub took: Duration,
}

/// A running stream; see the module documentation.
pub struct Stream {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    started: Instant,
    server: Option<JoinHandle<Result<u64>>>,
    client: Option<JoinHandle<Result<u64>>>,
}

impl Stream {
    /// Starts a server in `server_ns` on `bind` (port 0: any) and a client in
    /// `client_ns` connecting to `connect_ip` at the server's port.
    pub fn start(
        server_ns: &Path,
        bind: SocketAddr,
        client_ns: &Path,
        connect_ip: std::net::IpAddr,
    ) -> Result<Self> {
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (port_tx, port_rx) = mpsc::channel();
        let server_path = server_ns.to_path_buf();
        let server_received = Arc::clone(&received);
        let server = thread::spawn(move || -> Result<u64> {
            enter_netns(&server_path)?;
            let listener = match TcpListener::bind(bind) {
                Ok(l) => l,
                Err(e) => {
                    let _ = port_tx.send(None);
                    return Err(err!("binding {bind}: {e}"));
                }
            };
            let _ = port_tx.send(Some(listener.local_addr()?.port()));
            serve(&listener, &server_received)
        });
        let mut stream = Self {
            received,
            stop: Arc::clone(&stop),
            started: Instant::now(),
            server: Some(server),
            client: None,
        };
        let Ok(Some(port)) = port_rx.recv_timeout(IO_TIMEOUT) else {
            stream.stop.store(true, Ordering::Relaxed);
            let why = stream
                .server
                .take()
                .map(std::thread::JoinHandle::join)
                .map_or_else(|| "no server".to_string(), |r| format!("{r:?}"));
            return Err(err!("the stream's server did not start: {why}"));
        };
        let to = SocketAddr::new(connect_ip, port);
        let client_path = client_ns.to_path_buf();
        stream.client = Some(thread::spawn(move || -> Result<u64> {
            enter_netns(&client_path)?;
            send(to, &stop)
        }));
        Ok(stream)
    }

    /// Bytes the server has received and checked so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits until the server has received at least `bytes`, at most `timeout`.
    pub fn wait_received(&self, bytes: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.received() < bytes {
            if Instant::now() > deadline {
                return Err(err!(
                    "the stream reached {} of {bytes} bytes in {timeout:?}",
                    self.received()
                ));
            }
            if self.client.as_ref().is_some_and(JoinHandle::is_finished) {
                return Err(err!(
                    "the stream's client ended after {} bytes received",
                    self.received()
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Time since the stream started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Tells the client to stop, waits for both ends and checks that the server
    /// received every byte the client sent, each one right.
    pub fn finish(mut self) -> Result<Report> {
        self.stop.store(true, Ordering::Relaxed);
        let client = self
            .client
            .take()
            .map(|h| h.join().map_err(|_| err!("the stream's client panicked")));
        let server = self
            .server
            .take()
            .map(|h| h.join().map_err(|_| err!("the stream's server panicked")));
        let took = self.started.elapsed();
        let sent = client.ok_or_else(|| err!("no client"))???;
        let received = server.ok_or_else(|| err!("no server"))???;
        if sent != received {
            return Err(err!(
                "the client sent {sent} bytes, the server received {received}"
            ));
        }
        Ok(Report {
            sent,
            received,
            took,
        })
    }
}

impl Drop for Stream {
    /// A stream dropped unfinished (a failing test) stops and is waited for, so
    /// no thread outlives the namespaces.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.client.take() {
            let _ = h.join();
        }
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

fn timeouts(s: &TcpStream) -> Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(())
}

/// Reads the stream to its end, checking the pattern, then writes the count
/// back (8 bytes, little endian).
fn serve(listener: &TcpListener, received: &AtomicU64) -> Result<u64> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let (mut s, _) = loop {
        match listener.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(err!("no connection within {IO_TIMEOUT:?}"));
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    s.set_nonblocking(false)?;
    timeouts(&s)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut total: u64 = 0;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| err!("server read after {total} bytes: {e}"))?;
        if n == 0 {
            break;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            let at = total + i as u64;
            if *b != pattern(at) {
                return Err(err!(
                    "byte {at} of the stream is {b:#04x}, expected {:#04x}",
                    pattern(at)
                ));
            }
        }
        total += n as u64;
        received.store(total, Ordering::Relaxed);
    }
    s.write_all(&total.to_le_bytes())
        .map_err(|e| err!("server answering the count {total}: {e}"))?;
    Ok(total)
}

/// Sends chunks until `stop` (or the bounds), closes its sending side and reads
/// the server's count, which must be what it sent.
fn send(to: SocketAddr, stop: &AtomicBool) -> Result<u64> {
    let mut s =
        TcpStream::connect_timeout(&to, IO_TIMEOUT).map_err(|e| err!("connecting to {to}: {e}"))?;
    timeouts(&s)?;
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut chunks = 0;
    let mut chunk = vec![0u8; CHUNK];
    while !stop.load(Ordering::Relaxed) && chunks < MAX_CHUNKS && started.elapsed() < MAX_DURATION {
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = pattern(sent + i as u64);
        }
        s.write_all(&chunk)
            .map_err(|e| err!("client write after {sent} bytes: {e}"))?;
        sent += CHUNK as u64;
        chunks += 1;
        thread::sleep(PACE);
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| err!("client shutdown after {sent} bytes: {e}"))?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count)
        .map_err(|e| err!("client reading the server's count after {sent} bytes: {e}"))?;
    let count = u64::from_le_bytes(count);
    if count != sent {
        return Err(err!("the server counted {count} of {sent} bytes"));
    }
    Ok(sent)
}
