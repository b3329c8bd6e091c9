//! A GPU pipeline as a graph: for each vector of a batch, upload → scale → reduce → download,
//! the numbers checked on the host. Consecutive stages are placed on different worker groups
//! of the device: an edge from a node with one GPU successor hands its stream over (scale →
//! reduce → download enqueue on one stream, whichever worker runs them), the others are
//! device-side event waits between streams (upload → scale, upload → reduce).
//!
//! On a machine without a GPU it runs the same pipeline on host workers and says so.
//!
//! `cargo run --release --example gpu_pipeline [-- vectors length] [--trace FILE.json]`
//!
//! With `--trace`, the pool records a timeline (a track per worker, and on a GPU a track per
//! stream with each node's device time) and writes it in the Chrome trace format:
//! `boundpool trace FILE.json --svg timeline.svg` draws it.

use std::time::Instant;

use boundpool_gpu::{
    builtin, DeviceBuffer, GpuGraphBuilder, GpuGraphExt, GpuPoolBuilder, LaunchConfig, Module,
};
use boundpool_scheduler::{GraphBuilder, PoolBuilder};

/// Small whole numbers, scaled by whole numbers: every partial sum of a vector of up to about
/// two million elements is a whole number below 2^24, which an `f32` holds exactly, so the
/// reduction's atomic adds give the exact sum in whatever order they land, and the check can ask
/// for it exactly (a lost or doubled element, a read before the scale finished, shows).
fn input(v: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i + v) % 5) as f32).collect()
}

fn scale_of(v: usize) -> f32 {
    1.0 + (v % 4) as f32
}

fn expected(v: usize, len: usize) -> f64 {
    input(v, len)
        .iter()
        .map(|&x| x as f64 * scale_of(v) as f64)
        .sum()
}

fn check(results: &[(usize, f32)], len: usize) -> bool {
    let mut ok = true;
    for &(v, got) in results {
        let want = expected(v, len);
        let rel = ((got as f64 - want) / want.max(1.0)).abs();
        // Exact while every partial sum is a whole number below 2^24 (see `input`); beyond,
        // f32 rounding depends on the order of the adds.
        let tolerance = if want < (1u32 << 24) as f64 {
            0.0
        } else {
            1e-3
        };
        if rel > tolerance {
            println!("vector {v}: got {got}, expected {want} (relative error {rel:.2e}) WRONG");
            ok = false;
        }
    }
    ok
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let trace = match args.iter().position(|a| a == "--trace") {
        Some(i) if i + 1 < args.len() => {
            let f = args.remove(i + 1);
            args.remove(i);
            Some(f)
        }
        Some(_) => return Err("--trace needs a file name".into()),
        None => None,
    };
    let vectors: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(16);
    let len: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);

    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        println!("no GPU ({why}): running the host version of the pipeline");
        return host_version(vectors, len, trace.as_deref());
    }

    let pool = GpuPoolBuilder::new()
        .workers_per_device(4)
        .groups_per_device(2)
        .trace(trace.is_some())
        .build()?;
    let d = pool.devices()[0].clone();
    println!(
        "GPU pipeline on {} ({}), {} workers",
        d.info().name,
        d.info().pci_bus_id,
        pool.pool().workers().len()
    );
    let m = Module::builtin();
    let (scale, sum) = (m.kernel(builtin::SCALE_F32)?, m.kernel(builtin::SUM_F32)?);
    let (g0, g1) = (d.groups()[0], d.groups()[1 % d.groups().len()]);

    let mut g = GpuGraphBuilder::new("pipeline");
    let mut outs = Vec::new();
    for v in 0..vectors {
        let up = g.gpu_node_in(g0, &format!("upload{v}"), move |ctx| {
            Ok(ctx.upload(&input(v, len))?)
        });
        let k = scale.clone();
        let sc = g.gpu_node_in(g1, &format!("scale{v}"), move |ctx| {
            let x: &DeviceBuffer<f32> = ctx.input(up)?;
            // SAFETY: bp_scale_f32(f32* x, f32 a, u32 n) over the whole buffer, which outlives
            // the graph's GPU work (it is the upload node's output).
            unsafe {
                ctx.launch(&k, LaunchConfig::for_elements(x.len()))
                    .arg(x)
                    .arg(scale_of(v))
                    .arg(x.len() as u32)
                    .launch()?
            };
            Ok(())
        });
        let k = sum.clone();
        let red = g.gpu_node_in(g0, &format!("reduce{v}"), move |ctx| {
            let x: &DeviceBuffer<f32> = ctx.input(up)?;
            let mut out = ctx.alloc_zeros::<f32>(1)?;
            // SAFETY: bp_sum_f32(const f32* x, f32* out, u32 n).
            unsafe {
                ctx.launch(&k, LaunchConfig::for_elements(x.len()))
                    .arg(x)
                    .arg(&mut out)
                    .arg(x.len() as u32)
                    .launch()?
            };
            Ok(out)
        });
        let down = g.gpu_node_in(g1, &format!("download{v}"), move |ctx| {
            Ok((v, ctx.download(ctx.input(red)?)?[0]))
        });
        g.edge(up, sc).edge(sc, red).edge(up, red).edge(red, down);
        outs.push(down);
    }
    let graph = g.build()?;
    for round in 0..3 {
        let t0 = Instant::now();
        let out = pool.submit(&graph)?.wait()?;
        let results: Vec<(usize, f32)> =
            outs.iter().map(|&o| *out.get(o).expect("output")).collect();
        let ok = check(&results, len);
        println!(
            "round {round}: {vectors} vectors of {len} floats in {:?}: {}",
            t0.elapsed(),
            if ok {
                "all sums match the host"
            } else {
                "MISMATCH"
            }
        );
        if !ok {
            return Err("GPU results differ from the host's".into());
        }
    }
    if let Some(file) = trace {
        write_trace(&pool.take_trace(), &file)?;
    }
    Ok(())
}

/// Writes `t` in the Chrome trace format.
fn write_trace(t: &boundpool::Trace, file: &str) -> Result<(), Box<dyn std::error::Error>> {
    let json = boundpool::observe::chrome_trace(t, |_, _| {});
    std::fs::write(file, serde_json::to_string(&json)?)?;
    println!(
        "trace: {} slices on {} tracks written to {file}",
        t.slices.len(),
        t.tracks.len()
    );
    Ok(())
}

fn host_version(
    vectors: usize,
    len: usize,
    trace: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PoolBuilder::new()
        .workers(2)
        .trace(trace.is_some())
        .build()?;
    let mut g = GraphBuilder::new("pipeline-host");
    let mut outs = Vec::new();
    for v in 0..vectors {
        let up = g.node(format!("upload{v}"), move |_| Ok(input(v, len)));
        let sc = g.node(format!("scale{v}"), move |ctx| {
            Ok(ctx
                .input(up)?
                .iter()
                .map(|&x| x * scale_of(v))
                .collect::<Vec<f32>>())
        });
        let red = g.node(format!("reduce{v}"), move |ctx| {
            Ok((
                v,
                ctx.input(sc)?.iter().map(|&x| x as f64).sum::<f64>() as f32,
            ))
        });
        g.edge(up, sc).edge(sc, red);
        outs.push(red);
    }
    let graph = g.build()?;
    let t0 = Instant::now();
    let out = pool.submit(&graph)?.wait()?;
    let results: Vec<(usize, f32)> = outs.iter().map(|&o| *out.get(o).expect("output")).collect();
    let ok = check(&results, len);
    println!(
        "host version: {vectors} vectors of {len} floats in {:?}: {}",
        t0.elapsed(),
        if ok { "all sums match" } else { "MISMATCH" }
    );
    if !ok {
        return Err("host pipeline mismatch".into());
    }
    if let Some(file) = trace {
        write_trace(&pool.take_trace(), file)?;
    }
    Ok(())
}
