//! cuBLAS / cuSOLVER on bound workers (cudarc's `CudaBlas` and `DnHandle`, lent through
//! `GpuCtx::cublas` / `solver`) and per-worker state (the tiled Cholesky's tests, and its f64
//! routines', are the bench crate's, `benches/tests/gpu_cholesky.rs`). Run on a GPU machine
//! with `BOUNDPOOL_REQUIRE_GPU=1`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use boundpool_gpu::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use boundpool_gpu::{
    DeviceBuffer, Devices, GpuErrorKind, GpuGraphBuilder, GpuGraphExt, GpuPoolBuilder, NodeRef,
    ShutdownMode,
};
use boundpool_test_support::{cublas_stream, gpu_pool, solver_stream, GpuTest};

/// cudarc's f64 GEMM configuration: `C = alpha op(A) op(B) + beta C`, all `m`×`m`, leading
/// dimension `m` (`lda` given: 0 makes the call invalid).
fn gemm_config(transb: cublasOperation_t, m: i32, lda: i32, beta: f64) -> GemmConfig<f64> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb,
        m,
        n: m,
        k: m,
        alpha: 1.0,
        lda,
        ldb: m,
        beta,
        ldc: m,
    }
}

/// What a node saw: worker index, cuBLAS handle, cuSOLVER handle, the node's stream, the
/// stream each handle reported, and the cuBLAS handle's stream-set count.
type Seen = (usize, usize, usize, u64, u64, u64, u64);

/// What a chain's node hands on: `c`, its scratch `tmp`, and what each node so far saw (worker
/// index, the node's stream, the cuBLAS handle's stream and stream-set count).
type Carried = (
    DeviceBuffer<f64>,
    DeviceBuffer<f64>,
    Vec<(usize, u64, u64, u64)>,
);

#[test]
fn handles_are_per_worker_and_set_to_the_node_stream() {
    let Some(_t) = GpuTest::start("handles_are_per_worker_and_set_to_the_node_stream", 120) else {
        return;
    };
    let pool = gpu_pool("blas", 4, 1);
    let dev = pool.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("handles");
    let nodes: Vec<_> = (0..64)
        .map(|i| {
            g.gpu_node(&dev, &format!("n{i}"), move |ctx| -> Result<Seen, _> {
                // Some device work on the stream, so that nodes overlap and spread out.
                let x = ctx.upload(&[1.0f64; 64 * 64])?;
                let mut c = ctx.alloc_zeros::<f64>(64 * 64)?;
                let blas = ctx.cublas()?;
                let cfg = gemm_config(cublasOperation_t::CUBLAS_OP_T, 64, 64, 1.0);
                for _ in 0..20 {
                    // SAFETY: 64×64 matrices in live allocations of this node, `c` its own.
                    unsafe {
                        blas.gemm(cfg, x.as_cuda_slice(), x.as_cuda_slice(), &mut c)?;
                    }
                }
                let solver = ctx.solver()?;
                Ok((
                    ctx.node().worker_info().index,
                    *blas.handle() as usize,
                    solver.cu() as usize,
                    ctx.raw_stream(),
                    cublas_stream(&blas)?,
                    solver_stream(&solver)?,
                    blas.stream_sets(),
                ))
            })
        })
        .collect();
    let graph = g.build().unwrap();
    let out = pool.submit(&graph).unwrap().wait().unwrap();
    let mut blas_of: HashMap<usize, HashSet<usize>> = HashMap::new();
    let mut worker_of: HashMap<usize, HashSet<usize>> = HashMap::new();
    let mut solver_of: HashMap<usize, HashSet<usize>> = HashMap::new();
    for n in &nodes {
        let &(w, bh, sh, stream, bs, ss, sets) = out.get(*n).unwrap();
        assert_eq!(bs, stream, "cuBLAS handle not on the node's stream");
        assert_eq!(ss, stream, "cuSOLVER handle not on the node's stream");
        // Independent nodes run on their worker's own stream: the handle was set once.
        assert_eq!(sets, 1, "stream set again without a change of stream");
        blas_of.entry(w).or_default().insert(bh);
        solver_of.entry(w).or_default().insert(sh);
        worker_of.entry(bh).or_default().insert(w);
    }
    for (w, hs) in &blas_of {
        assert_eq!(
            hs.len(),
            1,
            "worker {w} used several cuBLAS handles: {hs:?}"
        );
    }
    for (w, hs) in &solver_of {
        assert_eq!(
            hs.len(),
            1,
            "worker {w} used several cuSOLVER handles: {hs:?}"
        );
    }
    for (h, ws) in &worker_of {
        assert_eq!(ws.len(), 1, "cuBLAS handle {h:#x} used by workers {ws:?}");
    }
    eprintln!(
        "{} workers ran the 64 nodes, one handle each",
        blas_of.len()
    );
}

#[test]
fn handle_on_a_handed_over_stream_is_set_to_it() {
    let Some(_t) = GpuTest::start("handle_on_a_handed_over_stream_is_set_to_it", 120) else {
        return;
    };
    // Two one-worker groups and a pure chain alternating between them (each node has exactly
    // one GPU successor): every node after the first enqueues on the first node's stream,
    // the odd ones from the other group's worker, whose handle must follow that stream.
    let pool = gpu_pool("blas", 2, 2);
    let dev = pool.devices()[0].clone();
    let groups = dev.groups().to_vec();
    let two = Arc::new(pool.call(&dev, |ctx| Ok(ctx.upload(&[2.0f64])?)).unwrap());
    let mut g = GpuGraphBuilder::new("pure chain");
    let mut prev: Option<NodeRef<Carried>> = None;
    for i in 0..6 {
        let two = two.clone();
        let n = g.gpu_node_in(groups[i % 2], &format!("c{i}"), move |ctx| {
            // `c` and its scratch `tmp`, handed on by the previous node (its only reader: it
            // takes them, no lock), or made by the first (c = 1).
            let (mut c, mut tmp, mut seen) = match prev {
                Some(p) => ctx.take(p)?,
                None => (ctx.upload(&[1.0f64])?, ctx.alloc::<f64>(1)?, Vec::new()),
            };
            // c = 2 · c, through tmp, so a node that ran out of order would leave a wrong value.
            ctx.copy_device(&c, &mut tmp)?;
            let blas = ctx.cublas()?;
            let cfg = gemm_config(cublasOperation_t::CUBLAS_OP_N, 1, 1, 0.0);
            // SAFETY: one-element buffers on this node's device, `c` borrowed mutably.
            unsafe {
                blas.gemm(cfg, two.as_cuda_slice(), tmp.as_cuda_slice(), &mut c)?;
            }
            seen.push((
                ctx.node().worker_info().index,
                ctx.raw_stream(),
                cublas_stream(&blas)?,
                blas.stream_sets(),
            ));
            Ok((c, tmp, seen))
        });
        if let Some(p) = prev {
            g.hand_on(p, n);
        }
        prev = Some(n);
    }
    let last = prev.expect("six nodes");
    let out = pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    let (c, _, seen) = out.get(last).unwrap();
    assert_eq!(
        pool.download(c).unwrap(),
        vec![64.0],
        "six doublings in order"
    );
    assert_eq!(seen.len(), 6);
    let s0 = seen[0].1;
    let mut workers = HashSet::new();
    for (i, &(w, stream, blas_stream, sets)) in seen.iter().enumerate() {
        workers.insert(w);
        assert_eq!(
            stream, s0,
            "node c{i} did not enqueue on the handed-over stream"
        );
        assert_eq!(
            blas_stream, stream,
            "node c{i}: cuBLAS handle on another stream"
        );
        // Each worker's handle was set once (to the chain's stream) and never again.
        assert_eq!(
            sets, 1,
            "node c{i}: the stream was set again without a change"
        );
    }
    assert_eq!(workers.len(), 2, "both workers ran the chain");
}

/// (what happened, worker name, thread): the probes' log.
type ProbeLog = Arc<Mutex<Vec<(&'static str, String, ThreadId)>>>;

/// A worker state that logs where it was made and dropped.
struct Probe {
    worker: String,
    made_on: ThreadId,
    log: ProbeLog,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.log
            .lock()
            .unwrap()
            .push(("drop", self.worker.clone(), std::thread::current().id()));
    }
}

#[test]
fn worker_state_is_made_and_dropped_on_its_worker() {
    let Some(_t) =
        GpuTest::start_without_context_check("worker_state_is_made_and_dropped_on_its_worker", 120)
    else {
        return;
    };
    let log: ProbeLog = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let pool = GpuPoolBuilder::new()
        .devices(Devices::List(vec![0]))
        .workers_per_device(3)
        .worker_state(move |setup| {
            let me = std::thread::current().id();
            l.lock()
                .unwrap()
                .push(("make", setup.worker().name.clone(), me));
            Ok(Probe {
                worker: setup.worker().name.clone(),
                made_on: me,
                log: l.clone(),
            })
        })
        .build()
        .unwrap();
    let dev = pool.devices()[0].clone();
    let mut g = GpuGraphBuilder::new("state");
    for i in 0..30 {
        g.gpu_node(&dev, &format!("s{i}"), |ctx| {
            let p = ctx.state::<Probe>()?;
            assert_eq!(
                p.made_on,
                std::thread::current().id(),
                "state of another thread"
            );
            assert_eq!(p.worker, ctx.node().worker_info().name);
            let missing = ctx.state::<String>().expect_err("no String state");
            assert!(missing.message().contains("String"), "{missing}");
            Ok(())
        });
    }
    pool.submit(&g.build().unwrap()).unwrap().wait().unwrap();
    pool.shutdown(ShutdownMode::Finish);
    drop(pool);
    let log = log.lock().unwrap();
    let main = std::thread::current().id();
    let made: Vec<_> = log.iter().filter(|e| e.0 == "make").collect();
    let dropped: Vec<_> = log.iter().filter(|e| e.0 == "drop").collect();
    assert_eq!(made.len(), 3, "{log:?}");
    assert_eq!(dropped.len(), 3, "{log:?}");
    for m in &made {
        assert_ne!(m.2, main, "made on the main thread");
        let d = dropped
            .iter()
            .find(|d| d.1 == m.1)
            .unwrap_or_else(|| panic!("{} never dropped", m.1));
        assert_eq!(d.2, m.2, "{}: dropped on another thread than made", m.1);
    }
}

#[test]
fn failing_worker_state_fails_build_naming_the_worker() {
    let Some(_t) = GpuTest::start_without_context_check(
        "failing_worker_state_fails_build_naming_the_worker",
        120,
    ) else {
        return;
    };
    // Repeated: the failing worker may stop (and, alone on the device, release it) before the
    // others bind; that once handed them a released context (a segfault). Each time the error
    // names the failing worker's reason, whichever worker the scheduler reports.
    for _ in 0..20 {
        let e = GpuPoolBuilder::new()
            .devices(Devices::List(vec![0]))
            .workers_per_device(4)
            .worker_state(|setup| -> Result<u32, boundpool_gpu::BoxError> {
                if setup.worker().index_in_group == 1 {
                    Err("no plan for this worker".into())
                } else {
                    Ok(7)
                }
            })
            .build()
            .expect_err("a failing factory fails build");
        let msg = e.to_string();
        assert!(msg.contains("no plan for this worker"), "{msg}");
        assert!(msg.contains("gpu0-1") || msg.contains("worker"), "{msg}");
    }
    // The device is usable afterwards (the other worker released its context).
    let p = gpu_pool("blas", 1, 1);
    let dev = p.devices()[0].clone();
    assert_eq!(p.call(&dev, |_| Ok(5)).unwrap(), 5);
}

#[test]
fn library_status_is_named() {
    let Some(_t) = GpuTest::start_without_context_check("library_status_is_named", 120) else {
        return;
    };
    let pool = gpu_pool("blas", 4, 1);
    let dev = pool.devices()[0].clone();
    // A library status by name: an illegal argument to cuBLAS, through cudarc's `Gemm`.
    let e = pool
        .call(&dev, |ctx| {
            let a = ctx.alloc_zeros::<f64>(16)?;
            let mut c = ctx.alloc_zeros::<f64>(16)?;
            let blas = ctx.cublas()?;
            let cfg = gemm_config(cublasOperation_t::CUBLAS_OP_N, 4, 0, 0.0);
            // SAFETY: lda = 0 is rejected by the library before any access.
            unsafe { blas.gemm(cfg, a.as_cuda_slice(), a.as_cuda_slice(), &mut c)? };
            Ok(())
        })
        .expect_err("lda = 0 is invalid");
    assert!(e.to_string().contains("CUBLAS_STATUS_INVALID_VALUE"), "{e}");
    assert!(e.to_string().contains("node 'call'"), "{e}");
    assert_eq!(e.kind(), GpuErrorKind::Scheduler);
}

/// The cuSOLVER workspace a node is lent is its worker's for the node's stream: grown when a
/// call asks for more, kept (not shrunk) for later calls and later nodes.
#[test]
fn solver_workspace_grows_and_is_kept() {
    let Some(_t) = GpuTest::start("solver_workspace_grows_and_is_kept", 120) else {
        return;
    };
    let pool = gpu_pool("blas", 1, 1);
    let dev = pool.devices()[0].clone();
    let lens = pool
        .call(&dev, |ctx| {
            let mut solver = ctx.solver()?;
            let small = solver.workspace(100)?.len();
            let big = solver.workspace(1 << 20)?.len();
            let again = solver.workspace(10)?.len();
            Ok((small, big, again))
        })
        .unwrap();
    assert_eq!(lens, (100, 1 << 20, 1 << 20));
    let later = pool
        .call(&dev, |ctx| Ok(ctx.solver()?.workspace(10)?.len()))
        .unwrap();
    assert_eq!(later, 1 << 20, "the next node got a new workspace");
}
