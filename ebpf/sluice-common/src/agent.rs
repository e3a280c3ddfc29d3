//! `sl_agent`: what the node agent (`sluice-node`) tells the datapath and the
//! plugin. Each duty the agent takes from them is a lease, a
//! `CLOCK_MONOTONIC` time in ns until which the agent does it, renewed well
//! before it ends: a stopped agent writes 0, and a killed or stuck one's lease
//! runs out, so the work falls back to where it was done before.

/// Slots of `sl_agent` (all written by the agent only).
pub mod agent_slot {
    /// Until when the agent sweeps the NAT flow tables and the in-kernel
    /// sweeper leaves them alone (renewed every pass [`SWEEP_LEASE_NS`] ahead).
    pub const SWEEP_UNTIL_NS: u32 = 0;
    /// Flows the agent has removed as idle, since the map was made (the
    /// datapath's own count is the `nat_expired` counter).
    pub const SWEEP_EXPIRED: u32 = 1;
    /// Until when the agent keeps `sl_node_addrs` and `sl_node_addrs6` in step
    /// with the node's addresses (it follows the kernel's address events), so
    /// an ADD with hostPorts need not read them itself (renewed
    /// [`NODE_ADDRS_LEASE_NS`] ahead).
    pub const NODE_ADDRS_UNTIL_NS: u32 = 2;
    /// Slots in the array (one spare).
    pub const MAX: u32 = 4;
    /// How far ahead the sweep lease reaches: a stopped or stuck agent gives
    /// the tables back to the in-kernel sweeper within this time.
    pub const SWEEP_LEASE_NS: u64 = 3_000_000_000;
    /// How far ahead the node address lease reaches.
    pub const NODE_ADDRS_LEASE_NS: u64 = 3_000_000_000;
}
