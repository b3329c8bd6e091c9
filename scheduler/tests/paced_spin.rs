//! The paced spin (`PoolBuilder::paced_spin`): work that comes back at a steady pace finds a
//! worker still watching, instead of one parked after the idle spin, and a pool with the paced
//! spin off parks in every pause. Parks are counted, not timed: the pauses (2 ms) are a
//! hundred idle spins long and a hundredth of the paced spin's limit.

#[allow(dead_code)] // each test binary uses a subset of the helpers
mod common;

use std::time::Duration;

use boundpool_scheduler::GraphBuilder;
use common::{pool_builder, with_deadline};

const PAUSES: u64 = 30;

/// Parks of a one-worker pool over `PAUSES` requests 2 ms apart, after ten to set its pace.
fn parks_over_steady_requests(paced: Duration) -> u64 {
    let pool = pool_builder("paced", 1)
        .idle_spin(Duration::from_micros(20))
        .paced_spin(paced)
        .build()
        .expect("build pool");
    let mut g = GraphBuilder::<()>::new("request");
    g.node("n", |_| Ok(()));
    let graph = g.build().expect("build graph");
    let request = |n: u64| {
        for _ in 0..n {
            pool.run(&graph).expect("run");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    request(10);
    let before = pool.stats().parks();
    request(PAUSES);
    let parks = pool.stats().parks() - before;
    eprintln!("paced spin {paced:?}: {parks} parks");
    parks
}

#[test]
fn a_worker_watches_through_pauses_at_its_pace() {
    let parks = with_deadline(60, "paced", || {
        parks_over_steady_requests(Duration::from_millis(200))
    });
    // A pause the machine stretched past one and a half of the pace parks once; then the
    // pace grows to cover it.
    assert!(
        parks <= PAUSES / 3,
        "{parks} parks over {PAUSES} pauses at a steady pace"
    );
}

#[test]
fn without_the_paced_spin_every_pause_parks() {
    let parks = with_deadline(60, "unpaced", || parks_over_steady_requests(Duration::ZERO));
    assert!(
        parks >= PAUSES,
        "{parks} parks over {PAUSES} pauses of a hundred idle spins"
    );
}
