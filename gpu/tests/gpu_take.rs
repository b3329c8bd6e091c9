//! `GpuCtx::take`: a GPU node writes its predecessor's `DeviceBuffer` in place, without a
//! `Mutex` or a raw address: a memset and a cuBLAS GEMM (`C = X W + C`, `beta = 1`) into the
//! very buffer the predecessor made (same device address), ordered after the predecessor's
//! work by its event (another group: another worker and stream) or its handed-over stream (the
//! same group), and a take refused by name when another node could read the buffer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use boundpool_gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool_gpu::cudarc::cublas::{Gemm, GemmConfig};
use boundpool_gpu::{GpuGraphBuilder, GpuGraphExt, GpuPool};
use boundpool_test_support::{chain, gpu_pool, GpuTest};

fn pool() -> GpuPool {
    gpu_pool("take", 4, 2)
}

const N: usize = 1 << 20;

#[test]
fn a_node_zeroes_its_predecessors_buffer_in_place() {
    let Some(_t) = GpuTest::start("a_node_zeroes_its_predecessors_buffer_in_place", 120) else {
        return;
    };
    let p = pool();
    let d = p.devices()[0].clone();
    // The taker on the other group (another worker and stream: the edge is an event), then
    // on the same group (the stream may be handed over).
    for taker_group in [1, 0] {
        let made_at = Arc::new(AtomicU64::new(0));
        let mut g = GpuGraphBuilder::new("memset in place");
        let m = made_at.clone();
        let a = g.gpu_node_in(d.groups()[0], "upload", move |ctx| {
            let buf = ctx.upload(&vec![7u32; N])?;
            m.store(buf.device_ptr(), Ordering::SeqCst);
            Ok(buf)
        });
        let m = made_at.clone();
        let b = g.gpu_node_in(d.groups()[taker_group], "zero", move |ctx| {
            let mut buf = ctx.take(a)?;
            assert_eq!(
                buf.device_ptr(),
                m.load(Ordering::SeqCst),
                "the same allocation"
            );
            // Enqueued after the upload on the device (a memset run first would leave 7s).
            ctx.memset_zero(&mut buf)?;
            Ok(buf)
        });
        let c = g.gpu_node_in(d.groups()[1 - taker_group], "download", move |ctx| {
            Ok(ctx.download(ctx.input(b)?)?)
        });
        g.hand_on(a, b).edge(b, c);
        let graph = g.build().unwrap();
        for run in 0..20 {
            let out = p
                .submit(&graph)
                .unwrap()
                .wait()
                .unwrap_or_else(|e| panic!("run {run}: {}", chain(&e)));
            assert!(out.get(a).is_none(), "taken: gone for the submitter");
            let host = out.get(c).unwrap();
            assert_eq!(host.len(), N);
            assert!(
                host.iter().all(|&x| x == 0),
                "run {run}: not zeroed in place"
            );
        }
    }
}

#[test]
fn a_gemm_accumulates_into_a_taken_buffer() {
    let Some(_t) = GpuTest::start("a_gemm_accumulates_into_a_taken_buffer", 120) else {
        return;
    };
    const M: usize = 64;
    const K: usize = 32;
    const NC: usize = 48;
    let p = pool();
    let d = p.devices()[0].clone();
    let x: Vec<f32> = (0..M * K).map(|i| (i % 7) as f32 - 3.0).collect();
    let w: Vec<f32> = (0..K * NC).map(|i| (i % 5) as f32 * 0.5).collect();
    let c0: Vec<f32> = (0..M * NC).map(|i| (i % 3) as f32).collect();
    let mut want = c0.clone();
    for j in 0..NC {
        for q in 0..K {
            for i in 0..M {
                want[i + j * M] += x[i + q * M] * w[q + j * K];
            }
        }
    }
    let mut g = GpuGraphBuilder::new("gemm in place");
    let (hx, hw, hc) = (x.clone(), w.clone(), c0.clone());
    let xw = g.gpu_node_in(d.groups()[0], "x and w", move |ctx| {
        Ok((ctx.upload(&hx)?, ctx.upload(&hw)?))
    });
    let c = g.gpu_node_in(d.groups()[1], "c", move |ctx| Ok(ctx.upload(&hc)?));
    let mm = g.gpu_node_in(d.groups()[0], "c += x w", move |ctx| {
        let (xd, wd) = ctx.input(xw)?;
        let mut cd = ctx.take(c)?;
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: M as i32,
            n: NC as i32,
            k: K as i32,
            alpha: 1.0f32,
            lda: M as i32,
            ldb: K as i32,
            beta: 1.0f32,
            ldc: M as i32,
        };
        // SAFETY: M×K, K×NC and M×NC column-major matrices.
        unsafe {
            ctx.cublas()?
                .gemm(cfg, xd.as_cuda_slice(), wd.as_cuda_slice(), &mut cd)?
        };
        Ok(cd)
    });
    let down = g.gpu_node_in(d.groups()[1], "download", move |ctx| {
        Ok(ctx.download(ctx.input(mm)?)?)
    });
    g.edge(xw, mm).hand_on(c, mm).edge(mm, down);
    let graph = g.build().unwrap();
    for run in 0..10 {
        let out = p
            .submit(&graph)
            .unwrap()
            .wait()
            .unwrap_or_else(|e| panic!("run {run}: {}", chain(&e)));
        let got = out.get(down).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-3 * w.abs().max(1.0),
                "run {run}, element {i}: {g} != {w}"
            );
        }
    }
}

#[test]
fn a_take_with_another_reader_is_refused_by_name() {
    let Some(_t) = GpuTest::start("a_take_with_another_reader_is_refused_by_name", 60) else {
        return;
    };
    let p = pool();
    let d = p.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("two readers");
    let a = g.gpu_node(&d, "buffer", |ctx| Ok(ctx.alloc_zeros::<u32>(16)?));
    let b = g.gpu_node(&d, "taker", move |ctx| {
        let mut buf = ctx.take(a)?;
        ctx.memset_zero(&mut buf)?;
        Ok(buf)
    });
    let reader = g.gpu_node(&d, "reader", move |ctx| Ok(ctx.input(a)?.len()));
    g.edge(a, b).edge(a, reader);
    let err = p
        .submit(&g.build().unwrap())
        .unwrap()
        .wait()
        .expect_err("the take must be refused");
    let msg = chain(&err);
    assert!(
        msg.contains("'taker'") && msg.contains("'buffer'") && msg.contains("'reader'"),
        "{msg}"
    );
}
