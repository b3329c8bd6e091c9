//! Machines without the scheduler's and the communication thread's own costs, for makespans
//! computed by hand.
#![allow(dead_code, unreachable_pub)]

use boundpool_sim::{CostModel, KindCost, Machine};

/// `ranks` ranks of `workers` host workers on one host with a core each; no scheduling or
/// communication-thread costs; the link: `latency` seconds, `gb_s` GB/s, a port at each end.
pub fn ideal(ranks: usize, workers: usize, latency: f64, gb_s: f64) -> Machine {
    let mut m = Machine::dev_host(ranks, workers);
    // A core for every worker and communication thread: nobody shares one.
    m.cores_per_host = ranks * (workers + 1);
    let s = &mut m.sched;
    (s.node_s, s.steal_s, s.wake_s, s.poll_s, s.deferred_park_s) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let c = &mut m.comm;
    (c.node_s, c.send_s, c.recv_s, c.idle_poll_s) = (0.0, 0.0, 0.0, 0.0);
    m.links.shm.latency_s = latency;
    m.links.shm.bandwidth_gb_s = gb_s;
    // The link's ports carry the bytes (not the communication threads' copies).
    m.links.shm.cpu_copy = false;
    m
}

/// Host kinds of fixed costs.
pub fn costs(kinds: &[(&str, f64)]) -> CostModel {
    let mut m = CostModel::default();
    for &(k, s) in kinds {
        m.set(k, KindCost::host(s));
    }
    m
}
