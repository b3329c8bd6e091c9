//! Ranks bench (issue "Ranks", item 6), run under `mpirun`:
//!
//! * **8-byte edge**: a chain of 8-byte plain values hopping between ranks 0 and 1, time per
//!   cross-rank edge, against raw MPI's half round trip (`MPI_Send`/`MPI_Recv` ping-pong of 8
//!   bytes on `MPI_COMM_WORLD`) measured in the same process, on the communication thread,
//!   right after MPI started and before the runtime's engine did.
//! * **64 MiB value**: a 64 MiB `Vec<u8>` from rank 0 to rank 1, the time from the producer's
//!   end to the consumer's start (one host clock), against raw MPI sending 64 MiB between the
//!   same buffers (hot) and into a fresh allocation each time (what a received value paid
//!   before recycled landings, and still pays the first time).
//! * **DAG**: a 100k-node random DAG (blocks of 256 nodes dealt round-robin to the ranks, each
//!   node reading 2 of the 512 nodes before it; 8-byte values), ns per node.
//! * **Threads**: OS threads of the process before MPI, after `MPI_Init`, with the runtime.
//!
//! Each rank first prints where its threads run and how they wait (`Ranks::placement`: the
//! workers' and communication thread's cores, whether each has a core of its own, the
//! spins), and after the 64 MiB value how many of rank 1's values landed in recycled memory.
//!
//! With `--edge-breakdown` the runtime stamps every hop of the 8-byte edge
//! (`RanksBuilder::stamp_edges`: the send node's start, its hand-off to the communication
//! thread, the post, the arrival on the other rank, the bytes in, the `Completer`'s call) and
//! each chain body its start and end, on `CLOCK_MONOTONIC` (both ranks on one host share it);
//! rank 0 prints the median, 90th percentile and mean of each hop over every edge of the
//! timed runs (the chain's time per edge is the means' sum, plus each run's start and end).
//!
//! `mpirun -np P target/release/deps/ranks-* [--workers W] [--chain N] [--dag N] [--runs R]
//! [--no-edge] [--no-big] [--edge-breakdown] [--no-worker-sends] [--no-worker-polls] [--send-window N]
//! [--comm-spin-us U] [--idle-spin-us U] [--max-message-bytes B]` (P = 1, 2, 4; `cargo bench
//! -p boundpool-bench --features mpi --bench ranks --no-run` builds it). Rank 0 prints
//! markdown rows.

use std::ffi::{c_int, c_void};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_ranks::{
    monotonic_ns, EdgeStamps, MpiTransport, RankGraphBuilder, Ranks, RanksBuilder,
};
use boundpool_workloads::{median, percentile};
use mpi::ffi;

fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().parse().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

#[derive(Default, Debug)]
struct Raw {
    half_rtt_8b: f64,
    /// The same ping-pong through the calls the runtime makes (`MPI_Isend` and `MPI_Test`;
    /// `MPI_Improbe` on any source and tag until a message, `MPI_Imrecv`, `MPI_Test`), on one
    /// thread: what the edge would cost with no runtime around the calls.
    half_rtt_8b_nonblocking: f64,
    /// The same with the receive posted ahead (`MPI_Irecv` for the next message, two in
    /// flight, `MPI_Test` until it is done): the floor of a runtime that needs no probe.
    half_rtt_8b_posted: f64,
    big_hot: f64,
    big_fresh: f64,
    threads_after_init: usize,
}

/// Raw MPI on `MPI_COMM_WORLD` between ranks 0 and 1: blocking send and receive.
fn raw_baselines(rank: usize, size: usize, big: usize, edge: bool) -> Raw {
    let mut raw = Raw {
        threads_after_init: threads(),
        ..Raw::default()
    };
    // SAFETY: constants rsmpi's C shim sets before main.
    let (world, bytes) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_UINT8_T) };
    let send = |buf: *const u8, n: usize, to: usize| {
        // SAFETY: `buf` holds `n` bytes; a blocking send on the world communicator.
        unsafe {
            ffi::MPI_Send(
                buf.cast::<c_void>(),
                n as c_int,
                bytes,
                to as c_int,
                7,
                world,
            );
        }
    };
    let recv = |buf: *mut u8, n: usize, from: usize| {
        // SAFETY: `buf` has room for `n` bytes.
        unsafe {
            ffi::MPI_Recv(
                buf.cast::<c_void>(),
                n as c_int,
                bytes,
                from as c_int,
                7,
                world,
                ffi::RSMPI_STATUS_IGNORE,
            );
        }
    };
    if size >= 2 && rank < 2 {
        let peer = 1 - rank;
        if edge {
            let mut b = [0u8; 8];
            let rounds = 20_000;
            let mut times = Vec::new();
            for rep in 0..6 {
                let t = Instant::now();
                for _ in 0..rounds {
                    if rank == 0 {
                        send(b.as_ptr(), 8, peer);
                        recv(b.as_mut_ptr(), 8, peer);
                    } else {
                        recv(b.as_mut_ptr(), 8, peer);
                        send(b.as_ptr(), 8, peer);
                    }
                }
                if rep > 0 {
                    times.push(t.elapsed().as_secs_f64() / rounds as f64 / 2.0);
                }
            }
            raw.half_rtt_8b = median(times);
            raw.half_rtt_8b_nonblocking = nonblocking_half_rtt(rank, peer, rounds);
            raw.half_rtt_8b_posted = posted_half_rtt(rank, peer, rounds);
        }
        if big > 0 {
            let mut a = vec![1u8; big];
            let mut ack = [0u8; 1];
            for fresh in [false, true] {
                let mut times = Vec::new();
                for rep in 0..6 {
                    let t = Instant::now();
                    if rank == 0 {
                        send(a.as_ptr(), big, peer);
                        recv(ack.as_mut_ptr(), 1, peer);
                    } else {
                        if fresh {
                            let mut v: Vec<u8> = Vec::with_capacity(big);
                            recv(v.as_mut_ptr(), big, peer);
                            // SAFETY: MPI wrote all `big` bytes.
                            unsafe { v.set_len(big) };
                            std::hint::black_box(&v);
                        } else {
                            recv(a.as_mut_ptr(), big, peer);
                        }
                        send(ack.as_ptr(), 1, peer);
                    }
                    if rep > 0 {
                        times.push(t.elapsed().as_secs_f64());
                    }
                }
                let gbps = big as f64 / median(times) / 1e9;
                if fresh {
                    raw.big_fresh = gbps;
                } else {
                    raw.big_hot = gbps;
                }
            }
        }
    }
    // SAFETY: every rank reaches this barrier once.
    unsafe { ffi::MPI_Barrier(world) };
    raw
}

/// Calls `MPI_Test` on `req` until it is done.
fn test_until_done(req: &mut ffi::MPI_Request) {
    let mut flag: c_int = 0;
    while flag == 0 {
        // SAFETY: a request MPI gave and nobody completed; the status is ignored.
        unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
    }
}

/// Sends `b` to `peer` with `tag` on the world communicator: `MPI_Isend`, then `MPI_Test` until
/// done, as a worker's own send of a small value does.
fn isend_and_test(b: &[u8; 8], peer: usize, tag: c_int) {
    // SAFETY: constants rsmpi's C shim sets before main.
    let (world, bytes) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_UINT8_T) };
    let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
    // SAFETY: `b` outlives the request, which `test_until_done` completes before returning.
    unsafe {
        ffi::MPI_Isend(
            b.as_ptr().cast::<c_void>(),
            8,
            bytes,
            peer as c_int,
            tag,
            world,
            req.as_mut_ptr(),
        );
        test_until_done(&mut req.assume_init());
    }
}

/// The 8-byte ping-pong of [`raw_baselines`] through the runtime's non-blocking calls.
fn nonblocking_half_rtt(rank: usize, peer: usize, rounds: usize) -> f64 {
    // SAFETY: constants rsmpi's C shim sets before main.
    let (world, bytes, any_source, any_tag) = unsafe {
        (
            ffi::RSMPI_COMM_WORLD,
            ffi::RSMPI_UINT8_T,
            ffi::RSMPI_ANY_SOURCE,
            ffi::RSMPI_ANY_TAG,
        )
    };
    let send = |b: &[u8; 8]| isend_and_test(b, peer, 8);
    let recv = |b: &mut [u8; 8]| {
        let mut flag: c_int = 0;
        let mut message = std::mem::MaybeUninit::<ffi::MPI_Message>::uninit();
        let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::uninit();
        while flag == 0 {
            // SAFETY: out-pointers, read only once the flag says a message matched.
            unsafe {
                ffi::MPI_Improbe(
                    any_source,
                    any_tag,
                    world,
                    &mut flag,
                    message.as_mut_ptr(),
                    status.as_mut_ptr(),
                );
            }
        }
        let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: the matched message (used once) into `b`'s 8 bytes, done before returning.
        unsafe {
            let mut m = message.assume_init();
            ffi::MPI_Imrecv(
                b.as_mut_ptr().cast::<c_void>(),
                8,
                bytes,
                &mut m,
                req.as_mut_ptr(),
            );
            test_until_done(&mut req.assume_init());
        }
    };
    let mut b = [0u8; 8];
    let mut times = Vec::new();
    for rep in 0..6 {
        let t = Instant::now();
        for _ in 0..rounds {
            if rank == 0 {
                send(&b);
                recv(&mut b);
            } else {
                recv(&mut b);
                send(&b);
            }
        }
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64() / rounds as f64 / 2.0);
        }
    }
    median(times)
}

/// The 8-byte ping-pong of [`raw_baselines`] with each receive posted ahead: two
/// `MPI_Irecv`s in flight from the peer, the next one re-posted after this rank's send (off the
/// path), `MPI_Test` until the message is in; sends by `MPI_Isend` and `MPI_Test`.
fn posted_half_rtt(rank: usize, peer: usize, rounds: usize) -> f64 {
    // SAFETY: constants rsmpi's C shim sets before main.
    let (world, bytes) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_UINT8_T) };
    const TAG: c_int = 9;
    let mut landing = [[0u8; 8]; 2];
    // SAFETY: a request handle is plain data that MPI_Irecv overwrites before it is read.
    let mut reqs: [ffi::MPI_Request; 2] = unsafe { std::mem::zeroed() };
    let post = |buf: &mut [u8; 8], req: &mut ffi::MPI_Request| {
        // SAFETY: `landing` outlives every request: each is completed by `test_until_done` or cancelled
        // and waited for below, before the function returns.
        unsafe {
            ffi::MPI_Irecv(
                buf.as_mut_ptr().cast::<c_void>(),
                8,
                bytes,
                peer as c_int,
                TAG,
                world,
                req,
            )
        };
    };
    let send = |b: &[u8; 8]| isend_and_test(b, peer, TAG);
    for k in 0..2 {
        post(&mut landing[k], &mut reqs[k]);
    }
    let mut b = [0u8; 8];
    let mut times = Vec::new();
    let mut i = 0usize;
    // The slot whose message was taken and whose receive is re-posted after the next send.
    let mut free: Option<usize> = None;
    for rep in 0..6 {
        let t = Instant::now();
        for _ in 0..rounds {
            let k = i % 2;
            if rank == 0 {
                send(&b);
                if let Some(f) = free.take() {
                    post(&mut landing[f], &mut reqs[f]);
                }
                test_until_done(&mut reqs[k]);
                b = landing[k];
                free = Some(k);
            } else {
                test_until_done(&mut reqs[k]);
                b = landing[k];
                send(&b);
                post(&mut landing[k], &mut reqs[k]);
            }
            i += 1;
        }
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64() / rounds as f64 / 2.0);
        }
    }
    if let Some(f) = free {
        post(&mut landing[f], &mut reqs[f]);
    }
    for req in &mut reqs {
        // SAFETY: both requests are posted and not completed (no more messages come): cancel
        // each, then wait for the cancellation, after which MPI no longer touches `landing`.
        unsafe {
            ffi::MPI_Cancel(req);
            ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE);
        }
    }
    median(times)
}

/// Seconds on the wall clock, which every process of the host shares.
fn mono() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn chain_edge(ranks: &Ranks, n: usize, runs: usize, breakdown: bool) -> (f64, Vec<String>) {
    // With the breakdown, each body stamps its start and end (the runtime stamps the rest).
    let bodies: Arc<Vec<[AtomicU64; 2]>> = Arc::new(
        (0..if breakdown { n } else { 0 })
            .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
            .collect(),
    );
    let stamp = move |b: &[[AtomicU64; 2]], i: usize, end: bool| {
        if let Some(cell) = b.get(i) {
            cell[usize::from(end)].store(monotonic_ns(), Ordering::Relaxed);
        }
    };
    let mut g = RankGraphBuilder::new("edge chain");
    let b0 = bodies.clone();
    let mut prev = g.plain_node(0, "c0", move |_| {
        stamp(&b0, 0, false);
        stamp(&b0, 0, true);
        Ok(0u64)
    });
    for i in 1..n {
        let p = prev;
        let b = bodies.clone();
        let node = g.plain_node(i % 2, format!("c{i}"), move |ctx| {
            stamp(&b, i, false);
            let v = *ctx.input(p)? + 1;
            stamp(&b, i, true);
            Ok(v)
        });
        g.edge(prev, node);
        prev = node;
    }
    let graph = g.build(ranks).unwrap();
    // Rank 1's stamps go to rank 0 through a graph of their own, after each run.
    let mine = Arc::new(Mutex::new(Vec::<u64>::new()));
    let mut report = RankGraphBuilder::new("edge stamps");
    let m1 = mine.clone();
    let from1 = report.plain_node(1, "stamps of 1", move |_| Ok(m1.lock().unwrap().clone()));
    let at0 = report.plain_node(0, "at 0", move |ctx| Ok(ctx.input(from1)?.len() as u64));
    report.edge(from1, at0);
    let report = report.build(ranks).unwrap();
    let mut times = Vec::new();
    let mut hops = Hops::default();
    for rep in 0..runs + 1 {
        let t = Instant::now();
        let out = ranks.run(&graph).unwrap();
        if let Some(v) = out.get(prev) {
            assert_eq!(*v, n as u64 - 1);
        }
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64() / (n - 1) as f64);
        }
        if !breakdown {
            continue;
        }
        let stamps = out.edge_stamps().expect("built with stamp_edges");
        let local = EdgeRow::collect(&bodies, &stamps, n);
        *mine.lock().unwrap() = local.clone();
        let out = ranks.run(&report).unwrap();
        if let (Some(theirs), true) = (out.get(from1), rep > 0) {
            hops.add(&local, theirs, n);
        }
    }
    (median(times), hops.rows())
}

/// Per chain node `i` (as producer of edge `i -> i+1`): its body's start and end, its send's
/// hops (on its rank) and its value's receive hops (on the other), as [`EdgeRow`]'s columns;
/// each rank fills what it saw, 0 elsewhere.
struct EdgeRow;

impl EdgeRow {
    const START: usize = 0;
    const END: usize = 1;
    const BODY: usize = 2;
    const QUEUED: usize = 3;
    const TAKEN: usize = 4;
    const POSTED: usize = 5;
    const DONE: usize = 6;
    const ARRIVED: usize = 7;
    const RECEIVED: usize = 8;
    const COMPLETING: usize = 9;
    const COMPLETED: usize = 10;
    /// 1 where a spinning worker took the value (`RecvStamps::by_worker`).
    const BY_WORKER: usize = 11;
    const WIDTH: usize = 12;

    fn collect(bodies: &[[AtomicU64; 2]], stamps: &EdgeStamps, n: usize) -> Vec<u64> {
        let mut v = vec![0u64; n * Self::WIDTH];
        for (i, b) in bodies.iter().enumerate() {
            v[i * Self::WIDTH + Self::START] = b[0].load(Ordering::Relaxed);
            v[i * Self::WIDTH + Self::END] = b[1].load(Ordering::Relaxed);
        }
        for s in &stamps.sends {
            let r = &mut v[s.producer as usize * Self::WIDTH..][..Self::WIDTH];
            r[Self::BODY] = s.body;
            r[Self::QUEUED] = s.queued;
            r[Self::TAKEN] = s.taken;
            r[Self::POSTED] = s.posted;
            r[Self::DONE] = s.done;
        }
        for s in &stamps.recvs {
            let r = &mut v[s.producer as usize * Self::WIDTH..][..Self::WIDTH];
            r[Self::ARRIVED] = s.arrived;
            r[Self::RECEIVED] = s.received;
            r[Self::COMPLETING] = s.completing;
            r[Self::COMPLETED] = s.completed;
            r[Self::BY_WORKER] = u64::from(s.by_worker);
        }
        v
    }
}

/// The hops of every edge of the timed runs, in µs; the receives seen, and how many of them a
/// spinning worker took.
#[derive(Default)]
struct Hops(Vec<Vec<f64>>, usize, usize);

/// The breakdown's rows: (name, from column, from the next node's row?, to column, to the next
/// node's row?). "Next" is the consumer (node `i + 1`).
const HOPS: [(&str, usize, bool, usize, bool); 11] = [
    (
        "producer body end -> send node body start",
        EdgeRow::END,
        false,
        EdgeRow::BODY,
        false,
    ),
    (
        "send node body -> handed to the comm thread",
        EdgeRow::BODY,
        false,
        EdgeRow::QUEUED,
        false,
    ),
    (
        "handed -> comm thread took it",
        EdgeRow::QUEUED,
        false,
        EdgeRow::TAKEN,
        false,
    ),
    (
        "comm thread took it -> send posted",
        EdgeRow::TAKEN,
        false,
        EdgeRow::POSTED,
        false,
    ),
    (
        "send node body -> send posted (whoever posts)",
        EdgeRow::BODY,
        false,
        EdgeRow::POSTED,
        false,
    ),
    (
        "send posted -> arrival seen (other rank)",
        EdgeRow::POSTED,
        false,
        EdgeRow::ARRIVED,
        false,
    ),
    (
        "arrival seen -> all bytes in",
        EdgeRow::ARRIVED,
        false,
        EdgeRow::RECEIVED,
        false,
    ),
    (
        "all bytes in -> Completer::complete called",
        EdgeRow::RECEIVED,
        false,
        EdgeRow::COMPLETING,
        false,
    ),
    (
        "Completer::complete (its call's length)",
        EdgeRow::COMPLETING,
        false,
        EdgeRow::COMPLETED,
        false,
    ),
    (
        "Completer::complete -> consumer body start",
        EdgeRow::COMPLETING,
        false,
        EdgeRow::START,
        true,
    ),
    (
        "(off the path) send posted -> its completion seen",
        EdgeRow::POSTED,
        false,
        EdgeRow::DONE,
        false,
    ),
];

impl Hops {
    fn add(&mut self, a: &[u64], b: &[u64], n: usize) {
        if self.0.is_empty() {
            self.0 = vec![Vec::new(); HOPS.len() + 1];
        }
        let w = EdgeRow::WIDTH;
        let at = |i: usize, c: usize| a[i * w + c] | b[i * w + c];
        for i in 0..n - 1 {
            if at(i, EdgeRow::ARRIVED) != 0 {
                self.1 += 1;
                self.2 += usize::from(at(i, EdgeRow::BY_WORKER) != 0);
            }
            for (h, &(_, c0, next0, c1, next1)) in HOPS.iter().enumerate() {
                let (x, y) = (
                    at(i + usize::from(next0), c0),
                    at(i + usize::from(next1), c1),
                );
                if x != 0 && y != 0 {
                    self.0[h].push((y as f64 - x as f64) / 1e3);
                }
            }
            let (x, y) = (at(i, EdgeRow::END), at(i + 1, EdgeRow::START));
            if x != 0 && y != 0 {
                self.0[HOPS.len()].push((y as f64 - x as f64) / 1e3);
            }
        }
    }

    fn rows(&self) -> Vec<String> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let mut rows = vec![
            "| hop (8-byte edge, every edge of the timed runs) | median µs | p90 µs | mean µs | edges |".to_string(),
            "| --- | --- | --- | --- | --- |".to_string(),
        ];
        let names = HOPS
            .iter()
            .map(|h| h.0)
            .chain(["producer body end -> consumer body start (the edge)"]);
        for (name, v) in names.zip(&self.0) {
            if v.is_empty() {
                rows.push(format!("| {name} | | | | 0 |"));
            } else {
                rows.push(format!(
                    "| {name} | {:.2} | {:.2} | {:.2} | {} |",
                    median(v),
                    percentile(v, 0.9),
                    v.iter().sum::<f64>() / v.len() as f64,
                    v.len()
                ));
            }
        }
        rows.push(format!(
            "receives taken by a spinning worker (`RanksBuilder::worker_polls`): {} of {}",
            self.2, self.1
        ));
        rows
    }
}

/// GB/s from rank 0's producer end to rank 1's consumer start (on rank 1; 0 elsewhere), and
/// how many of rank 1's values landed in recycled memory.
fn big_value(ranks: &Ranks, big: usize, runs: usize) -> (f64, u64) {
    let sent_at = Arc::new(Mutex::new(0f64));
    let got_at = Arc::new(Mutex::new(0f64));
    let mut g = RankGraphBuilder::new("big value");
    let s = sent_at.clone();
    let a = g.plain_node(0, "make", move |_| {
        let v = vec![1u8; big];
        *s.lock().unwrap() = mono();
        Ok(v)
    });
    let r = got_at.clone();
    let b = g.plain_node(1, "read", move |ctx| {
        *r.lock().unwrap() = mono();
        Ok(ctx.input(a)?.len() as u64)
    });
    g.edge(a, b);
    let graph = g.build(ranks).unwrap();
    let mut times = Vec::new();
    for rep in 0..runs + 1 {
        ranks.run(&graph).unwrap();
        // Rank 0's send time and rank 1's arrival, through a tiny second graph.
        let mut t = RankGraphBuilder::new("times");
        let s = sent_at.clone();
        let t0 = t.plain_node(0, "t0", move |_| Ok(*s.lock().unwrap()));
        let r = got_at.clone();
        let t1 = t.plain_node(1, "t1", move |ctx| Ok(*r.lock().unwrap() - ctx.input(t0)?));
        t.edge(t0, t1);
        let tg = t.build(ranks).unwrap();
        let out = ranks.run(&tg).unwrap();
        if let (Some(d), true) = (out.get(t1), rep > 0) {
            times.push(*d);
        }
    }
    let recycled = graph.recycled_landings();
    if ranks.rank() == 1 {
        (big as f64 / median(times) / 1e9, recycled)
    } else {
        (0.0, recycled)
    }
}

fn dag(ranks: &Ranks, n: usize, runs: usize) -> (f64, usize) {
    let p = ranks.size();
    let mut g = RankGraphBuilder::new("dag 100k");
    let mut refs = Vec::with_capacity(n);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |k: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % k as u64) as usize
    };
    let mut edges = Vec::new();
    for i in 0..n {
        let rank = (i / 256) % p;
        let preds: Vec<usize> = if i == 0 {
            vec![]
        } else {
            let lo = i.saturating_sub(512);
            let mut v = vec![lo + rnd(i - lo), lo + rnd(i - lo)];
            v.dedup();
            v
        };
        let inputs: Vec<_> = preds.iter().map(|&q| refs[q]).collect();
        let node = g.plain_node(rank, format!("d{i}"), move |ctx| {
            let mut s = i as u64;
            for &r in &inputs {
                s = s.wrapping_add(*ctx.input(r)?);
            }
            Ok(s)
        });
        for &q in &preds {
            edges.push((q, i));
        }
        refs.push(node);
    }
    for &(a, b) in &edges {
        g.edge(refs[a], refs[b]);
    }
    g.runs_in_flight(1);
    let graph = g.build(ranks).unwrap();
    let transfers = graph.lowering().transfers.len();
    let mut times = Vec::new();
    for rep in 0..runs + 1 {
        let t = Instant::now();
        ranks.run(&graph).unwrap();
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        }
    }
    (median(times), transfers)
}

/// The bench's flags.
#[derive(clap::Parser, Debug)]
struct Args {
    /// Workers per rank.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Round trips of the 8-byte edge's ping-pong chain.
    #[arg(long, default_value_t = 2000)]
    chain: usize,
    /// Nodes of the random DAG.
    #[arg(long, default_value_t = 100_000)]
    dag: usize,
    /// Timed runs of each measure.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Skip the 8-byte edge.
    #[arg(long)]
    no_edge: bool,
    /// Skip the 64 MiB value.
    #[arg(long)]
    no_big: bool,
    /// The communication thread's spin before it yields, in µs (default: the runtime's
    /// choice, 100 where every thread has a core, else 0).
    #[arg(long)]
    comm_spin_us: Option<u64>,
    /// The workers' spin before they park, in µs (default: the runtime's choice).
    #[arg(long)]
    idle_spin_us: Option<u64>,
    /// Stamp every hop of the 8-byte edge (`RanksBuilder::stamp_edges`, a few clock reads an
    /// edge) and print the median of each: where the edge's time goes.
    #[arg(long)]
    edge_breakdown: bool,
    /// Workers hand every send to the communication thread (`RanksBuilder::worker_sends`
    /// off): the path before workers posted small sends themselves.
    #[arg(long)]
    no_worker_sends: bool,
    /// Workers never look at the network (`RanksBuilder::worker_polls` off): only the
    /// communication thread takes arrivals.
    #[arg(long)]
    no_worker_polls: bool,
    /// Small values are probed and received as the rest (`RanksBuilder::posted_receives`
    /// off): the path before the posted lane.
    #[arg(long)]
    no_posted_receives: bool,
    /// The runtime's `send_window` (default: the runtime's).
    #[arg(long)]
    send_window: Option<usize>,
    /// The runtime's `max_message_bytes`: a value this large or larger goes as a header and
    /// chunks (default: the runtime's).
    #[arg(long)]
    max_message_bytes: Option<usize>,
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    let (workers, chain, dag_n, runs) = (a.workers, a.chain, a.dag, a.runs);
    let edge = !a.no_edge;
    let big = if a.no_big { 0 } else { 64 << 20 };
    let before = threads();
    let raw = Arc::new(Mutex::new(Raw::default()));
    let raw_here = raw.clone();
    let mut builder = RanksBuilder::new()
        .workers(workers)
        .stamp_edges(a.edge_breakdown)
        .worker_sends(!a.no_worker_sends)
        .worker_polls(!a.no_worker_polls)
        .posted_receives(!a.no_posted_receives);
    if let Some(n) = a.send_window {
        builder = builder.send_window(n);
    }
    if let Some(us) = a.comm_spin_us {
        builder = builder.comm_spin(Duration::from_micros(us));
    }
    if let Some(n) = a.max_message_bytes {
        builder = builder.max_message_bytes(n);
    }
    if let Some(us) = a.idle_spin_us {
        builder = builder.idle_spin(Duration::from_micros(us));
    }
    let ranks = builder
        .build_with(move || {
            let t = MpiTransport::init()?;
            use boundpool_ranks::Transport;
            *raw_here.lock().unwrap() = raw_baselines(t.rank(), t.size(), big, edge);
            Ok(t)
        })
        .unwrap();
    let raw = std::mem::take(&mut *raw.lock().unwrap());
    let (size, rank) = (ranks.size(), ranks.rank());
    println!("placement rank {rank}: {}", ranks.placement());
    let mut rows = Vec::new();
    let mut breakdown = Vec::new();
    if size >= 2 && edge {
        let (ours, hops) = chain_edge(&ranks, chain, runs, a.edge_breakdown);
        breakdown = hops;
        rows.push(format!(
            "| 8-byte cross-rank edge (chain of {chain}) | {:.2} µs | raw MPI half round trip {:.2} µs | {:.1}× |",
            ours * 1e6,
            raw.half_rtt_8b * 1e6,
            ours / raw.half_rtt_8b
        ));
        rows.push(format!(
            "| (floor) the same ping-pong through the runtime's non-blocking calls, one thread | | raw MPI {:.2} µs | {:.2}× raw |",
            raw.half_rtt_8b_nonblocking * 1e6,
            raw.half_rtt_8b_nonblocking / raw.half_rtt_8b
        ));
        rows.push(format!(
            "| (floor) the same with the receives posted ahead, no probe, one thread | | raw MPI {:.2} µs | {:.2}× raw |",
            raw.half_rtt_8b_posted * 1e6,
            raw.half_rtt_8b_posted / raw.half_rtt_8b
        ));
    }
    if size >= 2 && big > 0 {
        let (gbps, recycled) = big_value(&ranks, big, runs);
        if rank == 1 {
            println!(
                "rank 1: {recycled} of {} 64 MiB values landed in recycled memory",
                runs + 1
            );
        }
        // Rank 1 measured; tell rank 0 through a graph.
        let mut t = RankGraphBuilder::new("report");
        let v = t.plain_node(1, "gbps", move |_| Ok(gbps));
        let r0 = t.plain_node(0, "at 0", move |ctx| Ok(*ctx.input(v)?));
        t.edge(v, r0);
        let out = ranks.run(&t.build(&ranks).unwrap()).unwrap();
        if rank == 0 {
            let g = *out.get(r0).unwrap();
            rows.push(format!(
                "| 64 MiB value, producer end → consumer start | {g:.2} GB/s | raw MPI {:.2} GB/s hot buffer, {:.2} GB/s fresh buffer | {:.2}× / {:.2}× |",
                raw.big_hot, raw.big_fresh, g / raw.big_hot, g / raw.big_fresh
            ));
        }
    }
    if dag_n > 0 {
        let (ns, transfers) = dag(&ranks, dag_n, runs.min(3));
        rows.push(format!(
            "| {dag_n}-node random DAG on {size} rank(s), {workers} worker(s) each | {ns:.0} ns/node | {transfers} transfers | |"
        ));
    }
    let peak = threads();
    // In the transport's start (the pool and the comm thread were up): main + workers + comm +
    // what MPI started.
    let mpi = raw.threads_after_init.saturating_sub(before + workers + 1);
    rows.push(format!(
        "| OS threads per rank | {peak} at peak | main {before} + {workers} worker(s) + 1 communication thread + {mpi} started by MPI_Init | |"
    ));
    if rank == 0 {
        println!("| measure ({size} ranks) | boundpool-ranks | baseline, same run | ratio |");
        println!("| --- | --- | --- | --- |");
        for r in rows {
            println!("{r}");
        }
        if !breakdown.is_empty() {
            println!();
            for r in breakdown {
                println!("{r}");
            }
        }
    }
}
