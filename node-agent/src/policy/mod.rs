//! NetworkPolicy in the datapath: the compiler ([`compile`], with
//! [`selector`] and [`ports`]) and the agent's watches and map writes
//! ([`run`]).
pub(crate) mod compile;
mod ports;
mod run;
mod selector;

pub(crate) use run::{run, stop, Options};
