//! GPU ranks bench (issue "Ranks", item 6, GPU half), run under `mpirun -np 2` on the device
//! machine (two ranks may share its GPU; each takes a device by its local rank):
//!
//! * **64 MiB device buffer, staged**: a 64 MiB `f32` device value from rank 0 to rank 1, the
//!   time from the producer's body (a device copy of a resident buffer) to the end of the
//!   consumer's GPU work on rank 1 (a host node after it, one host clock), as bandwidth;
//!   staged in 4 MiB chunks (copies overlapping the transfer) and in one 64 MiB chunk (no
//!   overlap; sent in 4 MiB messages all the same), against raw host MPI bandwidth (`MPI_Send`/`MPI_Recv` of 64 MiB between host
//!   buffers, hot, and into a fresh allocation) measured in the same processes on the
//!   communication thread before the runtime's engine started. Target: staged ≥ 0.7× raw hot.
//! * **the copies alone**: one rank's page-locked 64 MiB device-to-host plus host-to-device
//!   copies, as bandwidth (what staging adds to the wire).
//! * **raw MPI between page-locked buffers**: the same blocking transfer from and into memory of
//!   `alloc_pinned` (the staging path's memory), made from the main thread while the runtime
//!   runs (`MPI_THREAD_MULTIPLE`; the runtime's own communicator is a duplicate): whether the
//!   wire is slower from that memory than from ordinary memory.
//! * with `--nccl` (feature `nccl`): the same value over NCCL (`ncclSend`/`ncclRecv`; two ranks
//!   on one GPU need distinct `NCCL_HOSTID`s).
//! * **where the time goes**: the pool records its trace (worker slices and each GPU node's
//!   device time), and each run of the device value is cut into phases from both ranks' traces
//!   on the shared wall clock: producer start → the send-out node (the staging GPU node, or
//!   `ncclSend`), its host body (taking or allocating page-locked memory, enqueueing the
//!   copies), its device time (the device-to-host copies), from their end to the bring-in node's
//!   start on rank 1 (the wire's tail and the wake-up), its host body (the upload's enqueue, or
//!   for a value that landed in ordinary memory its copy and a page-locked allocation), its
//!   device time (the host-to-device copy), and on to the consumer. The first run (untimed)
//!   shows what a graph's first run allocates; the others its steady state. An NCCL node's
//!   device time is taken on its worker's stream, not the communicator's where the operation
//!   runs, so over NCCL the transfer shows in the last phase.
//!
//! `mpirun -np 2 target/release/deps/ranks_gpu-* [--runs R] [--mib M] [--nccl]`
//! (`cargo bench -p boundpool-bench --features mpi --bench ranks_gpu --no-run` builds it; with
//! `--features nccl` for `--nccl`). Rank 0 prints markdown rows; without a GPU it says so.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use boundpool_gpu::{DeviceBuffer, Devices, GpuDevice, GpuPoolBuilder, GpuWorker};
use boundpool_ranks::{GpuRanks, GpuRanksBuilder, MpiTransport, RankGraphBuilder, RanksBuilder};
use boundpool_workloads::median;
use mpi::ffi;

#[derive(clap::Parser, Debug)]
struct Args {
    /// Timed runs of each measure (after one untimed).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Size of the value, MiB.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Also over NCCL (needs the `nccl` feature).
    #[arg(long)]
    nccl: bool,
}

/// One blocking transfer of `big` bytes from rank 0's `from` to rank 1's `into` and a one-byte
/// acknowledgement back, on `MPI_COMM_WORLD` (seconds).
///
/// # Safety
/// `from` (rank 0) and `into` (rank 1) hold `big` bytes; only ranks 0 and 1 call it, together.
unsafe fn transfer(rank: usize, from: *const u8, into: *mut u8, big: usize) -> f64 {
    // SAFETY: constants rsmpi's C shim sets before main.
    let (world, bytes) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_UINT8_T) };
    let mut ack = [0u8; 1];
    let t = Instant::now();
    // SAFETY: the buffers hold the counts given (the caller's contract); blocking calls.
    unsafe {
        if rank == 0 {
            ffi::MPI_Send(from.cast::<c_void>(), big as c_int, bytes, 1, 7, world);
            let ack = ack.as_mut_ptr().cast::<c_void>();
            ffi::MPI_Recv(ack, 1, bytes, 1, 7, world, ffi::RSMPI_STATUS_IGNORE);
        } else {
            let into = into.cast::<c_void>();
            ffi::MPI_Recv(
                into,
                big as c_int,
                bytes,
                0,
                7,
                world,
                ffi::RSMPI_STATUS_IGNORE,
            );
            ffi::MPI_Send(ack.as_ptr().cast::<c_void>(), 1, bytes, 0, 7, world);
        }
    }
    t.elapsed().as_secs_f64()
}

/// Raw MPI bandwidth of `big` bytes from rank 0 to rank 1 (GB/s): hot buffers, and into a
/// fresh allocation each time (as a received value is). Blocking calls on `MPI_COMM_WORLD`.
fn raw_bandwidth(rank: usize, size: usize, big: usize) -> (f64, f64) {
    let mut out = (0.0, 0.0);
    if size >= 2 && rank < 2 {
        let mut a = vec![1u8; big];
        for fresh in [false, true] {
            let mut times = Vec::new();
            for rep in 0..6 {
                let mut v: Vec<u8> = Vec::new();
                let into = if fresh {
                    v.reserve_exact(big);
                    v.as_mut_ptr()
                } else {
                    a.as_mut_ptr()
                };
                // SAFETY: `a` and `v` hold `big` bytes; ranks 0 and 1 call it together.
                let dt = unsafe { transfer(rank, a.as_ptr(), into, big) };
                std::hint::black_box(&v);
                if rep > 0 {
                    times.push(dt);
                }
            }
            let gbps = big as f64 / median(times) / 1e9;
            if fresh {
                out.1 = gbps;
            } else {
                out.0 = gbps;
            }
        }
    }
    // SAFETY: every rank reaches this barrier once; constants rsmpi's C shim sets before main.
    unsafe { ffi::MPI_Barrier(ffi::RSMPI_COMM_WORLD) };
    out
}

/// Raw MPI bandwidth of `big` bytes from page-locked memory on rank 0 into page-locked memory
/// on rank 1 (GB/s; what the wire gives the staged path's memory), from this thread while the
/// runtime's communication thread polls its own communicator: needs `MPI_THREAD_MULTIPLE`
/// (`None` without it).
fn raw_pinned(ranks: &GpuRanks, d: &GpuDevice, multiple: bool, big: usize) -> Option<f64> {
    if !multiple || ranks.size() < 2 {
        return None;
    }
    let buf = ranks
        .call(d, move |ctx| Ok(ctx.alloc_pinned::<u8>(big)?))
        .unwrap();
    let rank = ranks.rank();
    let mut times = Vec::new();
    // SAFETY: every rank reaches this barrier (constants rsmpi's C shim sets before main).
    unsafe { ffi::MPI_Barrier(ffi::RSMPI_COMM_WORLD) };
    if rank < 2 {
        for rep in 0..6 {
            // SAFETY: `buf` holds `big` bytes, no device copy uses it; ranks 0 and 1 together.
            let dt = unsafe { transfer(rank, buf.host_ptr(), buf.host_ptr(), big) };
            if rep > 0 {
                times.push(dt);
            }
        }
    }
    // SAFETY: as above.
    unsafe { ffi::MPI_Barrier(ffi::RSMPI_COMM_WORLD) };
    (!times.is_empty()).then(|| big as f64 / median(times) / 1e9)
}

/// Seconds on the wall clock, which every process of the host shares.
fn mono() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Node names of the graph `device_value` builds, whose trace slices give the phases: the
/// producer, the node that sends its value out (stages it, or `ncclSend`), the one that brings
/// it in on rank 1 (uploads it, or `ncclRecv`), the consumer's host node.
struct Names {
    make: &'static str,
    out: &'static str,
    into: &'static str,
    done: &'static str,
}

fn names(nccl: bool) -> Names {
    Names {
        make: "make",
        out: if nccl {
            "ncclSend 'make' to rank 1"
        } else {
            "stage 'make' for rank 1"
        },
        into: if nccl {
            "ncclRecv receive 'make' from rank 0"
        } else {
            "upload receive 'make' from rank 0"
        },
        done: "done",
    }
}

/// Per run of graph `graph`, the wall-clock times (seconds) of `slots` node slices in this
/// rank's trace: `(node name, device span or host slice, start or end)`. NaN where the trace
/// lacks one. Runs are the slices of each name in start order.
fn times_of(
    trace: &boundpool_scheduler::Trace,
    graph: &str,
    slots: &[(&str, bool, bool)],
    runs: usize,
) -> Vec<f64> {
    // The trace's clock is an `Instant` from the pool's build; every rank of the host shares
    // the wall clock, so its times are moved there.
    let epoch_wall = mono() - trace.epoch.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(runs * slots.len());
    let mut lists: Vec<Vec<(u64, u64)>> = Vec::new();
    for &(name, device, _) in slots {
        let mut l: Vec<(u64, u64)> = trace
            .slices
            .iter()
            .filter(|s| s.graph == graph && s.name == name)
            .filter(|s| device == (s.kind == boundpool_scheduler::SliceKind::Span))
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        l.sort_unstable();
        lists.push(l);
    }
    for run in 0..runs {
        for (l, &(_, _, end)) in lists.iter().zip(slots) {
            out.push(l.get(run).map_or(f64::NAN, |&(a, b)| {
                epoch_wall + (if end { b } else { a }) as f64 * 1e-9
            }));
        }
    }
    out
}

/// Where a device value's time goes, per run: the phases from the two ranks' traces.
struct Phases {
    /// Per run: total, then each phase (seconds).
    runs: Vec<Vec<f64>>,
}

const PHASES: [&str; 8] = [
    "total, producer start → consumer done",
    "producer start → send-out start (r0)",
    "send-out host body (r0: staging memory, enqueue)",
    "send-out on the device (r0: D2H, or ncclSend)",
    "send-out device end → bring-in start (r1: wire tail)",
    "bring-in host body (r1: enqueue; pageable: copy + alloc)",
    "bring-in on the device (r1: H2D, or ncclRecv)",
    "bring-in device end → consumer done (r1)",
];

/// Rank 0's and rank 1's slices of `graph` over `runs` runs, as phases (on rank 0; empty
/// elsewhere). Rank 1's times go to rank 0 through a small graph.
fn phases(ranks: &GpuRanks, graph: &str, nccl: bool, runs: usize) -> Phases {
    // Resolved GPU slices: idle workers resolve their device's timing events.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let trace = ranks.pool().take_trace();
    let n = names(nccl);
    let mine = if ranks.rank() == 0 {
        times_of(
            &trace,
            graph,
            &[
                (n.make, false, false),
                (n.out, false, false),
                (n.out, false, true),
                (n.out, true, false),
                (n.out, true, true),
            ],
            runs,
        )
    } else {
        times_of(
            &trace,
            graph,
            &[
                (n.into, false, false),
                (n.into, false, true),
                (n.into, true, false),
                (n.into, true, true),
                (n.done, false, false),
            ],
            runs,
        )
    };
    let mut t = RankGraphBuilder::<GpuWorker>::new(format!("phases of {graph}"));
    let theirs = mine.clone();
    let v = t.plain_node(1, "rank 1's times", move |_| Ok(theirs.clone()));
    let r0 = t.plain_node(0, "at 0", move |ctx| Ok(ctx.input(v)?.clone()));
    t.edge(v, r0);
    let out = ranks.run(&t.build(ranks).unwrap()).unwrap();
    let Some(one) = out.get(r0) else {
        return Phases { runs: Vec::new() };
    };
    let runs = (0..runs)
        .map(|r| {
            let z = &mine[r * 5..r * 5 + 5];
            let o = &one[r * 5..r * 5 + 5];
            let (make, out_h0, out_h1, out_d0, out_d1) = (z[0], z[1], z[2], z[3], z[4]);
            let (in_h0, in_h1, in_d0, in_d1, done) = (o[0], o[1], o[2], o[3], o[4]);
            vec![
                done - make,
                out_h0 - make,
                out_h1 - out_h0,
                out_d1 - out_d0,
                in_h0 - out_d1,
                in_h1 - in_h0,
                in_d1 - in_d0,
                done - in_d1,
            ]
        })
        .collect();
    Phases { runs }
}

/// ms, or a dash for a time the trace lacked.
fn ms(x: f64) -> String {
    if x.is_finite() {
        format!("{:.2}", x * 1e3)
    } else {
        "—".into()
    }
}

/// Markdown rows: each phase's first run (untimed, allocating) and median of the others.
fn phase_rows(label: &str, p: &Phases) -> Vec<String> {
    let Some((first, rest)) = p.runs.split_first() else {
        return Vec::new();
    };
    PHASES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut xs: Vec<f64> = rest
                .iter()
                .map(|r| r[i])
                .filter(|x| x.is_finite())
                .collect();
            xs.sort_by(f64::total_cmp);
            let med = if xs.is_empty() {
                f64::NAN
            } else {
                xs[xs.len() / 2]
            };
            let each: Vec<String> = rest.iter().map(|r| ms(r[i])).collect();
            format!(
                "| {label}: {name} | {} | {} | {} |",
                ms(first[i]),
                ms(med),
                each.join(" ")
            )
        })
        .collect()
}

/// GB/s of a device value of `src`'s size from rank 0 to rank 1, staged in `chunk` bytes (or
/// over NCCL when the device has a communicator), median of `runs`; rank 1's figure, told to
/// rank 0. Also the phases of every run (one untimed first), on rank 0.
fn device_value(
    ranks: &GpuRanks,
    d: &GpuDevice,
    src: &Arc<DeviceBuffer<f32>>,
    chunk: usize,
    runs: usize,
) -> (f64, Phases) {
    let sent_at = Arc::new(Mutex::new(0f64));
    let got_at = Arc::new(Mutex::new(0f64));
    let name = format!("device value, chunk {chunk}");
    let n = names(d.nccl().is_some());
    // The trace so far is not this graph's.
    let _ = ranks.pool().take_trace();
    let mut g = RankGraphBuilder::<GpuWorker>::new(name.clone());
    g.staging_chunk_bytes(chunk);
    let (s, from) = (sent_at.clone(), src.clone());
    let a = g.device_node(0, d, n.make, move |ctx| {
        *s.lock().unwrap() = mono();
        let gpu = ctx.gpu();
        let mut y = gpu.alloc::<f32>(from.len())?;
        gpu.copy_device(&from, &mut y)?;
        Ok(y)
    });
    let b = g.gpu_node(1, d, "consume", move |ctx| Ok(ctx.input(a)?.len()));
    let r = got_at.clone();
    let c = g.node(1, n.done, move |ctx| {
        *r.lock().unwrap() = mono();
        Ok(*ctx.input(b)?)
    });
    g.edge(a, b).edge(b, c);
    let graph = g.build(ranks).unwrap();
    let bytes = src.bytes() as f64;
    let mut times = Vec::new();
    for rep in 0..runs + 1 {
        ranks.run(&graph).unwrap();
        // Rank 0's start and rank 1's end, through a tiny second graph.
        let mut t = RankGraphBuilder::<GpuWorker>::new("times");
        let s = sent_at.clone();
        let t0 = t.plain_node(0, "t0", move |_| Ok(*s.lock().unwrap()));
        let r = got_at.clone();
        let t1 = t.plain_node(1, "t1", move |ctx| Ok(*r.lock().unwrap() - ctx.input(t0)?));
        t.edge(t0, t1);
        let out = ranks.run(&t.build(ranks).unwrap()).unwrap();
        if let (Some(dt), true) = (out.get(t1), rep > 0) {
            times.push(*dt);
        }
    }
    let gbps = if ranks.rank() == 1 {
        bytes / median(times) / 1e9
    } else {
        0.0
    };
    // Rank 1 measured; tell rank 0.
    let mut t = RankGraphBuilder::<GpuWorker>::new("report");
    let v = t.plain_node(1, "gbps", move |_| Ok(gbps));
    let r0 = t.plain_node(0, "at 0", move |ctx| Ok(*ctx.input(v)?));
    t.edge(v, r0);
    let out = ranks.run(&t.build(ranks).unwrap()).unwrap();
    let gbps = out.get(r0).copied().unwrap_or(gbps);
    (gbps, phases(ranks, &name, d.nccl().is_some(), runs + 1))
}

/// GB/s of one rank's page-locked device-to-host plus host-to-device copy of `src`.
fn copies_alone(ranks: &GpuRanks, d: &GpuDevice, src: &Arc<DeviceBuffer<f32>>, runs: usize) -> f64 {
    let from = src.clone();
    let pinned = Arc::new(
        ranks
            .call(d, move |ctx| Ok(ctx.alloc_pinned::<f32>(from.len())?))
            .unwrap(),
    );
    let mut times = Vec::new();
    for rep in 0..runs + 1 {
        let (from, p) = (src.clone(), pinned.clone());
        let t = Instant::now();
        ranks
            .call(d, move |ctx| {
                let mut back = ctx.alloc::<f32>(from.len())?;
                ctx.copy_to_pinned(&from, &p)?;
                ctx.copy_from_pinned(&p, &back)?;
                ctx.memset_zero(&mut back)?;
                Ok(())
            })
            .unwrap();
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    src.bytes() as f64 / median(times) / 1e9
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    #[cfg(not(feature = "nccl"))]
    if a.nccl {
        eprintln!("--nccl needs the nccl feature");
        std::process::exit(1);
    }
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        eprintln!("SKIPPED ranks_gpu bench: no GPU: {why}");
        return;
    }
    let big = a.mib << 20;
    let raw = Arc::new(Mutex::new((0.0, 0.0, false)));
    let raw_here = raw.clone();
    let builder = GpuRanksBuilder::new(
        RanksBuilder::new(),
        GpuPoolBuilder::new()
            .devices(Devices::All)
            .workers_per_device(2)
            .trace(true),
    )
    .device_by_local_rank(true);
    #[cfg(feature = "nccl")]
    let builder = builder.nccl(a.nccl);
    let ranks = builder
        .build_with(move || {
            let t = MpiTransport::init()?;
            use boundpool_ranks::Transport;
            let (hot, fresh) = raw_bandwidth(t.rank(), t.size(), big);
            let multiple = t.threading() == mpi::Threading::Multiple;
            *raw_here.lock().unwrap() = (hot, fresh, multiple);
            Ok(t)
        })
        .expect("the GPU ranks runtime starts");
    let (hot, fresh, multiple) = *raw.lock().unwrap();
    let (rank, size) = (ranks.rank(), ranks.size());
    let d = ranks.devices()[0].clone();
    let n = big / 4;
    let src = Arc::new(
        ranks
            .call(&d, move |ctx| Ok(ctx.alloc_zeros::<f32>(n)?))
            .unwrap(),
    );
    let mut rows = Vec::new();
    let mut phase_table = Vec::new();
    let copies = copies_alone(&ranks, &d, &src, a.runs);
    rows.push(format!(
        "| {} MiB page-locked D2H + H2D on one rank | {copies:.2} GB/s | | |",
        a.mib
    ));
    if let Some(gbps) = raw_pinned(&ranks, &d, multiple, big) {
        rows.push(format!(
            "| raw MPI, {} MiB page-locked → page-locked (staging's memory) | {gbps:.2} GB/s | raw MPI {hot:.2} GB/s hot | {:.2}× |",
            a.mib,
            gbps / hot
        ));
    }
    if size >= 2 {
        let wire = if d.nccl().is_some() {
            "over NCCL"
        } else {
            "staged"
        };
        for chunk in [4 << 20, big] {
            let (gbps, phases) = device_value(&ranks, &d, &src, chunk, a.runs);
            phase_table.extend(phase_rows(&format!("{wire} {} MiB", chunk >> 20), &phases));
            rows.push(format!(
                "| {} MiB device buffer {wire}, {} MiB chunks, producer start → consumer's GPU \
                 work done | {gbps:.2} GB/s | raw MPI {hot:.2} GB/s hot, {fresh:.2} GB/s fresh \
                 | {:.2}× / {:.2}× |",
                a.mib,
                chunk >> 20,
                gbps / hot,
                gbps / fresh
            ));
            if d.nccl().is_some() {
                break; // the chunk size only matters staged
            }
        }
    }
    if rank == 0 {
        println!(
            "| measure ({size} ranks, device {}) | boundpool-ranks | baseline, same run | ratio |",
            d.info().name
        );
        println!("| --- | --- | --- | --- |");
        for r in rows {
            println!("{r}");
        }
        if !phase_table.is_empty() {
            println!();
            println!(
                "| phase, ms (both ranks' traces, wall clock) | first run (untimed) | median of the timed | each timed run |"
            );
            println!("| --- | --- | --- | --- |");
            for r in phase_table {
                println!("{r}");
            }
        }
    }
}
