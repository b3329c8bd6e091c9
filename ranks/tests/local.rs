//! Ranks as threads of one process (the in-process network): runs equal to the one-process
//! reference, failures on every rank, dead peers, mismatched graphs, long values, threads.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool_ranks::{Error, ErrorKind, LocalNetwork, RankGraphBuilder, Ranks, RanksBuilder};
use boundpool_scheduler::Cores;
use common::random;

fn world(n: usize, settings: RanksBuilder) -> (LocalNetwork, Vec<Ranks>) {
    let net = LocalNetwork::new(n);
    let ranks = (0..n)
        .map(|r| {
            settings
                .clone()
                .cores(Cores::Unpinned)
                .build_local(&net, r)
                .unwrap()
        })
        .collect();
    (net, ranks)
}

/// The workers' idle spin of the cases run both ways: the runtime's choice (none on a machine
/// whose cores the ranks' threads share), and a long one, in which spinning workers take
/// arrivals themselves (`RanksBuilder::worker_polls`).
fn both_spins(settings: RanksBuilder) -> [RanksBuilder; 2] {
    [
        settings.clone(),
        settings.idle_spin(Duration::from_millis(20)),
    ]
}

/// Runs `f` on every rank at once (a thread each), like an SPMD program.
fn on_all<R: Send>(ranks: &[Ranks], f: impl Fn(&Ranks) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|r| s.spawn(|| f(r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn random_graphs_equal_the_one_process_run() {
    // Small values on the posted lane (the default), and probed as the rest.
    let settings = [true, false]
        .into_iter()
        .flat_map(|lane| both_spins(RanksBuilder::new().workers(2).posted_receives(lane)));
    let settings: Vec<_> = settings.collect();
    for (n, settings) in [2, 3, 4]
        .into_iter()
        .flat_map(|n| settings.iter().map(move |s| (n, s.clone())))
    {
        let (_net, ranks) = world(n, settings);
        let checked = on_all(&ranks, |r| {
            let mut checked = 0;
            for seed in 0..12u64 {
                let spec = random::random_spec(seed * 31 + n as u64, n, 40, None);
                let reference = random::reference(&spec);
                let (graph, refs) = random::build(&spec, r).unwrap();
                // Twice: the second run of a graph reuses its check and counts its statuses.
                for _ in 0..2 {
                    let out = r.run(&graph).unwrap();
                    checked += random::check(&spec, &reference, &out, &refs, r.rank()).unwrap();
                }
            }
            checked
        });
        assert_eq!(checked.iter().sum::<usize>(), 12 * 40 * 2, "{n} ranks");
    }
}

#[test]
fn values_past_the_message_limit_go_in_chunks() {
    // A 1 MiB value in 1000-byte chunks (the last one short), and small ones whole.
    let (_net, ranks) = world(2, RanksBuilder::new().workers(1).max_message_bytes(1000));
    on_all(&ranks, |r| {
        let spec = random::random_spec(7, 2, 30, Some(1 << 20));
        let reference = random::reference(&spec);
        let (graph, refs) = random::build(&spec, r).unwrap();
        let out = r.run(&graph).unwrap();
        random::check(&spec, &reference, &out, &refs, r.rank()).unwrap();
    });
}

#[test]
fn several_runs_and_graphs_in_flight() {
    let (_net, ranks) = world(3, RanksBuilder::new().workers(2));
    on_all(&ranks, |r| {
        let specs: Vec<_> = (0..3)
            .map(|s| random::random_spec(100 + s, 3, 25, None))
            .collect();
        let built: Vec<_> = specs.iter().map(|s| random::build(s, r).unwrap()).collect();
        // Six runs of each graph submitted before any is waited on: 4 slots each, so some
        // submissions wait for a slot, and runs of three graphs interleave.
        let mut handles = Vec::new();
        for _ in 0..2 {
            for (i, (g, _)) in built.iter().enumerate() {
                for _ in 0..3 {
                    handles.push((i, r.submit(g).unwrap()));
                }
            }
        }
        for (i, h) in handles {
            let out = h.wait().unwrap();
            let reference = random::reference(&specs[i]);
            random::check(&specs[i], &reference, &out, &built[i].1, r.rank()).unwrap();
        }
    });
}

#[test]
fn recycled_landings_leave_kept_outputs_alone() {
    // A received value's memory is recycled for the next value of its transfer once its run's
    // outputs are dropped (unit tests in comm/run.rs and comm/engine/arrive.rs check where it
    // lands): values stay whole, also in chunks, and an output kept is never written into.
    for chunk in [usize::MAX, 1 << 16] {
        let (_net, ranks) = world(
            2,
            RanksBuilder::new()
                .workers(1)
                .max_message_bytes(chunk.min(i32::MAX as usize)),
        );
        // Lockstep: rank 0 makes run n + 1's value only after rank 1 dropped run n's outputs.
        let step = std::sync::Barrier::new(2);
        on_all(&ranks, |r| {
            let mut g = RankGraphBuilder::new("recycle");
            let a = g.plain_node(0, "make", |ctx| Ok(vec![ctx.run_seq() as u8; 1 << 20]));
            let b = g.plain_node(1, "read", move |ctx| {
                let v = ctx.input(a)?;
                Ok(u8::from(v.iter().all(|&x| x == ctx.run_seq() as u8)))
            });
            g.edge(a, b);
            let graph = g.build(r).unwrap();
            let kept = r.run(&graph).unwrap();
            for _ in 0..4 {
                let out = r.run(&graph).unwrap();
                assert_ne!(out.get(b), Some(&0), "a whole value");
                drop(out);
                step.wait();
            }
            // Rank 0's own value, rank 1's received one.
            let v = kept.get(a).expect("a value on both ranks");
            assert!(v.iter().all(|&x| x == 0), "the kept value is intact");
        });
    }
}

#[test]
fn placement_is_reported() {
    let net = LocalNetwork::new(1);
    let r = RanksBuilder::new()
        .workers(1)
        .comm_spin(Duration::from_micros(5))
        .build_local(&net, 0)
        .unwrap();
    let p = r.placement();
    assert_eq!(p.workers.len(), 1);
    assert_eq!(p.comm_spin, Duration::from_micros(5));
    let text = p.to_string();
    assert!(text.contains("communication thread spins 5 µs"), "{text}");
    assert_eq!(r.pool().workers()[0].core, p.workers[0]);
}

#[test]
fn runs_in_flight_are_bounded_by_slots_and_tags() {
    // One slot: runs of the graph are serialized on each rank; results stay right.
    let (_net, ranks) = world(2, RanksBuilder::new().workers(2));
    on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("one slot");
        g.runs_in_flight(1);
        let a = g.plain_node(0, "a", |ctx| Ok(ctx.run_seq()));
        let b = g.plain_node(1, "b", move |ctx| Ok(ctx.input(a)? * 10));
        g.edge(a, b);
        let graph = g.build(r).unwrap();
        let hs: Vec<_> = (0..5).map(|_| r.submit(&graph).unwrap()).collect();
        for (i, h) in hs.into_iter().enumerate() {
            let out = h.wait().unwrap();
            if r.rank() == 1 {
                assert_eq!(out.get(b), Some(&(i as u64 * 10)));
                // The received value is readable here too.
                assert_eq!(out.get(a), Some(&(i as u64)));
            }
        }
    });
}

#[test]
fn a_node_failure_is_every_ranks_error() {
    for settings in both_spins(RanksBuilder::new().workers(2)) {
        a_node_failure_is_every_ranks_error_with(settings);
    }
}

fn a_node_failure_is_every_ranks_error_with(settings: RanksBuilder) {
    let (_net, ranks) = world(3, settings);
    let ran_after = Arc::new(AtomicUsize::new(0));
    let errors = on_all(&ranks, |r| {
        let ran_after = ran_after.clone();
        let mut g = RankGraphBuilder::new("fails");
        let a = g.plain_node(0, "a", |_| Ok(1u64));
        let bad = g.plain_node(1, "bad", move |ctx| {
            let _ = ctx.input(a)?;
            Err::<u64, _>("no good".into())
        });
        let after = g.plain_node(2, "after", move |ctx| {
            ran_after.fetch_add(1, Ordering::SeqCst);
            Ok(*ctx.input(bad)?)
        });
        // A node on rank 2 that does not depend on the failure: its rank still fails.
        let free = g.plain_node(2, "independent", |_| Ok(5u64));
        g.edge(a, bad).edge(bad, after);
        let _ = free;
        let graph = g.build(r).unwrap();
        let e = r.run(&graph).unwrap_err();
        // The graph works again afterwards? It fails the same way: run it once more.
        let again = r.run(&graph).unwrap_err();
        assert_eq!(again.to_string(), e.to_string());
        e
    });
    for e in &errors {
        assert_eq!(e.kind(), ErrorKind::NodeFailed, "{e}");
        assert_eq!(e.rank(), Some(1));
        assert_eq!(e.node(), Some("bad"));
        assert_eq!(
            e.to_string(),
            "rank 1: node 'bad' (#1) of graph 'fails' failed: no good"
        );
    }
    assert_eq!(ran_after.load(Ordering::SeqCst), 0, "a dependent ran");
}

#[test]
fn a_panic_names_its_rank_and_node_and_the_lowest_rank_wins() {
    let (_net, ranks) = world(2, RanksBuilder::new().workers(1));
    let errors = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::<()>::new("panics");
        g.plain_node(1, "p1", |_| -> Result<u64, _> { panic!("one") });
        g.plain_node(0, "p0", |_| -> Result<u64, _> { panic!("zero") });
        let graph = g.build(r).unwrap();
        r.run(&graph).unwrap_err()
    });
    for e in &errors {
        assert_eq!(e.kind(), ErrorKind::NodePanicked, "{e}");
        assert_eq!((e.rank(), e.node()), (Some(0), Some("p0")), "{e}");
        assert!(e.to_string().contains("panicked: zero"), "{e}");
    }
}

#[test]
fn a_graph_that_differs_between_ranks_is_an_error_naming_the_node() {
    let (_net, ranks) = world(3, RanksBuilder::new().workers(1));
    let errors = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("differs");
        let a = g.plain_node(0, "a", |_| Ok(1u64));
        // Rank 2 names node #1 differently.
        let name = if r.rank() == 2 { "c" } else { "b" };
        let b = g.plain_node(1, name, move |ctx| Ok(*ctx.input(a)?));
        let c = g.plain_node(2, "tail", move |ctx| Ok(*ctx.input(b)?));
        g.edge(a, b).edge(b, c);
        let graph = g.build(r).unwrap();
        r.run(&graph).unwrap_err()
    });
    for (rank, e) in errors.iter().enumerate() {
        assert_eq!(e.kind(), ErrorKind::GraphMismatch, "{e}");
        assert_eq!(e.rank(), Some(2));
        assert!(
            e.to_string()
                .contains("graph 'differs' differs between ranks: node #1 is 'b' on rank 0 but differs on rank 2"),
            "{e}"
        );
        assert_eq!(rank == 2, e.to_string().contains("(here: 'c')"), "{e}");
    }
}

#[test]
fn data_that_arrives_before_its_verdict_waits_in_order() {
    // Rank 0's verdict to rank 2 is held back: rank 1 has its verdict and sends its data (and
    // its statuses) to rank 2 first. Rank 2 keeps them, in rank 1's order, until the verdict.
    let (net, ranks) = world(3, RanksBuilder::new().workers(1));
    net.hold(0, 2);
    let results = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("early data");
        g.runs_in_flight(2);
        let a = g.plain_node(1, "a", |ctx| Ok(vec![ctx.run_seq(); 3]));
        let s = g.serde_node(1, "s", |ctx| Ok(format!("run {}", ctx.run_seq())));
        let b = g.plain_node(2, "b", move |ctx| {
            Ok(ctx.input(a)?[0] * 100 + ctx.input(s)?.len() as u64)
        });
        g.edge(a, b).edge(s, b);
        let graph = g.build(r).unwrap();
        let hs: Vec<_> = (0..5).map(|_| r.submit(&graph).unwrap()).collect();
        if r.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            net.release(0, 2);
        }
        hs.into_iter()
            .map(|h| h.wait().unwrap().get(b).copied())
            .collect::<Vec<_>>()
    });
    let want: Vec<Option<u64>> = (0..5).map(|i| Some(i * 100 + 5)).collect();
    assert_eq!(results[2], want);
}

/// Small values (a plain `u64`, a serde string) go on the posted lane, a value past it (8,000
/// bytes) is probed; the lane is held back while the probed value, the statuses and the next
/// runs' data pass it (as MPI's two communicators allow), and each small value still reaches
/// its own run. With `posted_receives(false)` the held lane carries nothing: runs end before
/// it is released.
#[test]
fn small_values_on_the_posted_lane_reach_their_runs_whatever_passes_them() {
    for lane in [true, false] {
        let (net, ranks) = world(2, RanksBuilder::new().workers(1).posted_receives(lane));
        net.hold_lane(0, 1);
        let consumed = Arc::new(AtomicUsize::new(0));
        let results = std::thread::scope(|scope| {
            let (net, seen) = (&net, consumed.clone());
            let releaser = scope.spawn(move || {
                if lane {
                    std::thread::sleep(Duration::from_millis(100));
                    // Every run's consumer needs a lane value: none ran.
                    assert_eq!(seen.load(Ordering::SeqCst), 0);
                } else {
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while seen.load(Ordering::SeqCst) == 0 {
                        assert!(Instant::now() < deadline, "no run ended past a held lane");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                net.release(0, 1);
            });
            let results = on_all(&ranks, |r| {
                let mut g = RankGraphBuilder::new("lane");
                g.runs_in_flight(2);
                let a = g.plain_node(0, "a", |ctx| Ok(ctx.run_seq() * 10));
                let s = g.serde_node(0, "s", |ctx| Ok("x".repeat(ctx.run_seq() as usize)));
                let big = g.plain_node(0, "big", |ctx| Ok(vec![ctx.run_seq(); 1000]));
                let c = consumed.clone();
                let b = g.plain_node(1, "b", move |ctx| {
                    c.fetch_add(1, Ordering::SeqCst);
                    let big = ctx.input(big)?;
                    Ok(*ctx.input(a)? + ctx.input(s)?.len() as u64 + big[999] * 1000)
                });
                g.edge(a, b).edge(s, b).edge(big, b);
                let graph = g.build(r).unwrap();
                let hs: Vec<_> = (0..5).map(|_| r.submit(&graph).unwrap()).collect();
                hs.into_iter()
                    .map(|h| h.wait().unwrap().get(b).copied())
                    .collect::<Vec<_>>()
            });
            releaser.join().unwrap();
            results
        });
        let want: Vec<Option<u64>> = (0..5).map(|i| Some(i * 10 + i + i * 1000)).collect();
        assert_eq!(results[1], want, "lane {lane}");
    }
}

#[test]
fn a_graph_without_transfers_that_differs_is_found_even_when_its_runs_end_first() {
    // Each rank's nodes are its own: the runs end at once everywhere, and rank 0's verdict to
    // rank 1 is held back until they have; rank 1 must still report the mismatch.
    let (net, ranks) = world(2, RanksBuilder::new().workers(1));
    net.hold(0, 1);
    let errors = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::<()>::new("no transfers");
        g.plain_node(0, "x", |_| Ok(1u64));
        g.plain_node(1, if r.rank() == 1 { "z" } else { "y" }, |_| Ok(2u64));
        let graph = g.build(r).unwrap();
        let h = r.submit(&graph).unwrap();
        if r.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            net.release(0, 1);
        }
        h.wait().unwrap_err()
    });
    for e in &errors {
        assert_eq!(e.kind(), ErrorKind::GraphMismatch, "{e}");
        assert!(e.to_string().contains("node #1 is 'y' on rank 0"), "{e}");
    }
}

#[test]
fn a_value_that_cannot_cross_is_an_error_at_build_naming_the_edge() {
    let (_net, ranks) = world(2, RanksBuilder::new().workers(1));
    let mut g = RankGraphBuilder::new("local only");
    let a = g.node(0, "a", |_| Ok(std::rc::Rc::new(1u8).to_string()));
    let b = g.plain_node(1, "b", move |ctx| Ok(ctx.input(a)?.len() as u64));
    g.edge(a, b);
    let e = g.build(&ranks[0]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CannotCross);
    assert!(
        e.to_string()
            .contains("edge 'a' (#0) (rank 0) -> 'b' (#1) (rank 1) crosses ranks"),
        "{e}"
    );
    assert!(e.to_string().contains("alloc::string::String"), "{e}");
}

#[test]
fn a_killed_rank_ends_every_other_ranks_run_in_time() {
    let settings = RanksBuilder::new()
        .workers(1)
        .peer_timeout(Duration::from_millis(800))
        .heartbeat(Duration::from_millis(100));
    for settings in both_spins(settings) {
        a_killed_rank_ends_every_other_ranks_run_in_time_with(settings);
    }
}

fn a_killed_rank_ends_every_other_ranks_run_in_time_with(settings: RanksBuilder) {
    let (net, ranks) = world(3, settings);
    let start = Instant::now();
    let results: Vec<Result<(), Error>> = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("waits on rank 2");
        let slow = g.plain_node(2, "slow", |_| {
            std::thread::sleep(Duration::from_secs(30));
            Ok(1u64)
        });
        let b = g.plain_node(0, "b", move |ctx| Ok(*ctx.input(slow)?));
        let c = g.plain_node(1, "c", move |ctx| Ok(*ctx.input(b)?));
        g.edge(slow, b).edge(b, c);
        let graph = g.build(r).unwrap();
        let h = r.submit(&graph).unwrap();
        if r.rank() == 2 {
            // Rank 2 is cut off as if killed; its own run is abandoned.
            std::thread::sleep(Duration::from_millis(200));
            net.sever(2);
            return Ok(());
        }
        h.wait().map(|_| ())
    });
    let took = start.elapsed();
    for (rank, res) in results.iter().enumerate().take(2) {
        let e = res.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PeerDied, "rank {rank}: {e}");
        assert_eq!(e.rank(), Some(2), "{e}");
        assert!(e.to_string().starts_with("rank 2 died: silent for"), "{e}");
    }
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(ranks[0].is_poisoned() && ranks[1].is_poisoned());
    // Dropping the runtimes does not wait for the abandoned runs.
    let t = Instant::now();
    drop(ranks);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_rank_that_leaves_after_its_part_fails_nothing() {
    // Rank 1's run resolves and it shuts down while rank 2's status to rank 0 is held back:
    // rank 0's run needs nothing more of rank 1 and must succeed once rank 2's status comes.
    // (A first run gets the graph past its check, whose registration the hold would stop.)
    let (net, ranks) = world(3, RanksBuilder::new().workers(1));
    let barrier = std::sync::Barrier::new(3);
    let results: Vec<Result<Option<u64>, Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                let (net, barrier) = (net.clone(), &barrier);
                s.spawn(move || {
                    let mut g = RankGraphBuilder::new("one leaves");
                    let a = g.plain_node(1, "a", |_| Ok(3u64));
                    let b = g.plain_node(0, "b", move |ctx| Ok(*ctx.input(a)? + 1));
                    g.plain_node(2, "c", |_| Ok(0u64));
                    g.edge(a, b);
                    let graph = g.build(&r).unwrap();
                    r.run(&graph).unwrap();
                    barrier.wait();
                    if r.rank() == 0 {
                        net.hold(2, 0);
                    }
                    barrier.wait();
                    let out = r.run(&graph).map(|o| o.get(b).copied());
                    if r.rank() == 1 {
                        drop(r);
                        std::thread::sleep(Duration::from_millis(50));
                        net.release(2, 0);
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0].as_ref().unwrap(), &Some(4));
    assert!(results[1].is_ok() && results[2].is_ok(), "{results:?}");
}

#[test]
fn a_rank_that_leaves_early_fails_runs_that_need_it() {
    let (_net, mut ranks) = world(2, RanksBuilder::new().workers(1));
    let r1 = ranks.pop().unwrap();
    drop(r1);
    let r0 = &ranks[0];
    let mut g = RankGraphBuilder::new("needs rank 1");
    let a = g.plain_node(1, "a", |_| Ok(1u64));
    let b = g.plain_node(0, "b", move |ctx| Ok(*ctx.input(a)?));
    g.edge(a, b);
    let graph = g.build(r0).unwrap();
    let e = r0.run(&graph).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerLeft, "{e}");
    assert_eq!(e.rank(), Some(1));
}

/// This process's threads whose name starts with `prefix` (Linux keeps 15 bytes of a name).
/// Counted by name: the other tests of this binary run at once and start threads of their own.
#[cfg(target_os = "linux")]
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[cfg(target_os = "linux")]
#[test]
fn a_rank_has_its_workers_and_one_communication_thread() {
    // The pool's threads are `{name}-{group}-{i}`, the communication thread `{name}-comm`.
    let name = "thrcount";
    let net = LocalNetwork::new(1);
    assert_eq!(threads_named(name), 0);
    let r = RanksBuilder::new()
        .name(name)
        .workers(3)
        .cores(Cores::Unpinned)
        .build_local(&net, 0)
        .unwrap();
    assert_eq!(threads_named(name), 3 + 1);
    assert_eq!(threads_named(&format!("{name}-comm")), 1);
    // Runs (a world of one: no transfers) make no thread.
    let spec = random::random_spec(5, 1, 30, None);
    let (graph, _) = random::build(&spec, &r).unwrap();
    for _ in 0..3 {
        r.run(&graph).unwrap();
    }
    assert_eq!(threads_named(name), 3 + 1);
    drop(r);
    assert_eq!(threads_named(name), 0);
}

#[test]
fn stamped_edges_record_every_hop_in_path_order() {
    // A value hops 0 -> 1 -> 0; every hop of both edges is stamped, on one clock, in order.
    let (_net, ranks) = world(2, RanksBuilder::new().workers(1).stamp_edges(true));
    let stamps = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("stamped");
        let a = g.plain_node(0, "a", |_| Ok(1u64));
        let b = g.plain_node(1, "b", move |ctx| Ok(*ctx.input(a)? + 1));
        let c = g.plain_node(0, "c", move |ctx| Ok(*ctx.input(b)? + 1));
        g.edge(a, b).edge(b, c);
        let graph = g.build(r).unwrap();
        let out = r.run(&graph).unwrap();
        if r.rank() == 0 {
            assert_eq!(out.get(c), Some(&3));
        }
        out.edge_stamps().expect("stamping")
    });
    // Rank 0 sends a's value and receives b's; rank 1 the other way round.
    for (sender, receiver, producer) in [(0, 1, 0), (1, 0, 1)] {
        let s = stamps[sender].sends.iter().find(|s| s.producer == producer);
        let s = s.expect("the send");
        let v = stamps[receiver]
            .recvs
            .iter()
            .find(|v| v.producer == producer);
        let v = v.expect("the receive");
        assert_eq!((s.to, v.from), (receiver, sender));
        let path = [
            s.body,
            s.posted,
            v.arrived,
            v.received,
            v.completing,
            v.completed,
        ];
        assert!(path.iter().all(|&t| t > 0), "{s:?} {v:?}");
        assert!(path.windows(2).all(|w| w[0] <= w[1]), "{s:?} {v:?}");
        // Handed to the communication thread, or posted by the worker itself.
        if s.queued != 0 {
            assert!(s.body <= s.queued && s.queued <= s.taken && s.taken <= s.posted);
        }
    }
    // Without the setting, nothing is stamped.
    let (_net, ranks) = world(2, RanksBuilder::new().workers(1));
    let none = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("unstamped");
        let a = g.plain_node(0, "a", |_| Ok(1u64));
        let b = g.plain_node(1, "b", move |ctx| Ok(*ctx.input(a)?));
        g.edge(a, b);
        r.run(&g.build(r).unwrap()).unwrap().edge_stamps()
    });
    assert_eq!(none, vec![None, None]);
}

/// A value hopping between two ranks 40 times, each rank's worker spinning long before it
/// parks: with `worker_polls` (the default) the spinning workers take arrivals themselves
/// (stamped `by_worker`): the chain runs until one did (the communication thread may win every
/// race of a few runs on a loaded machine, never of many); without it, none in as many runs.
/// The chain's result is the same either way.
#[test]
fn spinning_workers_take_arrivals_themselves_unless_told_not_to() {
    let mut runs_with_polls = 0;
    for polls in [true, false] {
        let settings = RanksBuilder::new()
            .workers(1)
            .idle_spin(Duration::from_millis(50))
            .worker_polls(polls)
            .stamp_edges(true);
        let (_net, ranks) = world(2, settings);
        let deadline = Instant::now() + Duration::from_secs(30);
        let taken = on_all(&ranks, |r| {
            let mut g = RankGraphBuilder::new("hops");
            let mut last = g.plain_node(0, "hop0", |_| Ok(0u64));
            for i in 1..=40usize {
                let prev = last;
                last = g.plain_node(i % 2, format!("hop{i}"), move |ctx| {
                    Ok(*ctx.input(prev)? + 1)
                });
                g.edge(prev, last);
            }
            let graph = g.build(r).unwrap();
            let (mut by_worker, mut runs) = (0, 0);
            // Every rank runs the same number of runs: both decide with a run of the graph
            // (the sum over ranks, read on rank 0, is every rank's answer).
            let mut go_on = true;
            while go_on {
                let out = r.run(&graph).unwrap();
                runs += 1;
                if r.rank() == 0 {
                    assert_eq!(out.get(last), Some(&40));
                }
                let stamps = out.edge_stamps().expect("stamping");
                assert_eq!(stamps.recvs.len(), 20);
                by_worker += stamps.recvs.iter().filter(|v| v.by_worker).count();
                go_on = match polls {
                    true => runs < 1000 && Instant::now() < deadline && !agreed(r, by_worker > 0),
                    false => runs < runs_with_polls.max(5),
                };
            }
            (by_worker, runs)
        });
        let by_worker: usize = taken.iter().map(|t| t.0).sum();
        if polls {
            assert!(
                by_worker > 0,
                "no arrival taken by a spinning worker in {taken:?} runs"
            );
            runs_with_polls = taken[0].1;
        } else {
            assert_eq!(
                by_worker, 0,
                "workers looked at the network though told not to"
            );
        }
    }
}

/// Whether any rank says `mine`: a one-node-per-rank graph whose values meet on rank 0 and
/// go back to every rank (so every rank learns the answer in the same run).
fn agreed(r: &Ranks, mine: bool) -> bool {
    let mut g = RankGraphBuilder::new("agree");
    let votes: Vec<_> = (0..r.size())
        .map(|k| g.plain_node(k, format!("vote{k}"), move |_| Ok(u64::from(mine))))
        .collect();
    let sum = g.plain_node(0, "sum", {
        let votes = votes.clone();
        move |ctx| {
            let mut n = 0;
            for v in &votes {
                n += *ctx.input(*v)?;
            }
            Ok(n)
        }
    });
    for &v in &votes {
        g.edge(v, sum);
    }
    let echoes: Vec<_> = (0..r.size())
        .map(|k| {
            let e = g.plain_node(k, format!("echo{k}"), move |ctx| Ok(*ctx.input(sum)?));
            g.edge(sum, e);
            e
        })
        .collect();
    let graph = g.build(r).unwrap();
    let out = r.run(&graph).unwrap();
    *out.get(echoes[r.rank()]).expect("this rank's echo") > 0
}

#[test]
fn a_full_send_window_sends_the_most_urgent_value_first() {
    // Rank 0 sends four values to rank 1 through a window of one, on a link that takes
    // nothing more until released: the first send stays in flight, the other three wait.
    // `high`, made last, feeds the longest path on rank 1, so it goes next, ahead of the two
    // that waited longer, which keep their order.
    let settings = RanksBuilder::new()
        .workers(1)
        .send_window(1)
        .stamp_edges(true);
    let (net, ranks) = world(2, settings);
    let stamps = on_all(&ranks, |r| {
        let mut g = RankGraphBuilder::new("urgent first");
        let lows: Vec<_> = (0..3u64)
            .map(|i| g.plain_node(0, format!("low{i}"), move |_| Ok(i)))
            .collect();
        let high = g.plain_node(0, "high", |_| Ok(7u64));
        let mut last = high;
        for i in 0..3 {
            let before = last;
            last = g.plain_node(1, format!("after high {i}"), move |ctx| {
                Ok(*ctx.input(before)? + 1)
            });
            g.edge(before, last);
        }
        for (i, &low) in lows.iter().enumerate() {
            g.edge(low, high);
            let c = g.plain_node(1, format!("reads low{i}"), move |ctx| Ok(*ctx.input(low)?));
            g.edge(low, c);
        }
        let graph = g.build(r).unwrap();
        let priority = |p: u32| {
            let t = graph.lowering().transfers.iter().find(|t| t.producer == p);
            t.unwrap().priority
        };
        assert!(lows
            .iter()
            .all(|l| priority(l.index()) < priority(high.index())));
        // The first run gets the graph past its check (the verdict crosses the link).
        r.run(&graph).unwrap();
        if r.rank() == 0 {
            net.stall(0, 1);
        }
        let h = r.submit(&graph).unwrap();
        if r.rank() == 0 {
            while r.sends_waiting() < 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
            net.release(0, 1);
        }
        let out = h.wait().unwrap();
        if r.rank() == 1 {
            assert_eq!(out.get(last), Some(&10));
        }
        (out.edge_stamps().unwrap(), high.index())
    });
    let (sends, high) = (&stamps[0].0.sends, stamps[0].1);
    let mut by_post: Vec<_> = sends.iter().collect();
    by_post.sort_by_key(|s| s.posted);
    assert!(by_post.iter().all(|s| s.posted > 0), "{sends:?}");
    let order: Vec<u32> = by_post.iter().map(|s| s.producer).collect();
    assert_ne!(order[0], high, "the first send took the window: {order:?}");
    assert_eq!(order[1], high, "the urgent one goes next: {order:?}");
    // The two that waited go in the order they came (their send nodes ran).
    assert!(by_post[2].body < by_post[3].body, "{by_post:?}");
    // Rank 1 saw them arrive in that order.
    let recvs = &stamps[1].0.recvs;
    let mut by_arrival: Vec<_> = recvs.iter().collect();
    by_arrival.sort_by_key(|v| v.arrived);
    let arrived: Vec<u32> = by_arrival.iter().map(|v| v.producer).collect();
    assert_eq!(arrived, order);
}
