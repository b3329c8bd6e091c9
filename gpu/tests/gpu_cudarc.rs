//! cudarc inside nodes: a node's stream and context as cudarc's types, cudarc kernels through
//! `launch_builder`, typed cuBLAS GEMMs in every precision (`GpuCtx::cublas`), buffers moving
//! between `DeviceBuffer` and `CudaSlice` without a copy and dropped on foreign threads, a
//! replayed chain of GEMMs and cudarc kernels (one writing its predecessor's buffer in place,
//! `ReplayCtx::take`) against its eager run with changing inputs, and
//! the worker's cuBLASLt (`GpuCtx::cublaslt`): matmuls with bias / ReLU / GELU epilogues in
//! every precision, eager (also in a nested node on another level's stream) and replayed, and
//! its tuning (`CublasLt::tune`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use boundpool_gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool_gpu::cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use boundpool_gpu::cudarc::cublaslt::{Activation, MatmulConfig};
use boundpool_gpu::cudarc::driver::{
    CudaFunction, CudaSlice, LaunchConfig as CuLaunch, PushKernelArg,
};
use boundpool_gpu::half::{bf16, f16};
use boundpool_gpu::{
    DeviceBuffer, DeviceCopy, GpuCtx, GpuDevice, GpuGraphBuilder, GpuGraphExt, GpuPool, LtElement,
    Priority, RNode, ReplayBuilder, ReplayCtx, Replayable, RunInputs,
};
use boundpool_test_support::{chain, gpu_pool_builder, GpuTest};

/// CUDA C of an existing cudarc program: plain C, no headers (NVRTC finds none by default).
const SOURCE: &str = r#"
extern "C" __global__ void affine(float a, float b, float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + b;
}
// f32 -> bf16 by truncation (the upper 16 bits), so the host can do the same.
extern "C" __global__ void to_bf16(const float* x, unsigned short* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (unsigned short)(__float_as_uint(x[i]) >> 16);
}
"#;

/// Each worker's cudarc functions, loaded on the worker at start (`worker_state`).
struct Kernels {
    affine: CudaFunction,
    to_bf16: CudaFunction,
}

fn pool(workers: usize, groups: usize) -> GpuPool {
    gpu_pool_builder(workers, groups)
        .name("cudarc")
        .worker_state(|s| {
            let ptx = boundpool_gpu::cudarc::nvrtc::compile_ptx(SOURCE)?;
            let m = s.context().load_module(ptx)?;
            Ok(Kernels {
                affine: m.load_function("affine")?,
                to_bf16: m.load_function("to_bf16")?,
            })
        })
        .build()
        .expect("GPU pool")
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn truncate_bf16(v: f32) -> f32 {
    f32::from_bits(v.to_bits() & 0xFFFF_0000)
}

/// Column-major `C = A B` (`m`×`k` times `k`×`n`) in f64.
fn host_gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for j in 0..n {
        for p in 0..k {
            let bv = b[p + j * k] as f64;
            for i in 0..m {
                c[i + j * m] += a[i + p * m] as f64 * bv;
            }
        }
    }
    c
}

/// ‖got − want‖ / ‖want‖.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut d, mut w) = (0f64, 0f64);
    for (g, r) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite result");
        d += (g - r) * (g - r);
        w += r * r;
    }
    (d / w).sqrt()
}

fn gemm_cfg<T>(m: usize, n: usize, k: usize, alpha: T, beta: T) -> GemmConfig<T> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha,
        lda: m as i32,
        ldb: k as i32,
        beta,
        ldc: m as i32,
    }
}

const M: usize = 96;
const N: usize = 80;
const K: usize = 64;

#[test]
fn cudarc_kernels_and_a_bf16_gemm_in_nodes_follow_the_edges() {
    let Some(_t) = GpuTest::start(
        "cudarc_kernels_and_a_bf16_gemm_in_nodes_follow_the_edges",
        120,
    ) else {
        return;
    };
    let p = pool(4, 2);
    let d = p.devices()[0].clone();
    let (x, w) = (values(M * K, 1), values(K * N, 2));
    let mut g = GpuGraphBuilder::new("cudarc pipeline");
    let (hx, hw) = (x.clone(), w.clone());
    // Upload through cudarc on the node's stream; the slices leave the node as DeviceBuffers.
    let up = g.gpu_node_in(d.groups()[0], "upload", move |ctx| {
        let s = ctx.stream();
        let xs: CudaSlice<f32> = s.clone_htod(&hx)?;
        let ws: CudaSlice<f32> = s.clone_htod(&hw)?;
        Ok((ctx.adopt(xs)?, ctx.adopt(ws)?))
    });
    // On the other group (another worker, another stream: an event edge): x = 2x + 1, then
    // both to bf16, with the worker's cudarc functions.
    let conv = g.gpu_node_in(d.groups()[1], "affine and bf16", move |ctx| {
        let (xb, wb) = ctx.input(up)?;
        let k = ctx.state::<Kernels>()?;
        let s = ctx.stream();
        let mut xa: CudaSlice<f32> = s.clone_dtod(xb.as_cuda_slice())?;
        let n = xa.len() as u32;
        // SAFETY: affine(float, float, float*, unsigned) over `n` elements of `xa`.
        unsafe {
            s.launch_builder(&k.affine)
                .arg(&2.0f32)
                .arg(&1.0f32)
                .arg(&mut xa)
                .arg(&n)
                .launch(CuLaunch::for_num_elems(n))?;
        }
        let mut x16 = s.alloc_zeros::<u16>(M * K)?;
        let mut w16 = s.alloc_zeros::<u16>(K * N)?;
        for (src, dst) in [(&xa, &mut x16), (wb.as_cuda_slice(), &mut w16)] {
            let n = src.len() as u32;
            // SAFETY: to_bf16(const float*, unsigned short*, unsigned) over `n` elements.
            unsafe {
                s.launch_builder(&k.to_bf16)
                    .arg(src)
                    .arg(dst)
                    .arg(&n)
                    .launch(CuLaunch::for_num_elems(n))?;
            }
        }
        let as_bf16 = |v: CudaSlice<u16>| -> CudaSlice<bf16> {
            let len = v.len();
            let ptr = v.leak();
            // SAFETY: `ptr` is the allocation `v` gave up, of `len` 2-byte elements, taken over
            // by the new slice; u16 and bf16 have the same size and any bits are a bf16.
            unsafe { ctx.stream().upgrade_device_ptr::<bf16>(ptr, len) }
        };
        Ok((ctx.adopt(as_bf16(x16))?, ctx.adopt(as_bf16(w16))?))
    });
    // Back on the first group: C = X W in bf16 through cudarc's CudaBlas.
    let mm = g.gpu_node_in(d.groups()[0], "bf16 gemm", move |ctx| {
        let (xb, wb) = ctx.input(conv)?;
        let mut c = ctx.alloc_zeros::<bf16>(M * N)?;
        let blas = ctx.cublas()?;
        let cfg = gemm_cfg(M, N, K, bf16::from_f32(1.0), bf16::from_f32(0.0));
        // SAFETY: the buffers hold M×K, K×N and M×N column-major matrices.
        unsafe { blas.gemm(cfg, xb.as_cuda_slice(), wb.as_cuda_slice(), &mut c)? };
        Ok(c)
    });
    let down = g.gpu_node_in(d.groups()[1], "download", move |ctx| {
        let c = ctx.input(mm)?;
        Ok(ctx.stream().clone_dtoh(c.as_cuda_slice())?)
    });
    g.edge(up, conv).edge(conv, mm).edge(mm, down);
    let graph = g.build().unwrap();
    let xr: Vec<f32> = x.iter().map(|v| truncate_bf16(2.0 * v + 1.0)).collect();
    let wr: Vec<f32> = w.iter().map(|&v| truncate_bf16(v)).collect();
    let want = host_gemm(&xr, &wr, M, N, K);
    for run in 0..20 {
        let mut out = p
            .submit(&graph)
            .unwrap()
            .wait()
            .unwrap_or_else(|e| panic!("run {run}: {}", chain(&e)));
        let got: Vec<f64> = out
            .take(down)
            .unwrap()
            .iter()
            .map(|v: &bf16| v.to_f64())
            .collect();
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "run {run}: bf16 GEMM relative error {e}");
        // The buffers leave with the output and are dropped on another thread.
        let bufs = (out.take(up), out.take(conv), out.take(mm));
        std::thread::spawn(move || drop(bufs)).join().unwrap();
    }
    wait_for_no_buffers(&p);
    drop(p);
}

/// Waits up to 10 s for every buffer of the pool's device to be freed by its workers.
fn wait_for_no_buffers(p: &GpuPool) {
    let d = &p.devices()[0];
    let t0 = Instant::now();
    while d.live_allocations() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(d.live_allocations(), 0, "buffers not freed by the workers");
}

/// One typed GEMM through `GpuCtx::cublas` on fresh random inputs, against the host in f64.
fn check_gemm<T>(p: &GpuPool, seed: u64, of: fn(f32) -> T, to: fn(&T) -> f64, tol: f64, what: &str)
where
    T: boundpool_gpu::DeviceCopy + Default,
    boundpool_gpu::cudarc::cublas::CudaBlas: Gemm<T>,
{
    let (a, b) = (values(M * K, seed), values(K * N, seed + 1));
    let ar: Vec<f32> = a.iter().map(|&v| to(&of(v)) as f32).collect();
    let br: Vec<f32> = b.iter().map(|&v| to(&of(v)) as f32).collect();
    let want = host_gemm(&ar, &br, M, N, K);
    let d = p.devices()[0].clone();
    let got = p
        .call(&d, move |ctx| {
            let ad = ctx.upload(&a.iter().map(|&v| of(v)).collect::<Vec<T>>())?;
            let bd = ctx.upload(&b.iter().map(|&v| of(v)).collect::<Vec<T>>())?;
            let mut c = ctx.alloc_zeros::<T>(M * N)?;
            let cfg = gemm_cfg(M, N, K, of(1.0), of(0.0));
            // SAFETY: M×K, K×N and M×N column-major matrices.
            unsafe { ctx.cublas()?.gemm(cfg, &*ad, &*bd, &mut c)? };
            Ok(ctx.download(&c)?)
        })
        .unwrap_or_else(|e| panic!("{what}: {}", chain(&e)));
    let got: Vec<f64> = got.iter().map(to).collect();
    let e = rel_err(&got, &want);
    eprintln!("{what} GEMM: relative error {e:.2e}");
    assert!(e < tol, "{what} GEMM: relative error {e} (tolerance {tol})");
}

#[test]
fn gemm_in_every_precision_matches_the_host() {
    let Some(_t) = GpuTest::start("gemm_in_every_precision_matches_the_host", 120) else {
        return;
    };
    let p = pool(2, 1);
    check_gemm(&p, 10, |v| v as f64, |v| *v, 1e-12, "f64");
    check_gemm(&p, 20, |v| v, |v| *v as f64, 1e-5, "f32");
    check_gemm(&p, 30, f16::from_f32, |v| v.to_f64(), 5e-3, "f16");
    check_gemm(&p, 40, bf16::from_f32, |v| v.to_f64(), 2e-2, "bf16");
    // Strided-batched f32: three products in one call.
    let batch = 3;
    let (a, b) = (values(M * K * batch, 50), values(K * N * batch, 51));
    let d = p.devices()[0].clone();
    let (ha, hb) = (a.clone(), b.clone());
    let got = p
        .call(&d, move |ctx| {
            let ad = ctx.upload(&ha)?;
            let bd = ctx.upload(&hb)?;
            let mut c = ctx.alloc_zeros::<f32>(M * N * batch)?;
            let cfg = StridedBatchedConfig {
                gemm: gemm_cfg(M, N, K, 1.0f32, 0.0),
                batch_size: batch as i32,
                stride_a: (M * K) as i64,
                stride_b: (K * N) as i64,
                stride_c: (M * N) as i64,
            };
            // SAFETY: `batch` column-major products of the shapes above, packed.
            unsafe {
                ctx.cublas()?
                    .gemm_strided_batched(cfg, &*ad, &*bd, &mut c)?
            };
            Ok(ctx.download(&c)?)
        })
        .unwrap();
    for i in 0..batch {
        let want = host_gemm(
            &a[i * M * K..(i + 1) * M * K],
            &b[i * K * N..(i + 1) * K * N],
            M,
            N,
            K,
        );
        let got: Vec<f64> = got[i * M * N..(i + 1) * M * N]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "strided-batched product {i}: relative error {e}");
    }
    drop(p);
}

#[test]
fn buffers_move_between_device_buffer_and_cuda_slice_without_a_copy() {
    let Some(_t) = GpuTest::start(
        "buffers_move_between_device_buffer_and_cuda_slice_without_a_copy",
        60,
    ) else {
        return;
    };
    let p = pool(2, 1);
    let d = p.devices()[0].clone();
    let r = p
        .call(&d, |ctx| {
            let buf = ctx.upload(&[1u32, 2, 3, 4])?;
            let addr = buf.device_ptr();
            let slice: CudaSlice<u32> = buf.into_cuda_slice();
            let back: DeviceBuffer<u32> = ctx.adopt(slice)?;
            Ok((addr, back.device_ptr(), ctx.download(&back)?))
        })
        .unwrap();
    assert_eq!(r.0, r.1, "the round trip moved the memory");
    assert_eq!(r.2, vec![1, 2, 3, 4]);
    // Many buffers made by cudarc inside nodes, adopted, dropped on eight foreign threads.
    let mut g = GpuGraphBuilder::new("slices");
    let nodes: Vec<_> = (0..64)
        .map(|i| {
            g.gpu_node(&d, &format!("n{i}"), move |ctx| {
                let s = ctx.stream().alloc_zeros::<f32>(1 << 16)?;
                Ok(ctx.adopt(s)?)
            })
        })
        .collect();
    let graph = g.build().unwrap();
    let mut outs = Vec::new();
    for _ in 0..8 {
        let mut o = p.submit(&graph).unwrap().wait().unwrap();
        outs.push(
            nodes
                .iter()
                .map(|&n| o.take(n).unwrap())
                .collect::<Vec<_>>(),
        );
    }
    assert!(d.live_allocations() >= 8 * 64);
    let ts: Vec<_> = outs
        .into_iter()
        .map(|v| std::thread::spawn(move || drop(v)))
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    wait_for_no_buffers(&p);
    drop(p);
}

#[test]
fn a_replayed_chain_of_gemms_and_kernels_equals_its_eager_run_with_changing_inputs() {
    let name = "a_replayed_chain_of_gemms_and_kernels_equals_its_eager_run_with_changing_inputs";
    let Some(_t) = GpuTest::start(name, 180) else {
        return;
    };
    let p = pool(4, 1);
    let d = p.devices()[0].clone();
    let (w1, w2, wb) = (values(K * K, 7), values(K * N, 8), values(K * N, 9));
    let w2b: Vec<bf16> = wb
        .iter()
        .map(|&v| bf16::from_f32(truncate_bf16(v)))
        .collect();
    // Static buffers: the run's input (written by an eager node every run) and the weights.
    let (h1, h2) = (w1.clone(), w2.clone());
    let (x, w1d, w2d, wbd) = p
        .call(&d, move |ctx| {
            Ok((
                ctx.alloc_zeros::<f32>(M * K)?,
                ctx.upload(&h1)?,
                ctx.upload(&h2)?,
                ctx.upload(&w2b)?,
            ))
        })
        .unwrap();
    let x = Arc::new(x);
    let weights = Arc::new((w1d, w2d, wbd));

    let mut b = ReplayBuilder::new("gemm chain");
    let xin = b.input::<Vec<f32>>("x");
    let xi = x.clone();
    // The static input, refilled every run (`copy_into`: the captured GEMM reads it too).
    let load = b.eager_gpu_node(&d, "load input", move |c: &ReplayCtx<'_, '_>| {
        c.copy_into(&c.input(xin)?, &xi)?;
        Ok(())
    });
    let (xi, ws) = (x.clone(), weights.clone());
    // H = X W1 (f32).
    let gemm1 = b.gpu_node(&d, "gemm1", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let mut h = g.alloc::<f32>(M * K)?;
        // SAFETY: M×K times K×K into M×K, column-major.
        unsafe {
            g.cublas()?
                .gemm(gemm_cfg(M, K, K, 1.0f32, 0.0), &*xi, &*ws.0, &mut h)?
        };
        Ok(h)
    });
    // H = 0.5 H + 0.25 (a cudarc kernel), in place in the buffer gemm1 made, which this node
    // takes (its only reader): no lock, no copy; the replay writes the same buffer.
    let h = b.gpu_node(&d, "affine", move |c: &ReplayCtx<'_, '_>| {
        let mut h = c.take(gemm1)?;
        half_plus_quarter(c.gpu()?, &mut h)?;
        Ok(h)
    });
    let ws2 = weights.clone();
    // Y = H W2 (f32), a second captured node after the first.
    let y = b.gpu_node(&d, "gemm2", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let hv = c.input(h)?;
        let mut y = g.alloc::<f32>(M * N)?;
        // SAFETY: M×K times K×N into M×N.
        unsafe {
            g.cublas()?
                .gemm(gemm_cfg(M, N, K, 1.0f32, 0.0), &**hv, &*ws2.1, &mut y)?
        };
        Ok(y)
    });
    let ws3 = weights.clone();
    // Z = bf16(H) Wb (bf16), beside gemm2.
    let z = b.gpu_node(&d, "bf16 gemm", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let hv = c.input(h)?;
        let h16 = to_bf16_bits(g, &hv)?;
        // SAFETY: u16 and bf16 have the same size and every bit pattern is a bf16; the
        // buffer's memory is reinterpreted, not freed.
        let h16b = unsafe { h16.transmute::<bf16>(M * K) }.expect("same size");
        let mut z = g.alloc::<bf16>(M * N)?;
        let cfg = gemm_cfg(M, N, K, bf16::from_f32(1.0), bf16::from_f32(0.0));
        // SAFETY: M×K times K×N into M×N.
        unsafe { g.cublas()?.gemm(cfg, &h16b, &*ws3.2, &mut z)? };
        Ok((z, h16))
    });
    let read = read_back(&mut b, &d, y, z);
    b.edge(xin, load).edge(load, gemm1).hand_on(gemm1, h);
    b.edge(h, y).edge(h, z);
    let r = b.build().unwrap();
    replayed_equals_eager(&r, &p, xin, read, 1000, |run, xs, ey, ez| {
        // And both against the host.
        let hh: Vec<f32> = host_gemm(xs, &w1, M, K, K)
            .iter()
            .map(|&v| 0.5 * v as f32 + 0.25)
            .collect();
        let wy = host_gemm(&hh, &w2, M, N, K);
        let ey64: Vec<f64> = ey.iter().map(|&v| v as f64).collect();
        assert!(rel_err(&ey64, &wy) < 1e-4, "run {run}: f32 chain vs host");
        let hb: Vec<f32> = hh.iter().map(|&v| truncate_bf16(v)).collect();
        let wbr: Vec<f32> = wb.iter().map(|&v| truncate_bf16(v)).collect();
        let wz = host_gemm(&hb, &wbr, M, N, K);
        let ez64: Vec<f64> = ez.iter().map(|&v| v as f64).collect();
        assert!(rel_err(&ez64, &wz) < 2e-2, "run {run}: bf16 GEMM vs host");
    });
    let s = r.stats();
    assert_eq!(s.captures, 1, "captured once, replayed after: {s:?}");
    assert_eq!(s.failed_captures, 0, "{s:?}");
    drop(r);
    drop((x, weights));
    wait_for_no_buffers(&p);
    drop(p);
}

#[test]
fn curand_fills_a_buffer_on_the_nodes_stream() {
    let Some(_t) = GpuTest::start("curand_fills_a_buffer_on_the_nodes_stream", 60) else {
        return;
    };
    let p = pool(2, 1);
    let d = p.devices()[0].clone();
    let n = 1 << 20;
    let v = p
        .call(&d, move |ctx| {
            // The generator's create, first draw (its state is set up then) and destroy
            // synchronise the device: outside any other graph's capture (another test of this
            // binary may be capturing).
            let mut x = ctx.alloc::<f32>(n)?;
            ctx.outside_captures(|| -> Result<(), boundpool_gpu::BoxError> {
                let rng = boundpool_gpu::cudarc::curand::CudaRng::new(42, ctx.stream().clone())?;
                rng.fill_with_uniform(&mut x)?;
                Ok(())
            })?;
            Ok(ctx.download(&x)?)
        })
        .unwrap();
    assert_eq!(v.len(), n);
    assert!(v.iter().all(|&x| x > 0.0 && x <= 1.0), "outside (0, 1]");
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
    assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    wait_for_no_buffers(&p);
}

#[test]
fn cublaslt_matmul_with_a_bias_and_relu_epilogue_on_the_nodes_stream() {
    let name = "cublaslt_matmul_with_a_bias_and_relu_epilogue_on_the_nodes_stream";
    let Some(_t) = GpuTest::start(name, 60) else {
        return;
    };
    use boundpool_gpu::cudarc::cublaslt::{Activation, CudaBlasLT, Matmul, MatmulConfig};
    let p = pool(2, 1);
    let d = p.devices()[0].clone();
    let r = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| truncate_bf16(x)).collect() };
    let (a, b, bias) = (
        r(&values(M * K, 60)),
        r(&values(K * N, 61)),
        r(&values(M, 62)),
    );
    let (ha, hb, hbias) = (a.clone(), b.clone(), bias.clone());
    let got = p
        .call(&d, move |ctx| {
            let to = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
            let (ad, bd, biasd) = (
                ctx.upload(&to(&ha))?,
                ctx.upload(&to(&hb))?,
                ctx.upload(&to(&hbias))?,
            );
            let mut c = ctx.alloc_zeros::<bf16>(M * N)?;
            // cudarc's cuBLASLt handle, made on the node's stream (its workspace too); its
            // create synchronises the device, and so does its drop: outside any other graph's
            // capture.
            let lt = ctx.outside_captures(|| CudaBlasLT::new(ctx.stream().clone()))?;
            let cfg = MatmulConfig {
                transa: false,
                transb: false,
                transc: false,
                m: M as u64,
                n: N as u64,
                k: K as u64,
                alpha: 1.0,
                lda: M as i64,
                ldb: K as i64,
                beta: 0.0,
                ldc: M as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            };
            // SAFETY: M×K times K×N into M×N, a bias of M, column-major.
            let done = unsafe {
                lt.matmul(
                    cfg,
                    &*ad,
                    &*bd,
                    &mut c,
                    Some(&*biasd),
                    Some(&Activation::Relu),
                )
            };
            ctx.outside_captures(|| drop(lt));
            done?;
            Ok(ctx.download(&c)?)
        })
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let mut want = host_gemm(&a, &b, M, N, K);
    for j in 0..N {
        for i in 0..M {
            let v = &mut want[i + j * M];
            *v = (*v + bias[i] as f64).max(0.0);
        }
    }
    let got: Vec<f64> = got.iter().map(|v| v.to_f64()).collect();
    let e = rel_err(&got, &want);
    assert!(
        e < 2e-2,
        "cuBLASLt bf16 matmul + bias + ReLU: relative error {e}"
    );
    wait_for_no_buffers(&p);
}

/// A plain (unbatched) column-major `m`×`n` cuBLASLt matmul with inner dimension `k`.
fn lt_cfg(m: usize, n: usize, k: usize) -> MatmulConfig {
    MatmulConfig {
        transa: false,
        transb: false,
        transc: false,
        m: m as u64,
        n: n as u64,
        k: k as u64,
        alpha: 1.0,
        lda: m as i64,
        ldb: k as i64,
        beta: 0.0,
        ldc: m as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

/// GELU as cuBLASLt's epilogue computes it (the tanh approximation).
fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// The host's `act(A B + bias)` (column-major, `bias` per row), in f64.
fn host_lt(
    a: &[f32],
    b: &[f32],
    bias: &[f32],
    m: usize,
    n: usize,
    k: usize,
    act: Option<fn(f64) -> f64>,
) -> Vec<f64> {
    let mut c = host_gemm(a, b, m, n, k);
    for j in 0..n {
        for i in 0..m {
            let v = &mut c[i + j * m];
            *v += bias[i] as f64;
            if let Some(f) = act {
                *v = f(*v);
            }
        }
    }
    c
}

/// `act(A B + bias)` through `GpuCtx::cublaslt` on this node's stream, from host data.
fn lt_on<T: LtElement + DeviceCopy + Default>(
    ctx: &GpuCtx<'_, '_>,
    a: &[T],
    b: &[T],
    bias: &[T],
    relu: bool,
) -> Result<Vec<T>, boundpool_gpu::BoxError> {
    let (ad, bd, biasd) = (ctx.upload(a)?, ctx.upload(b)?, ctx.upload(bias)?);
    let mut c = ctx.alloc_zeros::<T>(M * N)?;
    let act = relu.then_some(Activation::Relu);
    // SAFETY: M×K times K×N into M×N, a bias of M, column-major; the buffers live until the
    // download below has waited for the node's work.
    unsafe {
        ctx.cublaslt()?.matmul(
            lt_cfg(M, N, K),
            &*ad,
            &*bd,
            &mut c,
            Some(&*biasd),
            act.as_ref(),
        )?
    };
    Ok(ctx.download(&c)?)
}

/// One cuBLASLt matmul + bias (+ ReLU) through `GpuCtx::cublaslt` against the host.
fn check_lt<T>(
    p: &GpuPool,
    seed: u64,
    of: fn(f32) -> T,
    to: fn(&T) -> f64,
    tol: f64,
    relu: bool,
    what: &str,
) where
    T: LtElement + DeviceCopy + Default + Send + Sync,
{
    let (a, b, bias) = (
        values(M * K, seed),
        values(K * N, seed + 1),
        values(M, seed + 2),
    );
    let r = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| to(&of(x)) as f32).collect() };
    let act: Option<fn(f64) -> f64> = relu.then_some(|v: f64| v.max(0.0));
    let want = host_lt(&r(&a), &r(&b), &r(&bias), M, N, K, act);
    let d = p.devices()[0].clone();
    let got = p
        .call(&d, move |ctx| {
            let t = |v: &[f32]| v.iter().map(|&x| of(x)).collect::<Vec<T>>();
            lt_on(ctx, &t(&a), &t(&b), &t(&bias), relu)
        })
        .unwrap_or_else(|e| panic!("{what}: {}", chain(&e)));
    let got: Vec<f64> = got.iter().map(to).collect();
    let e = rel_err(&got, &want);
    eprintln!("cuBLASLt {what}: relative error {e:.2e}");
    assert!(
        e < tol,
        "cuBLASLt {what}: relative error {e} (tolerance {tol})"
    );
}

#[test]
fn cublaslt_matmul_in_every_precision_with_bias_and_relu_matches_the_host() {
    let name = "cublaslt_matmul_in_every_precision_with_bias_and_relu_matches_the_host";
    let Some(_t) = GpuTest::start(name, 120) else {
        return;
    };
    let p = pool(2, 1);
    // f32 computes in IEEE f32: about 1e-7 relative.
    for (relu, seed) in [(false, 200), (true, 210)] {
        let tag = |t: &str| format!("{t} + bias{}", if relu { " + ReLU" } else { "" });
        check_lt(&p, seed, |v| v, |v| *v as f64, 1e-5, relu, &tag("f32"));
        check_lt(
            &p,
            seed + 3,
            f16::from_f32,
            |v| v.to_f64(),
            5e-3,
            relu,
            &tag("f16"),
        );
        check_lt(
            &p,
            seed + 6,
            bf16::from_f32,
            |v| v.to_f64(),
            2e-2,
            relu,
            &tag("bf16"),
        );
    }
    // Strided-batched f32 with a bias per batch: three products in one call.
    let batch = 3;
    let (a, b, bias) = (
        values(M * K * batch, 230),
        values(K * N * batch, 231),
        values(M * batch, 232),
    );
    let d = p.devices()[0].clone();
    let (ha, hb, hbias) = (a.clone(), b.clone(), bias.clone());
    let got = p
        .call(&d, move |ctx| {
            let (ad, bd, biasd) = (ctx.upload(&ha)?, ctx.upload(&hb)?, ctx.upload(&hbias)?);
            let mut c = ctx.alloc_zeros::<f32>(M * N * batch)?;
            let cfg = MatmulConfig {
                stride_a: Some((M * K) as i64),
                stride_b: Some((K * N) as i64),
                stride_c: Some((M * N) as i64),
                stride_bias: Some(M as i64),
                batch_size: Some(batch as i32),
                ..lt_cfg(M, N, K)
            };
            // SAFETY: `batch` packed column-major products and biases of the shapes above.
            unsafe {
                ctx.cublaslt()?
                    .matmul(cfg, &*ad, &*bd, &mut c, Some(&*biasd), None)?
            };
            Ok(ctx.download(&c)?)
        })
        .unwrap_or_else(|e| panic!("batched: {}", chain(&e)));
    for i in 0..batch {
        let want = host_lt(
            &a[i * M * K..(i + 1) * M * K],
            &b[i * K * N..(i + 1) * K * N],
            &bias[i * M..(i + 1) * M],
            M,
            N,
            K,
            None,
        );
        let got: Vec<f64> = got[i * M * N..(i + 1) * M * N]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "batched product {i}: relative error {e}");
    }
    // A config the buffers are too short for is refused before any library call.
    let err = p
        .call(&d, move |ctx| {
            let (ad, bd) = (
                ctx.alloc_zeros::<f32>(M * K - 1)?,
                ctx.alloc_zeros::<f32>(K * N)?,
            );
            let mut c = ctx.alloc_zeros::<f32>(M * N)?;
            // SAFETY: the call is refused: A is one element short.
            unsafe {
                ctx.cublaslt()?.matmul(
                    lt_cfg(M, N, K),
                    &*ad,
                    &*bd,
                    &mut c,
                    None::<&CudaSlice<f32>>,
                    None,
                )?
            };
            Ok(())
        })
        .unwrap_err();
    let msg = chain(&err);
    assert!(
        msg.contains("cublasLtMatmul: A holds 6143 elements, the config needs 6144"),
        "{msg}"
    );
    wait_for_no_buffers(&p);
    drop(p);
}

/// `CublasLt::tune` on the node's stream: every candidate timed, the fastest chosen; matmuls of
/// the same problem afterwards (eager, and captured into a replay) give the host's result; a
/// tune under a capture is refused with the node named.
#[test]
fn cublaslt_tune_chooses_the_fastest_candidate_and_later_matmuls_stay_correct() {
    let name = "cublaslt_tune_chooses_the_fastest_candidate_and_later_matmuls_stay_correct";
    let Some(_t) = GpuTest::start(name, 120) else {
        return;
    };
    let p = pool(2, 1);
    let d = p.devices()[0].clone();
    let (a, b, bias) = (values(M * K, 240), values(K * N, 241), values(M, 242));
    let want = host_lt(&a, &b, &bias, M, N, K, None);
    let (ha, hb, hbias) = (a.clone(), b.clone(), bias.clone());
    let (tuning, eager, bufs) = p
        .call(&d, move |ctx| {
            let (ad, bd, biasd) = (ctx.upload(&ha)?, ctx.upload(&hb)?, ctx.upload(&hbias)?);
            let mut scratch = ctx.alloc_zeros::<f32>(M * N)?;
            let mut c = ctx.alloc_zeros::<f32>(M * N)?;
            let lt = ctx.cublaslt()?;
            // SAFETY: M×K times K×N into M×N plus a bias of M, column-major; the buffers
            // outlive the download below, which waits for the node's work.
            let tuning = unsafe {
                lt.tune(
                    lt_cfg(M, N, K),
                    &*ad,
                    &*bd,
                    &mut scratch,
                    Some(&*biasd),
                    None,
                )?
            };
            // SAFETY: as above.
            unsafe { lt.matmul(lt_cfg(M, N, K), &*ad, &*bd, &mut c, Some(&*biasd), None)? };
            Ok((tuning, ctx.download(&c)?, (ad, bd, biasd)))
        })
        .unwrap_or_else(|e| panic!("tune: {}", chain(&e)));
    eprintln!("cuBLASLt tune ({M}x{N}x{K} f32 + bias): {tuning}");
    let times: Vec<f64> = tuning.micros.iter().flatten().copied().collect();
    assert!(!times.is_empty(), "at least one candidate ran: {tuning:?}");
    assert!(
        times.iter().all(|&t| t > 0.0 && t.is_finite()),
        "{tuning:?}"
    );
    let best = tuning.micros[tuning.chosen].expect("the chosen one ran");
    assert!(
        times.iter().all(|&t| best <= t),
        "the chosen candidate is the fastest: {tuning:?}"
    );
    assert!(tuning.speedup() >= 1.0, "{tuning:?}");
    let got: Vec<f64> = eager.iter().map(|&v| v as f64).collect();
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "eager matmul after tune: relative error {e}");

    // The same problem captured into a replay, after the tune, twice.
    let bufs = Arc::new(bufs);
    let mut rb = ReplayBuilder::new("tuned");
    let w = bufs.clone();
    let y = rb.gpu_node(&d, "tuned matmul", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let mut y = g.alloc::<f32>(M * N)?;
        // SAFETY: as above; `w` outlives the replay.
        unsafe {
            g.cublaslt()?
                .matmul(lt_cfg(M, N, K), &*w.0, &*w.1, &mut y, Some(&*w.2), None)?
        };
        Ok(y)
    });
    let out = rb.eager_gpu_node(&d, "read", move |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.download(&*c.input(y)?)?)
    });
    rb.edge(y, out);
    let r = rb.build().unwrap();
    for run in 0..2 {
        let o = r
            .run(&p)
            .unwrap_or_else(|e| panic!("replay {run}: {}", chain(&e)));
        let got: Vec<f64> = o.get(out).unwrap().iter().map(|&v| v as f64).collect();
        let e = rel_err(&got, &want);
        assert!(
            e < 1e-5,
            "replayed run {run} after tune: relative error {e}"
        );
    }

    // Tuning under a capture is refused, naming the node.
    let mut rb = ReplayBuilder::new("tune captured");
    let w = bufs.clone();
    rb.gpu_node(&d, "tunes in a capture", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let mut y = g.alloc::<f32>(M * N)?;
        // SAFETY: as above; the call is refused before any matmul.
        let t = unsafe {
            g.cublaslt()?
                .tune(lt_cfg(M, N, K), &*w.0, &*w.1, &mut y, Some(&*w.2), None)?
        };
        Ok((y, t.chosen))
    });
    let bad = rb.build().unwrap();
    let err = bad.run(&p).unwrap_err();
    let msg = chain(&err);
    assert!(
        msg.contains("tunes in a capture") && msg.contains("CublasLt::tune"),
        "{msg}"
    );
    drop((r, bad, bufs));
    wait_for_no_buffers(&p);
    drop(p);
}

#[test]
fn cublaslt_in_a_node_nested_on_another_levels_stream_of_the_same_worker() {
    let name = "cublaslt_in_a_node_nested_on_another_levels_stream_of_the_same_worker";
    let Some(_t) = GpuTest::start(name, 120) else {
        return;
    };
    // One worker: the nested node runs on it while the outer body waits.
    let p = pool(1, 1);
    let d = p.devices()[0].clone();
    let (a, b, bias) = (values(M * K, 300), values(K * N, 301), values(M, 302));
    let want = host_lt(&a, &b, &bias, M, N, K, Some(|v: f64| v.max(0.0)));
    let (ha, hb, hbias, dn) = (a.clone(), b.clone(), bias.clone(), d.clone());
    let r = p
        .call(&d, move |ctx| {
            // The outer node's handle stays in use across the nested graph.
            let lt = ctx.cublaslt()?;
            let (ad, bd, biasd) = (ctx.upload(&ha)?, ctx.upload(&hb)?, ctx.upload(&hbias)?);
            let mut c1 = ctx.alloc_zeros::<f32>(M * N)?;
            let mut c2 = ctx.alloc_zeros::<f32>(M * N)?;
            let relu = Some(&Activation::Relu);
            // SAFETY: M×K times K×N into M×N, a bias of M; alive until the downloads.
            unsafe { lt.matmul(lt_cfg(M, N, K), &*ad, &*bd, &mut c1, Some(&*biasd), relu)? };
            let mut g = GpuGraphBuilder::new("nested lt");
            let (na, nb, nbias) = (ha.clone(), hb.clone(), hbias.clone());
            let inner = g.gpu_node(&dn, "inner lt", move |ictx| {
                let out = lt_on(ictx, &na, &nb, &nbias, true)?;
                let who = ictx.node().worker_info().name.clone();
                Ok((out, ictx.raw_stream(), who))
            });
            g.node_priority(inner, Priority::High);
            let graph = g.build()?;
            let mut out = ctx.node().submit(&graph)?.wait()?;
            let (inner_c, inner_stream, inner_worker) = out.take(inner).expect("inner output");
            // The outer handle and its workspace are still good after the nested node.
            // SAFETY: as above.
            unsafe { lt.matmul(lt_cfg(M, N, K), &*ad, &*bd, &mut c2, Some(&*biasd), relu)? };
            let outer_worker = ctx.node().worker_info().name.clone();
            Ok((
                ctx.download(&c1)?,
                ctx.download(&c2)?,
                inner_c,
                (ctx.raw_stream(), inner_stream),
                (outer_worker, inner_worker),
            ))
        })
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let (c1, c2, inner, (outer_s, inner_s), (outer_w, inner_w)) = r;
    assert_eq!(outer_w, inner_w, "the nested node ran on another worker");
    assert_ne!(outer_s, inner_s, "a high node on the normal stream");
    for (what, got) in [("outer", &c1), ("outer again", &c2), ("nested", &inner)] {
        let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "{what}: relative error {e}");
    }
    assert_eq!(c1, inner, "the same matmul on two streams differs");
    wait_for_no_buffers(&p);
    drop(p);
}

#[test]
fn a_replayed_graph_of_cublaslt_matmuls_equals_its_eager_run_with_changing_inputs() {
    let name = "a_replayed_graph_of_cublaslt_matmuls_equals_its_eager_run_with_changing_inputs";
    let Some(_t) = GpuTest::start(name, 180) else {
        return;
    };
    let p = pool(4, 1);
    let d = p.devices()[0].clone();
    let tr = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(truncate_bf16).collect() };
    let (w1, b1) = (values(K * K, 401), values(M, 402));
    let (w2, b2) = (values(K * N, 403), values(M, 404));
    let (wb, bb) = (tr(values(K * N, 405)), tr(values(M, 406)));
    let to16 = |v: &[f32]| -> Vec<bf16> { v.iter().map(|&x| bf16::from_f32(x)).collect() };
    let (hw1, hb1, hw2, hb2, hwb, hbb) = (
        w1.clone(),
        b1.clone(),
        w2.clone(),
        b2.clone(),
        to16(&wb),
        to16(&bb),
    );
    // Static buffers: the run's input (written by an eager node every run) and the weights.
    let (x, weights) = p
        .call(&d, move |ctx| {
            Ok((
                ctx.alloc_zeros::<f32>(M * K)?,
                (
                    ctx.upload(&hw1)?,
                    ctx.upload(&hb1)?,
                    ctx.upload(&hw2)?,
                    ctx.upload(&hb2)?,
                    ctx.upload(&hwb)?,
                    ctx.upload(&hbb)?,
                ),
            ))
        })
        .unwrap();
    let x = Arc::new(x);
    let ws = Arc::new(weights);

    let mut b = ReplayBuilder::new("lt chain");
    let xin = b.input::<Vec<f32>>("x");
    let xi = x.clone();
    let load = b.eager_gpu_node(&d, "load input", move |c: &ReplayCtx<'_, '_>| {
        c.copy_into(&c.input(xin)?, &xi)?;
        Ok(())
    });
    let (xi, w) = (x.clone(), ws.clone());
    // H = 0.5 (X W1 + b1) + 0.25: an f32 cuBLASLt matmul with a bias epilogue, then a cudarc
    // kernel, in one node.
    let h = b.gpu_node(&d, "lt f32 + bias, affine", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let mut h = g.alloc::<f32>(M * K)?;
        // SAFETY: M×K times K×K into M×K plus a bias of M, column-major.
        unsafe {
            g.cublaslt()?
                .matmul(lt_cfg(M, K, K), &**xi, &*w.0, &mut h, Some(&*w.1), None)?
        };
        half_plus_quarter(g, &mut h)?;
        Ok(h)
    });
    let w = ws.clone();
    // Y = ReLU(H W2 + b2) in f32, beside the bf16 branch.
    let y = b.gpu_node(&d, "lt f32 + bias + relu", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let hv = c.input(h)?;
        let mut y = g.alloc::<f32>(M * N)?;
        // SAFETY: M×K times K×N into M×N plus a bias of M.
        unsafe {
            g.cublaslt()?.matmul(
                lt_cfg(M, N, K),
                &**hv,
                &*w.2,
                &mut y,
                Some(&*w.3),
                Some(&Activation::Relu),
            )?
        };
        Ok(y)
    });
    let w = ws.clone();
    // Z = GELU(bf16(H) Wb + bb) in bf16.
    let z = b.gpu_node(&d, "lt bf16 + bias + gelu", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let hv = c.input(h)?;
        let h16 = to_bf16_bits(g, &hv)?;
        // SAFETY: u16 and bf16 have the same size and every bit pattern is a bf16; the
        // buffer's memory is reinterpreted, not freed.
        let h16b = unsafe { h16.transmute::<bf16>(M * K) }.expect("same size");
        let mut z = g.alloc::<bf16>(M * N)?;
        // SAFETY: M×K times K×N into M×N plus a bias of M.
        unsafe {
            g.cublaslt()?.matmul(
                lt_cfg(M, N, K),
                &h16b,
                &*w.4,
                &mut z,
                Some(&*w.5),
                Some(&Activation::Gelu),
            )?
        };
        Ok((z, h16))
    });
    let read = read_back(&mut b, &d, y, z);
    b.edge(xin, load).edge(load, h).edge(h, y).edge(h, z);
    let r = b.build().unwrap();
    replayed_equals_eager(&r, &p, xin, read, 2000, |run, xs, ey, ez| {
        // And both against the host.
        let hh: Vec<f32> = host_lt(xs, &w1, &b1, M, K, K, None)
            .iter()
            .map(|&v| 0.5 * v as f32 + 0.25)
            .collect();
        let wy = host_lt(&hh, &w2, &b2, M, N, K, Some(|v: f64| v.max(0.0)));
        let ey64: Vec<f64> = ey.iter().map(|&v| v as f64).collect();
        let e = rel_err(&ey64, &wy);
        assert!(e < 1e-5, "run {run}: f32 chain vs host: {e}");
        let hb: Vec<f32> = hh.iter().map(|&v| truncate_bf16(v)).collect();
        let wz = host_lt(&hb, &wb, &bb, M, N, K, Some(gelu));
        let ez64: Vec<f64> = ez.iter().map(|&v| v as f64).collect();
        let e = rel_err(&ez64, &wz);
        assert!(e < 3e-2, "run {run}: bf16 matmul + GELU vs host: {e}");
    });
    let s = r.stats();
    assert_eq!(
        s.captures, 1,
        "one segment, captured once, replayed after: {s:?}"
    );
    assert_eq!(s.failed_captures, 0, "{s:?}");
    drop(r);
    drop((x, ws));
    wait_for_no_buffers(&p);
    drop(p);
}

/// The eager node that reads a replayed chain's f32 output `y` and bf16 output `z` (with
/// whatever its node kept beside it) back to the host, as f32.
fn read_back<H: Send + Sync + 'static>(
    b: &mut ReplayBuilder,
    d: &GpuDevice,
    y: RNode<DeviceBuffer<f32>>,
    z: RNode<(DeviceBuffer<bf16>, H)>,
) -> RNode<(Vec<f32>, Vec<f32>)> {
    let read = b.eager_gpu_node(d, "read", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let yv = g.download(&*c.input(y)?)?;
        let zv: Vec<bf16> = g.download(&c.input(z)?.0)?;
        Ok((yv, zv.iter().map(|v| v.to_f32()).collect::<Vec<f32>>()))
    });
    b.edge(y, read).edge(z, read);
    read
}

/// Runs `r` 30 times replayed and eagerly, each time with new inputs (seeded `seed + run`)
/// for its input node `input`; asserts that both give the same outputs, and hands the run's
/// inputs and eager outputs to `host_check`.
fn replayed_equals_eager(
    r: &Replayable,
    p: &GpuPool,
    input: RNode<Vec<f32>>,
    read: RNode<(Vec<f32>, Vec<f32>)>,
    seed: u64,
    host_check: impl Fn(u64, &[f32], &[f32], &[f32]),
) {
    for run in 0..30u64 {
        let xs = values(M * K, seed + run);
        let out = r
            .run_with(p, RunInputs::new().set(input, xs.clone()))
            .unwrap_or_else(|e| panic!("replay run {run}: {}", chain(&e)));
        let (ry, rz) = (*out.get(read).unwrap()).clone();
        let eager = r
            .run_eager_with(p, RunInputs::new().set(input, xs.clone()))
            .unwrap_or_else(|e| panic!("eager run {run}: {}", chain(&e)));
        let (ey, ez) = (*eager.get(read).unwrap()).clone();
        assert_eq!(
            ry, ey,
            "run {run}: replayed f32 output differs from its eager run"
        );
        assert_eq!(
            rz, ez,
            "run {run}: replayed bf16 output differs from its eager run"
        );
        host_check(run, &xs, &ey, &ez);
    }
}

/// `h` (M×K) rounded to bf16 by the worker's cudarc kernel, as bits (`u16`): a node keeps the
/// buffer in its output (a free under a capture fails it) and reads it as bf16.
fn to_bf16_bits(
    g: &GpuCtx<'_, '_>,
    h: &DeviceBuffer<f32>,
) -> Result<DeviceBuffer<u16>, boundpool_gpu::BoxError> {
    let k = g.state::<Kernels>()?;
    let mut h16 = g.alloc::<u16>(M * K)?;
    let n = (M * K) as u32;
    // SAFETY: to_bf16(const float*, unsigned short*, unsigned) over `n` elements.
    unsafe {
        g.stream()
            .launch_builder(&k.to_bf16)
            .arg(h.as_cuda_slice())
            .arg(&mut h16)
            .arg(&n)
            .launch(CuLaunch::for_num_elems(n))?;
    }
    Ok(h16)
}

/// `h = 0.5 h + 0.25` over M×K elements, by the worker's cudarc kernel.
fn half_plus_quarter(
    g: &GpuCtx<'_, '_>,
    h: &mut DeviceBuffer<f32>,
) -> Result<(), boundpool_gpu::BoxError> {
    let k = g.state::<Kernels>()?;
    let n = (M * K) as u32;
    // SAFETY: affine(float, float, float*, unsigned) over `n` elements of `h`.
    unsafe {
        g.stream()
            .launch_builder(&k.affine)
            .arg(&0.5f32)
            .arg(&0.25f32)
            .arg(&mut *h)
            .arg(&n)
            .launch(CuLaunch::for_num_elems(n))?;
    }
    Ok(())
}
