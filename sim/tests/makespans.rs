//! Makespans computed by hand: a chain, a fork-join with a stolen branch, two ranks and one
//! link, and the scheduler's and the communication thread's costs where they add.

mod common;

use boundpool_sim::{simulate, NodeSpec, SimGraph, SimOptions};
use common::{costs, ideal};

const MS: f64 = 1e-3;
const US: f64 = 1e-6;

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-12, "{a} != {b}");
}

#[test]
fn a_chain_adds_up() {
    let mut g = SimGraph::new("chain");
    let mut prev = None;
    for k in ["one", "two", "three"] {
        let x = g.node(k, 0, NodeSpec::host(k));
        if let Some(p) = prev {
            g.edge(p, x);
        }
        prev = Some(x);
    }
    let c = costs(&[("one", MS), ("two", 2.0 * MS), ("three", 3.0 * MS)]);
    let m = ideal(1, 2, 0.0, 1.0);
    let r = simulate(&g, &m, &c, &SimOptions::default()).unwrap();
    close(r.makespan_s, 6.0 * MS);
    // Each node runs on at once on the worker that finished its predecessor.
    assert_eq!(r.workers.iter().filter(|w| w.fraction > 0.0).count(), 1);
    // With 0.1 ms of scheduling per node and 20 us to wake the first worker.
    let mut m = m;
    m.sched.node_s = 0.1 * MS;
    m.sched.wake_s = 20.0 * US;
    let r = simulate(&g, &m, &c, &SimOptions::default()).unwrap();
    close(r.makespan_s, 6.3 * MS + 20.0 * US);
    // The critical path is the chain.
    let parts: f64 = r.path_parts.iter().map(|p| p.1).sum();
    close(parts, r.makespan_s);
    assert_eq!(r.critical_path.len(), 3);
}

/// a -> {b, c, d} -> e on two workers. a runs on worker 0; b is its continuation; c and d
/// go to its deque; worker 1, woken after `wake`, steals the oldest (c); worker 0 pops d
/// after b; e runs on whichever worker finishes its last predecessor.
fn fork_join(d: f64, wake: f64) -> f64 {
    let mut g = SimGraph::new("fork-join");
    let names = ["a", "b", "c", "d", "e"];
    let ids: Vec<u32> = names
        .iter()
        .map(|&k| g.node(k, 0, NodeSpec::host(k)))
        .collect();
    for &mid in &ids[1..4] {
        g.edge(ids[0], mid);
        g.edge(mid, ids[4]);
    }
    let c = costs(&[
        ("a", MS),
        ("b", 2.0 * MS),
        ("c", 3.0 * MS),
        ("d", d),
        ("e", MS),
    ]);
    let mut m = ideal(1, 2, 0.0, 1.0);
    m.sched.wake_s = wake;
    m.sched.spin_s = 0.0;
    simulate(&g, &m, &c, &SimOptions::default())
        .unwrap()
        .makespan_s
}

#[test]
fn a_fork_join_with_a_stolen_branch() {
    // Worker 0: a [0, 1], b [1, 3], d [3, 7], e [7, 8]; worker 1: c [1, 4].
    close(fork_join(4.0 * MS, 0.0), 8.0 * MS);
    // The first wake costs 0.5 ms (worker 1 parked from the start): worker 0 runs a from
    // 0.5; worker 1, woken at 1.5, runs c [1.5, 4.5]; worker 0: b [1.5, 3.5], d [3.5, 7.5],
    // e [7.5, 8.5].
    close(fork_join(4.0 * MS, 0.5 * MS), 8.5 * MS);
    // d short: worker 0: a [0.5, 1.5], b [1.5, 3.5], d [3.5, 4.5]; worker 1: c [2, 5]; e
    // runs on worker 1 at once: [5, 6].
    close(fork_join(MS, 0.5 * MS), 6.0 * MS);
}

#[test]
fn two_ranks_and_one_link() {
    // a on rank 0 (1 ms, 1 MB out) -> b on rank 1 (1 ms); the link: 10 us, 1 GB/s.
    let mut g = SimGraph::new("two ranks");
    let a = g.node("a", 0, NodeSpec::host("a").bytes(1_000_000));
    let b = g.node("b", 1, NodeSpec::host("b"));
    g.edge(a, b);
    let c = costs(&[("a", MS), ("b", MS)]);
    let m = ideal(2, 1, 10.0 * US, 1.0);
    let r = simulate(&g, &m, &c, &SimOptions::default()).unwrap();
    // a ends at 1 ms; 1 MB takes 1 ms on the port, arrives 10 us later; b runs 1 ms; every
    // rank's status takes one more latency.
    close(r.makespan_s, 3.0 * MS + 20.0 * US);
    assert_eq!((r.transfers, r.bytes_moved), (1, 1e6));
    // The communication threads' costs and the send and receive nodes' bodies add up on
    // the path: send body 2 us, send 5 us, receive 5 us. The transfer on the path runs
    // from the send node's end to the value received: 5 us + 1 ms + 10 us + 5 us.
    let mut m = m;
    m.comm.node_s = 2.0 * US;
    m.comm.send_s = 5.0 * US;
    m.comm.recv_s = 5.0 * US;
    let r = simulate(&g, &m, &c, &SimOptions::default()).unwrap();
    close(r.makespan_s, 3.0 * MS + 32.0 * US);
    let transfer: f64 = r
        .path_parts
        .iter()
        .filter(|p| p.0 == "transfer")
        .map(|p| p.1)
        .sum();
    close(transfer, MS + 20.0 * US);
    // The same bytes copied by the communication threads, half on each side: the same time.
    m.links.shm.cpu_copy = true;
    let r = simulate(&g, &m, &c, &SimOptions::default()).unwrap();
    close(r.makespan_s, 3.0 * MS + 32.0 * US);
    assert!(r.links.is_empty());
    let busy: f64 = r.comm.iter().map(|c| c.fraction).sum::<f64>() * r.makespan_s;
    close(busy, MS + 10.0 * US);
}

#[test]
fn a_value_goes_once_to_each_rank() {
    // a on rank 0 read by two nodes of rank 1: one transfer; the port is busy 1 ms.
    let mut g = SimGraph::new("once");
    let a = g.node("a", 0, NodeSpec::host("a").bytes(1_000_000));
    for k in ["b1", "b2"] {
        let b = g.node(k, 1, NodeSpec::host("b"));
        g.edge(a, b);
    }
    let c = costs(&[("a", MS), ("b", MS)]);
    let r = simulate(&g, &ideal(2, 2, 0.0, 1.0), &c, &SimOptions::default()).unwrap();
    assert_eq!(r.transfers, 1);
    close(r.makespan_s, 3.0 * MS);
    let out = r.links.iter().find(|l| l.name.contains("out")).unwrap();
    close(out.fraction, 1.0 / 3.0);
}
