//! `Pool::free_cores`, `Pool::keep_off_workers` and `Pool::reserve_core`: a thread outside the
//! pool kept off the cores its workers are pinned to, the threads it starts after inheriting
//! that, a core reserved for one thread and left out of the rest's, and a clear error where no
//! core is left.

#![cfg(target_os = "linux")]

#[allow(dead_code)]
mod common;

use boundpool_scheduler::{Cores, ErrorKind, GraphBuilder, PoolBuilder};
use common::allowed_cores;

#[test]
fn a_thread_kept_off_the_workers_and_the_threads_it_starts_run_on_the_free_cores() {
    let allowed = allowed_cores();
    if allowed.len() < 2 {
        eprintln!("skipped: one core");
        return;
    }
    let worker_core = allowed[0];
    let pool = PoolBuilder::new()
        .workers(1)
        .cores(Cores::List(vec![worker_core]))
        .build()
        .unwrap();
    let expected: Vec<usize> = allowed[1..].to_vec();
    assert_eq!(pool.free_cores(), expected);
    // In a thread of its own, so that the test harness's thread keeps its set.
    std::thread::scope(|s| {
        s.spawn(|| {
            let free = pool.keep_off_workers().unwrap();
            assert_eq!(free, expected);
            assert_eq!(allowed_cores(), expected);
            let child = std::thread::spawn(allowed_cores).join().unwrap();
            assert_eq!(child, expected, "a thread started after inherits the set");
            // The pool still runs graphs submitted from there.
            let mut g = GraphBuilder::new("from a placed thread");
            let a = g.node("a", |_| Ok(7u32));
            let out = pool.run(&g.build().unwrap()).unwrap();
            assert_eq!(out.get(a), Some(&7));
        });
    });
    assert_eq!(
        allowed_cores(),
        allowed,
        "the caller's own thread is untouched"
    );
}

#[test]
fn no_free_core_is_an_error_naming_the_pool_and_the_cores() {
    let allowed = allowed_cores();
    let pool = PoolBuilder::new()
        .name("full")
        .workers(allowed.len())
        .cores(Cores::List(allowed.clone()))
        .build()
        .unwrap();
    assert!(pool.free_cores().is_empty());
    let e = std::thread::spawn(move || pool.keep_off_workers().unwrap_err())
        .join()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Placement);
    let m = e.to_string();
    assert!(
        m.contains("pool 'full'") && m.contains("no core is free"),
        "{m}"
    );
    assert!(m.contains(&format!("{}", allowed[0])), "{m}");
}

#[test]
fn unpinned_workers_leave_the_thread_where_it_was() {
    let allowed = allowed_cores();
    let pool = PoolBuilder::new()
        .workers(2)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    assert_eq!(pool.free_cores(), allowed);
    let (free, after) =
        std::thread::spawn(move || (pool.keep_off_workers().unwrap(), allowed_cores()))
            .join()
            .unwrap();
    assert_eq!(free, allowed);
    assert_eq!(after, allowed);
}

#[test]
fn a_reserved_core_is_left_out_of_the_free_ones() {
    let allowed = allowed_cores();
    if allowed.len() < 4 {
        eprintln!(
            "skipped: {} cores (a reservation beside a worker needs 4 to test twice)",
            allowed.len()
        );
        return;
    }
    let n = allowed.len();
    let pool = PoolBuilder::new()
        .workers(1)
        .cores(Cores::List(vec![allowed[0]]))
        .build()
        .unwrap();
    let first = pool.reserve_core().unwrap();
    assert_eq!(first, allowed[n - 1], "the last free core");
    assert_eq!(pool.free_cores(), allowed[1..n - 1].to_vec());
    let second = pool.reserve_core().unwrap();
    assert_eq!(second, allowed[n - 2]);
    let expected = allowed[1..n - 2].to_vec();
    assert_eq!(pool.free_cores(), expected);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(pool.keep_off_workers().unwrap(), expected);
            assert_eq!(allowed_cores(), expected);
        });
        // The reserved core's thread pins itself there and runs a graph.
        s.spawn(|| {
            boundpool_scheduler::pin_current_thread(&[first]).unwrap();
            let mut g = GraphBuilder::new("on a reserved core");
            let a = g.node("a", |_| Ok(3u32));
            let out = pool.run(&g.build().unwrap()).unwrap();
            assert_eq!(out.get(a), Some(&3));
        });
    });
}

#[test]
fn reserving_the_last_free_core_is_an_error_naming_the_pool_and_the_cores() {
    let allowed = allowed_cores();
    if allowed.len() < 2 {
        eprintln!("skipped: one core");
        return;
    }
    let n = allowed.len();
    let pool = PoolBuilder::new()
        .name("nearly full")
        .workers(n - 1)
        .cores(Cores::List(allowed[..n - 1].to_vec()))
        .build()
        .unwrap();
    let e = pool.reserve_core().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Placement);
    let m = e.to_string();
    assert!(
        m.contains("pool 'nearly full'") && m.contains("needs two free"),
        "{m}"
    );
    assert!(m.contains(&format!("[{}] is free", allowed[n - 1])), "{m}");
    assert_eq!(pool.free_cores(), vec![allowed[n - 1]], "nothing reserved");
}

#[test]
fn unpinned_workers_have_no_core_to_reserve() {
    let pool = PoolBuilder::new()
        .name("loose")
        .workers(1)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    let e = pool.reserve_core().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Placement);
    let m = e.to_string();
    assert!(m.contains("pool 'loose'") && m.contains("unpinned"), "{m}");
}
