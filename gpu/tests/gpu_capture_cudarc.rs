//! cudarc calls inside a captured replay node: each works under capture and replay (the
//! results checked over several relaunches with new inputs, and again after an update), or
//! the capture fails with an error naming the graph, the node and the call, and the graph's
//! later runs go eager (correct results, no second capture attempt) until `update`. Never a
//! graph that replays wrong or breaks on relaunch.
//!
//! Each test prints its outcome (`CAPTURE CASE <name>: works` / `refused: <error>`) on the real
//! stderr, so the device run's log gives the table. Which case is refused by whom (boundpool's
//! check of the captured graph, `replay/check.rs`, or the driver and the libraries) is in
//! `gpu/README.md`.

use std::sync::Arc;

use boundpool_gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool_gpu::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use boundpool_gpu::cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use boundpool_gpu::cudarc::curand::CudaRng;
use boundpool_gpu::cudarc::driver::{
    CudaFunction, CudaSlice, CudaViewMut, LaunchConfig, PushKernelArg,
};
use boundpool_gpu::cudarc::nvrtc::Ptx;
use boundpool_gpu::{
    builtin, BoxError, DeviceBuffer, GpuCtx, GpuPool, RNode, ReplayBuilder, ReplayCtx, Replayable,
    RunInputs,
};
use boundpool_test_support::{chain, gpu_pool_builder, uncaptured_notice, GpuTest};

/// Elements per buffer: a 64×64 matrix for the BLAS cases.
const DIM: usize = 64;
const N: usize = DIM * DIM;
/// Runs per case after the first.
const RUNS: usize = 5;

/// Each worker's cudarc function, loaded at start (outside any capture).
struct Kernels {
    scale: CudaFunction,
}

fn pool() -> GpuPool {
    gpu_pool_builder(2, 1)
        .name("capture-cudarc")
        .host_workers(1, boundpool_gpu::Cores::Unpinned)
        .worker_state(|s| {
            let m = s.context().load_module(Ptx::from_src(builtin::PTX))?;
            Ok(Kernels {
                scale: m.load_function(builtin::SCALE_F32)?,
            })
        })
        .build()
        .expect("GPU pool")
}

/// Run `run`'s input: small integers, exact in f32 (and TF32) times 2 or 3.
fn input(run: usize) -> Vec<f32> {
    (0..N).map(|j| ((run * 7 + j) % 13) as f32).collect()
}

/// `x *= a` over `x`'s N elements with the worker's cudarc kernel, on the node's stream.
fn scale(g: &GpuCtx<'_, '_>, mut x: CudaViewMut<'_, f32>, a: f32) -> Result<(), BoxError> {
    let k = g.state::<Kernels>()?;
    let n = N as u32;
    // SAFETY: bp_scale_f32(f32* x, f32 a, u32 n) over `x`'s N elements.
    unsafe {
        g.stream()
            .launch_builder(&k.scale)
            .arg(&mut x)
            .arg(&a)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))?;
    }
    Ok(())
}

/// A replay graph around one captured node, `"<case> body"`: an input node `x` (a run's
/// values), a captured node making the static input buffer, an eager node uploading `x` into
/// it, the node under test (`body`, given the input buffer, its output kept), and an eager
/// node reading the result back (`read`).
fn graph<T, B, R>(
    p: &GpuPool,
    case: &str,
    body: B,
    read: R,
) -> (Replayable, RNode<Vec<f32>>, RNode<Vec<f32>>)
where
    T: Send + Sync + 'static,
    B: Fn(&GpuCtx<'_, '_>, &DeviceBuffer<f32>) -> Result<T, BoxError> + Send + Sync + 'static,
    R: Fn(&GpuCtx<'_, '_>, &T) -> Result<Vec<f32>, BoxError> + Send + Sync + 'static,
{
    let dev = p.devices()[0].clone();
    let mut b = ReplayBuilder::new(case);
    let x = b.input::<Vec<f32>>("x");
    let buf = b.gpu_node(&dev, "input buffer", |c: &ReplayCtx<'_, '_>| {
        Ok(c.gpu()?.alloc::<f32>(N)?)
    });
    let up = b.eager_gpu_node(&dev, "upload", move |c: &ReplayCtx<'_, '_>| {
        c.copy_into(&c.input(x)?, &*c.input(buf)?)?;
        Ok(())
    });
    let node = format!("{case} body");
    let t = b.gpu_node(&dev, &node, move |c: &ReplayCtx<'_, '_>| {
        body(c.gpu()?, &*c.input(buf)?)
    });
    let res = b.eager_gpu_node(&dev, "read", move |c: &ReplayCtx<'_, '_>| {
        read(c.gpu()?, &*c.input(t)?)
    });
    b.edge(x, up)
        .edge(buf, up)
        .edge(up, t)
        .edge(buf, t)
        .edge(t, res);
    (b.build().expect("replay graph"), x, res)
}

fn read_buffer(g: &GpuCtx<'_, '_>, out: &DeviceBuffer<f32>) -> Result<Vec<f32>, BoxError> {
    Ok(g.download(out)?)
}

/// What a case does under capture and replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Works: captured and replayed, results right at every relaunch.
    Works,
    /// Refused, the error naming one of these calls.
    Refused(&'static [&'static str]),
}

/// Runs the case's graph `1 + RUNS` times with new inputs, each result checked against
/// `want(input)`; asserts the outcome `expect` allows, and returns whether it worked.
fn check_case(
    p: &GpuPool,
    case: &str,
    (r, x, res): (Replayable, RNode<Vec<f32>>, RNode<Vec<f32>>),
    want: impl Fn(&[f32]) -> Vec<f32>,
    expect: Expect,
) -> bool {
    let run = |i: usize| {
        let xi = input(i);
        let out = r.run_with(p, RunInputs::new().set(x, xi.clone()));
        out.map(|o| {
            let got = o.get(res).expect("the read node's output");
            assert_eq!(*got, want(&xi), "{case}: run {i}'s result");
        })
    };
    match run(0) {
        Ok(()) => {
            assert!(
                !matches!(expect, Expect::Refused(_)),
                "{case}: the capture should have been refused"
            );
            for i in 1..=RUNS {
                run(i).unwrap_or_else(|e| panic!("{case}: replay {i}: {}", chain(&e)));
            }
            let s = r.stats();
            assert_eq!((s.captures, s.failed_captures), (2, 0), "{case}: {s:?}");
            assert_eq!(s.eager_fallbacks, 0, "{case}: {s:?}");
            // A new capture (updated in place, or re-instantiated where the graph's memory
            // nodes keep the driver from updating) replays right too.
            r.update();
            for i in RUNS + 1..RUNS + 4 {
                run(i).unwrap_or_else(|e| panic!("{case}: after update, run {i}: {}", chain(&e)));
            }
            assert_eq!(r.stats().captures, 4, "{case}: {:?}", r.stats());
            uncaptured_notice(&format!(
                "CAPTURE CASE {case}: works ({} runs, an update, 2 captures per generation: \
                 the input buffer's segment and the node's; update fallbacks {})",
                RUNS + 4,
                r.stats().update_fallbacks
            ));
            true
        }
        Err(e) => {
            let msg = chain(&e);
            let calls = match expect {
                Expect::Works => panic!("{case}: the capture should work: {msg}"),
                Expect::Refused(c) => c,
            };
            assert!(
                msg.contains(&format!(
                    "replay capture of graph '{case}' failed at node '{case} body'"
                )),
                "{case}: the error names the graph and the node: {msg}"
            );
            assert!(
                calls.iter().any(|c| msg.contains(c)),
                "{case}: the error names the call (one of {calls:?}): {msg}"
            );
            assert_eq!(r.stats().failed_captures, 1, "{case}: {:?}", r.stats());
            assert!(
                r.capture_failure()
                    .is_some_and(|m| m.contains(&format!("'{case} body'"))),
                "{case}: {:?}",
                r.capture_failure()
            );
            // Later runs go eager, right, with no second capture attempt.
            for i in 1..=RUNS {
                run(i).unwrap_or_else(|e| panic!("{case}: eager run {i}: {}", chain(&e)));
            }
            let s = r.stats();
            assert_eq!(s.failed_captures, 1, "{case}: no capture retried: {s:?}");
            assert_eq!(s.eager_fallbacks, RUNS as u64, "{case}: {s:?}");
            uncaptured_notice(&format!("CAPTURE CASE {case}: refused: {msg}"));
            false
        }
    }
}

fn twice(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| 2.0 * v).collect()
}

fn thrice(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| 3.0 * v).collect()
}

#[test]
fn a_slice_allocated_and_dropped_in_the_body_is_freed_by_the_graph() {
    let Some(_t) = GpuTest::start(
        "a_slice_allocated_and_dropped_in_the_body_is_freed_by_the_graph",
        300,
    ) else {
        return;
    };
    let p = pool();
    let case = "alloc_zeros dropped in the body";
    let body = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| {
        let s = g.stream();
        // A scratch slice of the graph's own: allocated and freed by graph memory nodes.
        let mut tmp = s.alloc_zeros::<f32>(N)?;
        s.memcpy_dtod(inb, &mut tmp)?;
        scale(g, tmp.as_view_mut(), 2.0)?;
        let mut out = g.alloc::<f32>(N)?;
        s.memcpy_dtod(&tmp, &mut out)?;
        drop(tmp);
        Ok(out)
    };
    let worked = check_case(
        &p,
        case,
        graph(&p, case, body, read_buffer),
        twice,
        Expect::Works,
    );
    assert!(worked);
}

#[test]
fn clone_htod_from_pageable_memory_is_refused_by_name() {
    let Some(_t) = GpuTest::start("clone_htod_from_pageable_memory_is_refused_by_name", 300) else {
        return;
    };
    let p = pool();
    let case = "clone_htod in the body";
    let body = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| {
        let s = g.stream();
        let threes = vec![3.0f32; N];
        // Pageable host memory: a replay would copy from wherever `threes` was.
        let d = s.clone_htod(&threes)?;
        let mut out = g.alloc::<f32>(N)?;
        s.memcpy_dtod(inb, &mut out)?;
        scale(g, out.as_view_mut(), 3.0)?;
        drop(d);
        Ok(out)
    };
    let calls: &[&str] = &["clone_htod"];
    check_case(
        &p,
        case,
        graph(&p, case, body, read_buffer),
        thrice,
        Expect::Refused(calls),
    );
}

/// A slice allocated under the capture and kept as the node's output.
fn kept_slice(g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>) -> Result<CudaSlice<f32>, BoxError> {
    let s = g.stream();
    let mut out = s.alloc_zeros::<f32>(N)?;
    s.memcpy_dtod(inb, &mut out)?;
    scale(g, out.as_view_mut(), 2.0)?;
    Ok(out)
}

#[test]
fn a_slice_allocated_in_the_body_and_kept_is_refused_adopted_or_not() {
    let Some(_t) = GpuTest::start(
        "a_slice_allocated_in_the_body_and_kept_is_refused_adopted_or_not",
        300,
    ) else {
        return;
    };
    let p = pool();
    let calls: &[&str] = &["not freed inside the capture", "alloc_zeros"];
    let case = "a slice kept as the output";
    let read = |g: &GpuCtx<'_, '_>, out: &CudaSlice<f32>| Ok(g.stream().clone_dtoh(out)?);
    check_case(
        &p,
        case,
        graph(&p, case, kept_slice, read),
        twice,
        Expect::Refused(calls),
    );
    let case = "an adopted slice kept as the output";
    let adopted = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| Ok(g.adopt(kept_slice(g, inb)?)?);
    check_case(
        &p,
        case,
        graph(&p, case, adopted, read_buffer),
        twice,
        Expect::Refused(calls),
    );
    // The refused captures' slices left nothing behind: a plain node still allocates, runs
    // cudarc code and frees.
    let d = p.devices()[0].clone();
    let v = p
        .call(&d, |g| {
            let x = g.stream().clone_htod(&input(1))?;
            Ok(g.stream().clone_dtoh(&x)?)
        })
        .expect("a node after the refused captures");
    assert_eq!(v, input(1));
}

#[test]
fn a_module_loaded_in_the_body_is_refused_by_name() {
    let Some(_t) = GpuTest::start("a_module_loaded_in_the_body_is_refused_by_name", 300) else {
        return;
    };
    let p = pool();
    let case = "load_module in the body";
    // Under the capture the call is made (and refused by name); an eager run makes it
    // outside any other graph's capture, as the crate docs ask of calls that synchronise.
    let body = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| {
        g.outside_captures(|| -> Result<_, BoxError> {
            let m = g.context().load_module(Ptx::from_src(builtin::PTX))?;
            let f = m.load_function(builtin::SCALE_F32)?;
            let s = g.stream();
            let mut out = g.alloc::<f32>(N)?;
            s.memcpy_dtod(inb, &mut out)?;
            let n = N as u32;
            // SAFETY: bp_scale_f32(f32* x, f32 a, u32 n) over `out`'s N elements.
            unsafe {
                s.launch_builder(&f)
                    .arg(&mut out)
                    .arg(&3.0f32)
                    .arg(&n)
                    .launch(LaunchConfig::for_num_elems(n))?;
            }
            Ok(out)
        })
    };
    let calls: &[&str] = &["load_module"];
    check_case(
        &p,
        case,
        graph(&p, case, body, read_buffer),
        thrice,
        Expect::Refused(calls),
    );
}

fn identity() -> Vec<f32> {
    (0..N)
        .map(|i| if i % DIM == i / DIM { 1.0 } else { 0.0 })
        .collect()
}

#[test]
fn a_cudablas_made_in_the_body_is_refused_by_name() {
    let Some(_t) = GpuTest::start("a_cudablas_made_in_the_body_is_refused_by_name", 300) else {
        return;
    };
    let p = pool();
    let case = "CudaBlas made in the body";
    // Under the capture the call is made (and refused by name); an eager run makes it
    // outside any other graph's capture, as the crate docs ask of calls that synchronise.
    let body = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| {
        g.outside_captures(|| -> Result<_, BoxError> {
            let eye = g.upload(&identity())?;
            let mut out = g.alloc::<f32>(N)?;
            let blas = CudaBlas::new(g.stream().clone())?;
            let d = DIM as i32;
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: d,
                n: d,
                k: d,
                alpha: 2.0f32,
                lda: d,
                ldb: d,
                beta: 0.0,
                ldc: d,
            };
            // SAFETY: three DIM×DIM column-major matrices.
            unsafe { blas.gemm(cfg, inb, &eye, &mut out)? };
            drop(blas);
            // The identity is kept with the output: a free under the capture would be refused.
            Ok((out, eye))
        })
    };
    let read =
        |g: &GpuCtx<'_, '_>, o: &(DeviceBuffer<f32>, DeviceBuffer<f32>)| Ok(g.download(&o.0)?);
    let calls: &[&str] = &["CudaBlas"];
    check_case(
        &p,
        case,
        graph(&p, case, body, read),
        twice,
        Expect::Refused(calls),
    );
}

#[test]
fn a_cudablaslt_made_in_the_body_is_refused_by_name() {
    let Some(_t) = GpuTest::start("a_cudablaslt_made_in_the_body_is_refused_by_name", 300) else {
        return;
    };
    let p = pool();
    let case = "CudaBlasLT made in the body";
    // Under the capture the call is made (and refused by name); an eager run makes it
    // outside any other graph's capture, as the crate docs ask of calls that synchronise.
    let body = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| {
        g.outside_captures(|| -> Result<_, BoxError> {
            let eye = g.upload(&identity())?;
            let mut out = g.alloc::<f32>(N)?;
            // Its workspace is a slice it allocates on the stream (and frees when dropped).
            let lt = CudaBlasLT::new(g.stream().clone())?;
            let d = DIM as u64;
            let cfg = MatmulConfig {
                transa: false,
                transb: false,
                transc: false,
                m: d,
                n: d,
                k: d,
                alpha: 2.0,
                lda: d as i64,
                ldb: d as i64,
                beta: 0.0,
                ldc: d as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            };
            // SAFETY: three DIM×DIM column-major matrices, no bias.
            unsafe { lt.matmul(cfg, inb, &eye, &mut out, None, None)? };
            drop(lt);
            Ok((out, eye))
        })
    };
    let read =
        |g: &GpuCtx<'_, '_>, o: &(DeviceBuffer<f32>, DeviceBuffer<f32>)| Ok(g.download(&o.0)?);
    let calls: &[&str] = &["CudaBlasLT"];
    check_case(
        &p,
        case,
        graph(&p, case, body, read),
        twice,
        Expect::Refused(calls),
    );
}

#[test]
fn curand_in_the_body_is_refused_by_name() {
    let Some(_t) = GpuTest::start("curand_in_the_body_is_refused_by_name", 300) else {
        return;
    };
    let p = pool();
    let case = "CudaRng made in the body";
    // The body draws into its output (the input is not read): the result is the draw, the
    // same at every run whether replayed (the captured draw) or eager (a new generator of the
    // same seed each run).
    // Under the capture the call is made (and refused by name); an eager run makes it
    // outside any other graph's capture, as the crate docs ask of calls that synchronise.
    let body = |g: &GpuCtx<'_, '_>, inb: &DeviceBuffer<f32>| {
        g.outside_captures(|| -> Result<_, BoxError> {
            let rng = CudaRng::new(42, g.stream().clone())?;
            let mut out = g.alloc::<f32>(N)?;
            rng.fill_with_uniform(&mut out)?;
            drop(rng);
            let _ = inb;
            Ok(out)
        })
    };
    let first: Arc<std::sync::Mutex<Option<Vec<f32>>>> = Arc::default();
    let seen = first.clone();
    let want = move |_x: &[f32]| -> Vec<f32> {
        seen.lock()
            .unwrap()
            .clone()
            .expect("the first run's draw is recorded by the read node")
    };
    let record = first.clone();
    let read = move |g: &GpuCtx<'_, '_>, out: &DeviceBuffer<f32>| {
        let v = g.download(out)?;
        assert!(
            v.iter().all(|&u| u > 0.0 && u <= 1.0),
            "uniform draws lie in (0, 1]"
        );
        record.lock().unwrap().get_or_insert_with(|| v.clone());
        Ok(v)
    };
    let calls: &[&str] = &["CudaRng"];
    check_case(
        &p,
        case,
        graph(&p, case, body, read),
        want,
        Expect::Refused(calls),
    );
}
