//! cudarc inside nodes: a node's stream and context as cudarc's types, cudarc kernels through
//! `launch_builder`, typed cuBLAS GEMMs in every precision (`GpuCtx::cublas`), buffers moving
//! between `DeviceBuffer` and `CudaSlice` without a copy and dropped on foreign threads, and a
//! replayed chain of GEMMs and cudarc kernels against its eager run with changing inputs.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool_gpu::cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use boundpool_gpu::cudarc::driver::{
    CudaFunction, CudaSlice, LaunchConfig as CuLaunch, PushKernelArg,
};
use boundpool_gpu::half::{bf16, f16};
use boundpool_gpu::{
    DeviceBuffer, Devices, GpuGraphBuilder, GpuGraphExt, GpuPool, GpuPoolBuilder, ReplayBuilder,
    ReplayCtx,
};
use common::{chain, GpuTest};

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
    GpuPoolBuilder::new()
        .name("cudarc")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .groups_per_device(groups)
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
        unsafe {
            blas.gemm(
                cfg,
                xb.as_cuda_slice(),
                wb.as_cuda_slice(),
                c.as_cuda_slice_mut(),
            )?
        };
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
            unsafe { ctx.cublas()?.gemm(cfg, &*ad, &*bd, &mut *c)? };
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
                    .gemm_strided_batched(cfg, &*ad, &*bd, &mut *c)?
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
    let x = Arc::new(Mutex::new(x));
    let weights = Arc::new((w1d, w2d, wbd));
    let input: Arc<Mutex<Vec<f32>>> = Arc::new(Mutex::new(values(M * K, 100)));

    let mut b = ReplayBuilder::new("gemm chain");
    let (xi, inp) = (x.clone(), input.clone());
    let load = b.eager_gpu_node(&d, "load input", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let host = inp.lock().unwrap().clone();
        g.copy_to_device(&host, &mut xi.lock().unwrap())?;
        Ok(())
    });
    let (xi, ws) = (x.clone(), weights.clone());
    // H = X W1 (f32), then H = 0.5 H + 0.25 (a cudarc kernel), in one node.
    let h = b.gpu_node(&d, "gemm1 + affine", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let mut h = g.alloc::<f32>(M * K)?;
        let xg = xi.lock().unwrap();
        // SAFETY: M×K times K×K into M×K, column-major.
        unsafe {
            g.cublas()?
                .gemm(gemm_cfg(M, K, K, 1.0f32, 0.0), &**xg, &*ws.0, &mut *h)?
        };
        let k = g.state::<Kernels>()?;
        let n = (M * K) as u32;
        // SAFETY: affine(float, float, float*, unsigned) over `n` elements of `h`.
        unsafe {
            g.stream()
                .launch_builder(&k.affine)
                .arg(&0.5f32)
                .arg(&0.25f32)
                .arg(h.as_cuda_slice_mut())
                .arg(&n)
                .launch(CuLaunch::for_num_elems(n))?;
        }
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
                .gemm(gemm_cfg(M, N, K, 1.0f32, 0.0), &**hv, &*ws2.1, &mut *y)?
        };
        Ok(y)
    });
    let ws3 = weights.clone();
    // Z = bf16(H) Wb (bf16), beside gemm2.
    let z = b.gpu_node(&d, "bf16 gemm", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let hv = c.input(h)?;
        let k = g.state::<Kernels>()?;
        let mut h16 = g.alloc::<u16>(M * K)?;
        let n = (M * K) as u32;
        // SAFETY: to_bf16(const float*, unsigned short*, unsigned) over `n` elements.
        unsafe {
            g.stream()
                .launch_builder(&k.to_bf16)
                .arg(hv.as_cuda_slice())
                .arg(h16.as_cuda_slice_mut())
                .arg(&n)
                .launch(CuLaunch::for_num_elems(n))?;
        }
        // SAFETY: u16 and bf16 have the same size and every bit pattern is a bf16; the
        // buffer's memory is reinterpreted, not freed.
        let h16b = unsafe { h16.transmute::<bf16>(M * K) }.expect("same size");
        let mut z = g.alloc::<bf16>(M * N)?;
        let cfg = gemm_cfg(M, N, K, bf16::from_f32(1.0), bf16::from_f32(0.0));
        // SAFETY: M×K times K×N into M×N.
        unsafe { g.cublas()?.gemm(cfg, &h16b, &*ws3.2, &mut *z)? };
        Ok((z, h16))
    });
    let read = b.eager_gpu_node(&d, "read", move |c: &ReplayCtx<'_, '_>| {
        let g = c.gpu()?;
        let yv = g.download(&*c.input(y)?)?;
        let zv: Vec<bf16> = g.download(&c.input(z)?.0)?;
        Ok((yv, zv.iter().map(|v| v.to_f32()).collect::<Vec<f32>>()))
    });
    b.edge(load, h)
        .edge(h, y)
        .edge(h, z)
        .edge(y, read)
        .edge(z, read);
    let r = b.build().unwrap();
    for run in 0..30u64 {
        let xs = values(M * K, 1000 + run);
        *input.lock().unwrap() = xs.clone();
        let out = r
            .run(&p)
            .unwrap_or_else(|e| panic!("replay run {run}: {}", chain(&e)));
        let (ry, rz) = (*out.get(read).unwrap()).clone();
        let eager = r
            .run_eager(&p)
            .unwrap_or_else(|e| panic!("eager run {run}: {}", chain(&e)));
        let (ey, ez) = (*eager.get(read).unwrap()).clone();
        assert_eq!(
            ry, ey,
            "run {run}: replayed f32 chain differs from its eager run"
        );
        assert_eq!(
            rz, ez,
            "run {run}: replayed bf16 GEMM differs from its eager run"
        );
        // And both against the host.
        let hh: Vec<f32> = host_gemm(&xs, &w1, M, K, K)
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
    }
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
            let rng = boundpool_gpu::cudarc::curand::CudaRng::new(42, ctx.stream().clone())?;
            let mut x = ctx.alloc::<f32>(n)?;
            rng.fill_with_uniform(x.as_cuda_slice_mut())?;
            drop(rng);
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
            // cudarc's cuBLASLt handle, made on the node's stream (its workspace too).
            let lt = CudaBlasLT::new(ctx.stream().clone())?;
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
            unsafe {
                lt.matmul(
                    cfg,
                    &*ad,
                    &*bd,
                    &mut *c,
                    Some(&*biasd),
                    Some(&Activation::Relu),
                )?
            };
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
