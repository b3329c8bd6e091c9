//! A run's last task handed across workers: each node of a chain is placed on the other group,
//! so the worker that completes it queues its one successor, which carries the node's in-flight
//! unit, on the other group's injector and returns, while the other worker may run that task,
//! finish the run and free it. Under Miri this checks that no frame on the way back still holds
//! the run as a reference argument (`RunRef`, see `run.rs`):
//!
//! ```sh
//! MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-tree-borrows -Zmiri-ignore-leaks" \
//!   cargo +nightly miri test -p boundpool-scheduler --test handoff
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundpool_scheduler::backend::FromIndex;
use boundpool_scheduler::{Cores, GraphBuilder, GroupId, GroupSpec, PoolBuilder};

const LINKS: usize = if cfg!(miri) { 4 } else { 16 };
const RUNS: usize = if cfg!(miri) { 6 } else { 500 };

#[test]
fn last_task_handed_to_the_other_group() {
    let pool = PoolBuilder::new()
        .name("handoff")
        .groups(vec![
            GroupSpec::new("left", 1).cores(Cores::Unpinned),
            GroupSpec::new("right", 1).cores(Cores::Unpinned),
        ])
        .build()
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::<()>::new("ping-pong");
    let mut prev = None;
    let mut last = None;
    for i in 0..LINKS {
        let ran = ran.clone();
        let n = g.node(format!("link{i}"), move |_| {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(i)
        });
        g.place(n, GroupId::from_index(i % 2));
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
        last = Some(n);
    }
    let graph = g.build().unwrap();
    for _ in 0..RUNS {
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.get(last.unwrap()), Some(&(LINKS - 1)));
    }
    assert_eq!(ran.load(Ordering::Relaxed), LINKS * RUNS);
}
