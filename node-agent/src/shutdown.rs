//! One shutdown signal for every job of the agent: the first SIGTERM or
//! SIGINT. Each job (routes, Services, the NAT sweep, node addresses) holds a
//! clone and ends its loop when it fires; the leases a job holds go back when
//! their holder is dropped (`Sweeper`, `node_addrs::Keeper`), on this path,
//! on an error's early return and on a panic alike.
use futures::{
    future::{BoxFuture, Shared},
    FutureExt,
};
use tokio::signal::unix::{signal, SignalKind};

use crate::error::{Error, Result};

/// Resolves once the process is asked to stop; clone it into every job.
pub(crate) type Shutdown = Shared<BoxFuture<'static, ()>>;

/// Listens for SIGTERM and SIGINT (inside the runtime) and gives the future
/// that resolves at the first of them.
pub(crate) fn on_signals() -> Result<Shutdown> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| Error::io("SIGTERM handler", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::io("SIGINT handler", e))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    .boxed()
    .shared())
}
