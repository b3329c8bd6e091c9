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
//! `mpirun -np P target/release/deps/ranks-* [--workers W] [--chain N] [--dag N] [--runs R]
//! [--no-edge] [--no-big] [--comm-spin-us U] [--idle-spin-us U]` (P = 1, 2, 4; `cargo bench
//! -p boundpool-bench --features mpi --bench ranks --no-run` builds it). Rank 0 prints
//! markdown rows.

use std::ffi::{c_int, c_void};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_ranks::{MpiTransport, RankGraphBuilder, Ranks, RanksBuilder};
use boundpool_workloads::median;
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

/// Seconds on the wall clock, which every process of the host shares.
fn mono() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn chain_edge(ranks: &Ranks, n: usize, runs: usize) -> f64 {
    let mut g = RankGraphBuilder::new("edge chain");
    let mut prev = g.plain_node(0, "c0", |_| Ok(0u64));
    for i in 1..n {
        let p = prev;
        let node = g.plain_node(i % 2, format!("c{i}"), move |ctx| Ok(ctx.input(p)? + 1));
        g.edge(prev, node);
        prev = node;
    }
    let graph = g.build(ranks).unwrap();
    let mut times = Vec::new();
    for rep in 0..runs + 1 {
        let t = Instant::now();
        let out = ranks.run(&graph).unwrap();
        if let Some(v) = out.get(prev) {
            assert_eq!(*v, n as u64 - 1);
        }
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64() / (n - 1) as f64);
        }
    }
    median(times)
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
    let mut builder = RanksBuilder::new().workers(workers);
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
    if size >= 2 && edge {
        let ours = chain_edge(&ranks, chain, runs);
        rows.push(format!(
            "| 8-byte cross-rank edge (chain of {chain}) | {:.2} µs | raw MPI half round trip {:.2} µs | {:.1}× |",
            ours * 1e6,
            raw.half_rtt_8b * 1e6,
            ours / raw.half_rtt_8b
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
    }
}
