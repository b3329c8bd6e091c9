//! Device buffers and NCCL between ranks, under `mpirun` (the device script
//! `benches/device/ranks_gpu_call.sh` runs it; every rank takes a GPU by its local rank, two
//! ranks share a one-GPU machine's):
//!
//! * `values`: a ring of device values (rank `r` sends buffers of 1, 1000 and 3 Mi + 5 `f32`s
//!   to rank `r + 1`, which scales them by 3 and sends them back), staged through page-locked
//!   host memory, each rank checking its round trips against the host, three runs.
//! * `values nccl`: the same over NCCL (`ncclSend`/`ncclRecv`).
//! * `collectives`: NCCL all-reduce, broadcast, all-gather and reduce-scatter as GPU nodes, and
//!   a device value over NCCL, each rank's results against the host.
//!
//! NCCL modes need libnccl and, with two ranks on one GPU, a distinct `NCCL_HOSTID` per rank
//! (`mpirun -np 2 bash -c 'NCCL_HOSTID=h$OMPI_COMM_WORLD_RANK exec ranks_gpu collectives'`).
//! Prints one line per rank; exits non-zero on any mismatch. Without a GPU it says so and exits
//! 0 (1 under `BOUNDPOOL_REQUIRE_GPU=1`).

use boundpool_gpu::{builtin, Devices, GpuPoolBuilder, LaunchConfig, Module, ReduceOp};
use boundpool_ranks::{Collective, GpuRanks, GpuRanksBuilder, RankGraphBuilder, RanksBuilder};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) >> 12) as f32)
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("values");
    let nccl = mode == "collectives" || args.get(1).map(String::as_str) == Some("nccl");
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        eprintln!("SKIPPED ranks_gpu {mode}: no GPU: {why}");
        let required = std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1");
        std::process::exit(i32::from(required));
    }
    let ranks = GpuRanksBuilder::new(
        RanksBuilder::new(),
        GpuPoolBuilder::new()
            .devices(Devices::All)
            .workers_per_device(2),
    )
    .device_by_local_rank(true)
    .nccl(nccl)
    .build_mpi()
    .expect("the GPU ranks runtime starts");
    let res = match mode {
        "values" => ring(&ranks, nccl),
        "collectives" => collectives(&ranks),
        other => Err(format!("unknown mode {other}")),
    };
    match res {
        Ok(line) => println!("rank {}/{}: {line}", ranks.rank(), ranks.size()),
        Err(e) => {
            eprintln!("rank {}/{}: FAILED: {e}", ranks.rank(), ranks.size());
            drop(ranks);
            std::process::exit(1);
        }
    }
}

fn ring(ranks: &GpuRanks, nccl: bool) -> Result<String, String> {
    let (me, size) = (ranks.rank(), ranks.size());
    let d = ranks.devices()[0].clone();
    let scale = Module::builtin()
        .kernel(builtin::SCALE_F32)
        .map_err(|e| e.to_string())?;
    let sizes = [1usize, 1000, (3 << 20) + 5];
    let mut g = RankGraphBuilder::new("device ring");
    g.staging_chunk_bytes(1 << 20);
    let mut backs = Vec::new();
    for r in 0..size {
        let next = (r + 1) % size;
        for &n in &sizes {
            let host = values(n, (r * 7 + n) as u32);
            let a = g.device_node(r, &d, format!("make {r}/{n}"), move |ctx| {
                Ok(ctx.gpu().upload(&host)?)
            });
            let k = scale.clone();
            let b = g.device_node(next, &d, format!("triple {r}/{n}"), move |ctx| {
                let x = ctx.input(a)?;
                let gpu = ctx.gpu();
                let mut y = gpu.alloc::<f32>(x.len())?;
                gpu.copy_device(x, &mut y)?;
                // SAFETY: bp_scale_f32(f32* x, f32 a, u32 n) over the whole buffer.
                unsafe {
                    gpu.launch(&k, LaunchConfig::for_elements(n))
                        .arg(&mut y)
                        .arg(3.0f32)
                        .arg(n as u32)
                        .launch()?;
                }
                Ok(y)
            });
            let c = g.gpu_node(r, &d, format!("back {r}/{n}"), move |ctx| {
                Ok(ctx.gpu().download(ctx.input(b)?)?)
            });
            g.edge(a, b).edge(b, c);
            if r == me {
                backs.push((n, c));
            }
        }
    }
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let transfers = graph.lowering().transfers.len();
    for run in 0..3 {
        let out = ranks.run(&graph).map_err(|e| format!("run {run}: {e}"))?;
        for &(n, c) in &backs {
            let want: Vec<f32> = values(n, (me * 7 + n) as u32)
                .iter()
                .map(|x| x * 3.0)
                .collect();
            if out.get(c) != Some(&want) {
                return Err(format!("run {run}: {n} values came back wrong"));
            }
        }
    }
    Ok(format!(
        "device values {} ok: {transfers} transfers, sizes {sizes:?} f32, 3 runs",
        if nccl { "over NCCL" } else { "staged" }
    ))
}

fn collectives(ranks: &GpuRanks) -> Result<String, String> {
    let (me, size) = (ranks.rank(), ranks.size());
    let d = ranks.nccl_device().ok_or("no NCCL communicator")?.clone();
    let n = 100_003usize;
    let mut g = RankGraphBuilder::new("collectives");
    let xs: Vec<_> = (0..size)
        .map(|r| {
            let host = values(n, r as u32);
            g.device_node(r, &d, format!("x{r}"), move |ctx| {
                Ok(ctx.gpu().upload(&host)?)
            })
        })
        .collect();
    let sum = g.all_reduce("sum", &d, &xs, ReduceOp::Sum);
    let root = size - 1;
    let bcast = g.broadcast("bcast", &d, &xs, root);
    let all = g.all_gather("gather", &d, &xs);
    let gathered: Vec<_> = (0..size).map(|r| all.on(r)).collect();
    let scattered = g.reduce_scatter("scatter", &d, &gathered, ReduceOp::Max);
    // Rank r's x to rank r + 1, over NCCL (a device value of the NCCL device).
    let prev = (me + size - 1) % size;
    let mut sent = Vec::new();
    for (r, &x) in xs.iter().enumerate() {
        let to = (r + 1) % size;
        let s = g.gpu_node(to, &d, format!("from {r}"), move |ctx| {
            Ok(ctx.gpu().download(ctx.input(x)?)?)
        });
        g.edge(x, s);
        sent.push(s);
    }
    // Each rank's member read back on its rank: every rank builds all of them (the graph must
    // be the same on every rank) and checks its own.
    let read = |g: &mut RankGraphBuilder<_>, name: &str, c: &Collective<f32>| {
        let backs: Vec<_> = (0..size)
            .map(|r| {
                let m = c.on(r);
                let back = g.gpu_node(r, &d, format!("{name} back on {r}"), move |ctx| {
                    Ok(ctx.gpu().download(ctx.input(m)?)?)
                });
                g.edge(m, back);
                back
            })
            .collect();
        backs[me]
    };
    let (s, b, a, r) = (
        read(&mut g, "sum", &sum),
        read(&mut g, "bcast", &bcast),
        read(&mut g, "gather", &all),
        read(&mut g, "scatter", &scattered),
    );
    let graph = g.build(ranks).map_err(|e| e.to_string())?;
    let order = graph.lowering().nccl_order.len();
    for run in 0..3 {
        let out = ranks.run(&graph).map_err(|e| format!("run {run}: {e}"))?;
        let want_sum: Vec<f32> = (0..n)
            .map(|i| (0..size).map(|r| values(n, r as u32)[i]).sum())
            .collect();
        let got = out.get(s).ok_or("no sum")?;
        let close = got
            .iter()
            .zip(&want_sum)
            .all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0));
        if !close {
            return Err(format!(
                "run {run}: the all-reduce differs from the host's sum"
            ));
        }
        if out.get(b) != Some(&values(n, root as u32)) {
            return Err(format!(
                "run {run}: the broadcast differs from rank {root}'s input"
            ));
        }
        let want_all: Vec<f32> = (0..size).flat_map(|r| values(n, r as u32)).collect();
        if out.get(a) != Some(&want_all) {
            return Err(format!("run {run}: the all-gather differs"));
        }
        if out.get(r) != Some(&values(n, me as u32)) {
            return Err(format!(
                "run {run}: the reduce-scatter differs from this rank's block"
            ));
        }
        // `sent[r]` runs on rank r + 1: this rank's is the one from `prev`.
        if out.get(sent[prev]) != Some(&values(n, prev as u32)) {
            return Err(format!(
                "run {run}: rank {prev}'s value came over NCCL wrong"
            ));
        }
    }
    Ok(format!(
        "NCCL all-reduce, broadcast, all-gather, reduce-scatter and send/receive equal to the \
         host, {order} NCCL operations in one order, {n} f32 each, 3 runs"
    ))
}
