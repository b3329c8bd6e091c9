//! An existing cudarc program moved into boundpool nodes, unchanged in its GPU calls.
//!
//! The program, as a cudarc user writes it: compile a kernel with NVRTC, load it into the
//! context, run it through `launch_builder` on a stream, then a bf16 GEMM through `CudaBlas`:
//!
//! ```text
//! let ctx = CudaContext::new(0)?;  let stream = ctx.default_stream();
//! let f = ctx.load_module(compile_ptx(SRC)?)?.load_function("gelu_bf16")?;
//! let x = stream.clone_htod(&x_host)?;  ...  stream.launch_builder(&f).arg(&x)...launch(cfg)?;
//! let blas = CudaBlas::new(stream.clone())?;  blas.gemm(cfg, &w, &x, &mut y)?;
//! let y_host = stream.clone_dtoh(&y)?;
//! ```
//!
//! In boundpool the same calls go in node bodies: the context comes from the worker
//! (`WorkerSetup::context`, where each worker loads the module once), the stream from the node
//! (`GpuCtx::stream`), the cuBLAS handle from the worker (`GpuCtx::cublas`, already set to the
//! node's stream). The nodes run on different workers and streams; boundpool orders them on
//! the device (event edges), with every driver call on a worker bound to the device's context,
//! and the buffers that leave a node (`GpuCtx::adopt`) are freed by a bound worker whichever
//! thread drops them. A batch of independent requests runs at once on the pool's workers.
//!
//! `cargo run --release --example cudarc_nodes [-- requests]`. Without a GPU it says so and
//! exits.

use std::time::Instant;

use boundpool::gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool::gpu::cudarc::cublas::{Gemm, GemmConfig};
use boundpool::gpu::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use boundpool::gpu::cudarc::nvrtc::compile_ptx;
use boundpool::gpu::half::bf16;
use boundpool::gpu::{GpuGraphBuilder, GpuGraphExt, GpuPoolBuilder};

/// The program's kernel: y = x * sigmoid(1.702 x) (GELU's sigmoid form) on bf16 stored as u16,
/// in plain C (NVRTC finds no headers by default).
const SRC: &str = r#"
extern "C" __global__ void gelu_bf16(unsigned short* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __uint_as_float(((unsigned)x[i]) << 16);
        float g = v / (1.0f + __expf(-1.702f * v));
        x[i] = (unsigned short)(__float_as_uint(g) >> 16);
    }
}
"#;

const D: usize = 256; // features
const B: usize = 64; // tokens per request

fn gelu(v: f32) -> f32 {
    v / (1.0 + (-1.702 * v).exp())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some(why) = boundpool::gpu::gpu_unavailable_reason() {
        println!("no GPU here ({why}): this example needs one");
        return Ok(());
    }
    let requests: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(32);
    let pool = GpuPoolBuilder::new()
        .workers_per_device(4)
        .groups_per_device(2)
        .worker_state(|s| -> Result<CudaFunction, boundpool::BoxError> {
            let m = s.context().load_module(compile_ptx(SRC)?)?;
            Ok(m.load_function("gelu_bf16")?)
        })
        .build()?;
    let dev = pool.devices()[0].clone();
    // Weights (D×D, column-major), rounded to bf16 on the host.
    let w: Vec<bf16> = (0..D * D)
        .map(|i| bf16::from_f32(((i * 7 % 13) as f32 - 6.0) / 64.0))
        .collect();
    let wd = {
        let w = w.clone();
        pool.call(&dev, move |ctx| Ok(ctx.upload(&w)?))?
    };
    let wd = std::sync::Arc::new(wd);

    let mut g = GpuGraphBuilder::new("cudarc requests");
    let mut outs = Vec::new();
    for r in 0..requests {
        let x: Vec<bf16> = (0..D * B)
            .map(|i| bf16::from_f32(((i + r) % 9) as f32 / 8.0 - 0.5))
            .collect();
        // Upload and GELU on one group's worker, cudarc calls unchanged.
        let act = g.gpu_node_in(dev.groups()[0], &format!("gelu {r}"), move |ctx| {
            let s = ctx.stream();
            let mut xs = s.clone_htod(&x)?;
            // SAFETY: u16 and bf16 have the same size; the kernel reads and writes `n` of them.
            let mut raw = unsafe { xs.transmute_mut::<u16>(D * B) }.expect("same size");
            let n = (D * B) as u32;
            let f = ctx.state::<CudaFunction>()?;
            // SAFETY: gelu_bf16(unsigned short*, unsigned) over `n` elements.
            unsafe {
                s.launch_builder(f)
                    .arg(&mut raw)
                    .arg(&n)
                    .launch(LaunchConfig::for_num_elems(n))?
            };
            Ok(ctx.adopt(xs)?)
        });
        // The GEMM on the other group: another worker and stream, ordered by an event edge.
        let w = wd.clone();
        let mm = g.gpu_node_in(dev.groups()[1], &format!("gemm {r}"), move |ctx| {
            let x = ctx.input(act)?;
            let mut y = ctx.stream().alloc_zeros::<bf16>(D * B)?;
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: D as i32,
                n: B as i32,
                k: D as i32,
                alpha: bf16::ONE,
                lda: D as i32,
                ldb: D as i32,
                beta: bf16::ZERO,
                ldc: D as i32,
            };
            // SAFETY: W is D×D, X is D×B, Y is D×B, column-major.
            unsafe { ctx.cublas()?.gemm(cfg, &**w, &**x, &mut y)? };
            Ok(ctx.stream().clone_dtoh(&y)?)
        });
        g.edge(act, mm);
        outs.push(mm);
    }
    let graph = g.build()?;
    let t0 = Instant::now();
    let mut out = pool.submit(&graph)?.wait()?;
    let took = t0.elapsed();
    // Check request 0 against the host (bf16 operands, f32 accumulation on the host).
    let y0: Vec<bf16> = out.take(outs[0]).expect("output");
    let xa: Vec<f32> = (0..D * B)
        .map(|i| {
            let v = bf16::from_f32((i % 9) as f32 / 8.0 - 0.5).to_f32();
            bf16::from_f32(gelu(v)).to_f32()
        })
        .collect();
    let mut worst = 0f32;
    for j in 0..B {
        for i in 0..D {
            let want: f32 = (0..D).map(|p| w[i + p * D].to_f32() * xa[p + j * D]).sum();
            let got = y0[i + j * D].to_f32();
            worst = worst.max((got - want).abs() / want.abs().max(1.0));
        }
    }
    println!(
        "{requests} requests (GELU kernel + bf16 GEMM each, on {} workers): {:.2} ms; request 0 max relative error {worst:.1e}",
        pool.pool().stats().workers.len(),
        took.as_secs_f64() * 1e3
    );
    if worst > 2e-2 {
        return Err(format!("request 0 differs from the host: {worst}").into());
    }
    drop(wd);
    Ok(())
}
