//! `boundpool soak`: many submitter threads run random graphs with injected faults for a while,
//! and every outcome and every resource is checked.
//!
//! Each submitter loops over scenarios picked by its own seeded generator:
//!
//! * **plain**: a random DAG of host nodes, each returning `base(i) + Σ inputs` (wrapping); every
//!   node's output is compared with the same sum computed on the host.
//! * **error** / **panic**: the same with one node made to return an error or to panic; the graph
//!   must fail with an error whose kind says so and whose message names that node.
//! * **cancel**: a chain on a separate, short-lived one-worker pool, shut down with
//!   [`ShutdownMode::Cancel`] while it runs: the graph either finished (values checked) or failed
//!   as cancelled; a submit after the shutdown must fail as shut down.
//! * **nested**: a node that submits a subgraph to the pool from inside and waits on it (with a
//!   fault in the subgraph at times: the outer error must name both nodes).
//! * **dropped**: a graph whose handle is dropped without waiting; it must still run every node,
//!   and release everything it holds (a sentinel it captures must be freed) within 10 s.
//! * **gpu** (with `--gpu`): a random DAG of GPU nodes (spin, set, add on one-element device
//!   buffers), half of them through cudarc's types (the node's `CudaStream`, `launch_builder`,
//!   `alloc_zeros`, the slice adopted into a `DeviceBuffer`); the sinks and one other node are
//!   downloaded and compared with the host's sums, and the buffers are dropped on the submitter
//!   thread (not a worker).
//!
//! Meanwhile the main thread samples the process's OS threads (`/proc/self/task`): they must stay
//! at main + workers + submitters, plus the workers of the short-lived pools alive at that moment.
//! At the end it checks that resident memory, and with `--gpu` the device's free memory, its live
//! allocations and its event table, are back to their level after the warm-up.

use std::collections::HashMap;
use std::panic;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, Weak};
use std::time::{Duration, Instant};

use boundpool::bounded;
use boundpool::gpu::cudarc::driver::{CudaFunction, LaunchConfig as CuLaunch, PushKernelArg};
use boundpool::gpu::cudarc::nvrtc::Ptx;
use boundpool::gpu::{
    builtin, DeviceBuffer, Devices, GpuCtx, GpuDevice, GpuGraphBuilder, GpuGraphExt, GpuPool,
    GpuPoolBuilder, GpuWorker, Kernel, LaunchConfig, Module,
};
use boundpool::{
    default_workers, BoxError, ErrorKind, Graph, GraphBuilder, NodeRef, Pool, PoolBuilder,
    ShutdownMode,
};
use boundpool_workloads::busy_work;
use serde_json::json;

use crate::SoakArgs;

/// The text every injected panic starts with (the panic hook keeps these off stderr).
const PANIC_TAG: &str = "soak: injected panic";
/// How long a dropped handle's graph may take to run and release what it holds.
const DROPPED_GRACE: Duration = Duration::from_secs(10);
/// Resident memory may end this much above its level after the warm-up. The allocator keeps
/// freed memory in per-thread arenas (glibc: up to 8 per core) and returns it to the OS only
/// when an arena's top is free, so the level moves by a few MiB with the last burst; a leak of
/// one allocation a graph grows by far more over the millions of graphs a soak runs.
const RSS_TOLERANCE_BYTES: u64 = 64 << 20;
/// Device free memory may end this much below its level after the warm-up (the driver's own
/// bookkeeping; the pool frees every buffer once dropped).
const DEVICE_TOLERANCE_BYTES: usize = 64 << 20;

/// A small, fast, seeded generator (xorshift64*).
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random DAG: `preds[i]` are earlier nodes, so index order is a topological order.
struct Shape {
    preds: Vec<Vec<u32>>,
    base: Vec<u64>,
}

impl Shape {
    fn random(rng: &mut Rng, max_nodes: u64) -> Shape {
        let n = 1 + rng.below(max_nodes) as usize;
        let mut preds = Vec::with_capacity(n);
        let mut base = Vec::with_capacity(n);
        for i in 0..n {
            let mut p: Vec<u32> = (0..rng.below(4).min(i as u64))
                .map(|_| (i as u64 - 1 - rng.below((i as u64).min(16))) as u32)
                .collect();
            p.sort_unstable();
            p.dedup();
            preds.push(p);
            base.push(rng.next() >> 8);
        }
        Shape { preds, base }
    }

    fn len(&self) -> usize {
        self.base.len()
    }

    /// The value every node must produce: its base plus its inputs', wrapping.
    fn expected(&self) -> Vec<u64> {
        let mut v: Vec<u64> = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let s = self.preds[i]
                .iter()
                .fold(self.base[i], |a, &p| a.wrapping_add(v[p as usize]));
            v.push(s);
        }
        v
    }

    fn is_sink(&self, i: usize) -> bool {
        !self.preds[i + 1..].iter().any(|p| p.contains(&(i as u32)))
    }
}

/// What a node is made to do wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Error,
    Panic,
}

/// Builds `shape` as host nodes named `{prefix}n{i}`; node `fault.1` does `fault.0`, and every
/// body runs `extra` (the dropped scenario counts runs with it).
fn host_graph<S: Send + 'static>(
    name: &str,
    shape: &Shape,
    fault: Option<(Fault, usize)>,
    extra: Option<Arc<dyn Fn() + Send + Sync>>,
) -> (Graph<S>, Vec<NodeRef<u64>>) {
    let mut g = GraphBuilder::<S>::with_capacity(name.to_string(), shape.len(), 4 * shape.len());
    let mut refs: Vec<NodeRef<u64>> = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        let inputs: Vec<NodeRef<u64>> = shape.preds[i].iter().map(|&p| refs[p as usize]).collect();
        let base = shape.base[i];
        let fault = fault.and_then(|(f, at)| (at == i).then_some(f));
        let extra = extra.clone();
        let r = g.node(format!("n{i}"), move |ctx| {
            if let Some(e) = &extra {
                e();
            }
            match fault {
                Some(Fault::Error) => return Err(format!("injected error in n{i}").into()),
                Some(Fault::Panic) => panic!("{PANIC_TAG} in n{i}"),
                None => {}
            }
            let mut v = base;
            for p in &inputs {
                v = v.wrapping_add(*ctx.input(*p)?);
            }
            Ok(v)
        });
        for &p in &shape.preds[i] {
            g.edge(refs[p as usize], r);
        }
        refs.push(r);
    }
    (g.build().expect("a soak graph is acyclic"), refs)
}

/// Figures every submitter adds to.
#[derive(Default)]
struct Tally {
    graphs: AtomicU64,
    nodes: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    panics: AtomicU64,
    cancels: AtomicU64,
    cancelled: AtomicU64,
    nested: AtomicU64,
    dropped: AtomicU64,
    gpu_graphs: AtomicU64,
    foreign_buffer_drops: AtomicU64,
    /// GPU nodes run through cudarc's types (`spin_set_add_cudarc`).
    cudarc_nodes: AtomicU64,
    violations: AtomicU64,
    messages: Mutex<Vec<String>>,
}

impl Tally {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    fn violation(&self, m: String) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        let mut ms = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        if ms.len() < bounded::LIST_ITEMS {
            ms.push(bounded::clip_message(m));
        }
    }
}

/// Checks outputs against the host's sums; `wrong` makes the checker expect a wrong value
/// (the hidden `--inject-wrong-value` flag, to show that a violation is caught).
fn check_values(
    tally: &Tally,
    what: &str,
    shape: &Shape,
    got: impl Fn(usize) -> Option<u64>,
    wrong: bool,
) {
    let mut want = shape.expected();
    if wrong {
        want[0] = want[0].wrapping_add(1);
    }
    for (i, w) in want.iter().enumerate() {
        match got(i) {
            Some(v) if v == *w => {}
            Some(v) => {
                return tally.violation(format!("{what}: node n{i} gave {v}, expected {w}"));
            }
            None => return tally.violation(format!("{what}: node n{i} has no output")),
        }
    }
}

/// Checks that a graph made to fail at `n{at}` failed with `kind`, naming that node.
fn check_failure(
    tally: &Tally,
    what: &str,
    res: Result<boundpool::GraphOutput, boundpool::Error>,
    kind: ErrorKind,
    names: &[String],
) {
    match res {
        Ok(_) => tally.violation(format!("{what}: succeeded, but a node was made to fail")),
        Err(e) if e.kind() != kind => tally.violation(format!(
            "{what}: failed as {:?}, expected {kind:?}: {e}",
            e.kind()
        )),
        Err(e) => {
            let text = e.to_string();
            for n in names {
                if !text.contains(&format!("node '{n}'")) {
                    tally.violation(format!(
                        "{what}: the error does not name node '{n}': {text}"
                    ));
                }
            }
        }
    }
}

/// A graph whose handle was dropped: its run count and a sentinel only its nodes hold.
struct Dropped {
    runs: Arc<AtomicU32>,
    nodes: u32,
    sentinel: Weak<()>,
    since: Instant,
}

impl Dropped {
    fn settled(&self) -> bool {
        self.runs.load(Ordering::Acquire) == self.nodes && self.sentinel.strong_count() == 0
    }
}

/// What the GPU scenario needs.
struct GpuSide {
    pool: GpuPool,
    device: GpuDevice,
    kernels: Arc<(Kernel, Kernel, Kernel)>,
}

/// The short-lived pools' worker threads by id: registered by each worker's start hook, and
/// marked with the time its stop hook ran (the thread is about to exit).
#[derive(Default)]
struct ExtraThreads {
    threads: Mutex<HashMap<u32, Option<Instant>>>,
    /// Short-lived pools inside `build`: their worker may exist before its start hook ran.
    building: AtomicUsize,
}

impl ExtraThreads {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Option<Instant>>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a short-lived pool's thread may stay listed after its stop hook ran: the thread
/// still unwinds its stack and frees its thread-locals, and the kernel removes it from
/// `/proc/self/task` a moment after it woke its joiner (on a loaded machine, milliseconds).
const EXIT_GRACE: Duration = Duration::from_secs(1);

struct Env<'a> {
    gpu: Option<&'a GpuSide>,
    tally: &'a Tally,
    extra: &'a Arc<ExtraThreads>,
    stop: &'a AtomicBool,
    wrong_value: &'a AtomicBool,
}

fn submitter<S: Send + 'static>(
    id: usize,
    seed: u64,
    pool: &Pool<S>,
    env: &Env<'_>,
    start: &Barrier,
) {
    let tally = env.tally;
    let mut rng = Rng::new(seed ^ ((id as u64 + 1) << 32));
    let mut dropped: Vec<Dropped> = Vec::new();
    start.wait();
    let mut k = 0u64;
    while !env.stop.load(Ordering::Relaxed) {
        k += 1;
        let what = format!("submitter {id} graph {k}");
        // 0..92: the host scenarios; 100: the GPU one (40% of the graphs with --gpu).
        let pick = rng.below(100);
        let pick = match env.gpu {
            Some(_) if pick < 40 => 100,
            Some(_) => (pick - 40) * 92 / 60,
            None => pick * 92 / 100,
        };
        match pick {
            0..=39 => {
                let shape = Shape::random(&mut rng, 48);
                let (g, refs) = host_graph::<S>("plain", &shape, None, None);
                Tally::add(&tally.nodes, shape.len() as u64);
                match pool.submit(&g).and_then(|h| h.wait()) {
                    Ok(out) => {
                        let wrong = env.wrong_value.swap(false, Ordering::Relaxed);
                        check_values(tally, &what, &shape, |i| out.get(refs[i]).copied(), wrong);
                        Tally::add(&tally.ok, 1);
                    }
                    Err(e) => tally.violation(format!("{what}: a fault-free graph failed: {e}")),
                }
            }
            40..=61 => {
                let shape = Shape::random(&mut rng, 48);
                let at = rng.below(shape.len() as u64) as usize;
                let (fault, kind, counter) = if pick < 52 {
                    (Fault::Error, ErrorKind::NodeFailed, &tally.errors)
                } else {
                    (Fault::Panic, ErrorKind::NodePanicked, &tally.panics)
                };
                let (g, _) = host_graph::<S>("faulty", &shape, Some((fault, at)), None);
                Tally::add(&tally.nodes, shape.len() as u64);
                Tally::add(counter, 1);
                let res = pool.submit(&g).and_then(|h| h.wait());
                check_failure(tally, &what, res, kind, &[format!("n{at}")]);
            }
            62..=66 => cancel(&mut rng, &what, env),
            67..=79 => nested(&mut rng, &what, pool, env),
            80..=91 => {
                let shape = Shape::random(&mut rng, 32);
                let runs = Arc::new(AtomicU32::new(0));
                let sentinel = Arc::new(());
                let weak = Arc::downgrade(&sentinel);
                let counted = runs.clone();
                let extra: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                    let _held = &sentinel;
                    counted.fetch_add(1, Ordering::AcqRel);
                });
                let (g, _) = host_graph::<S>("dropped", &shape, None, Some(extra));
                Tally::add(&tally.nodes, shape.len() as u64);
                Tally::add(&tally.dropped, 1);
                match pool.submit(&g) {
                    Ok(h) => drop(h),
                    Err(e) => tally.violation(format!("{what}: submit failed: {e}")),
                }
                drop(g);
                dropped.push(Dropped {
                    runs,
                    nodes: shape.len() as u32,
                    sentinel: weak,
                    since: Instant::now(),
                });
            }
            _ => match env.gpu {
                Some(gpu) => gpu_scenario(&mut rng, &what, gpu, env),
                None => unreachable!("the GPU scenario is only picked with --gpu"),
            },
        }
        Tally::add(&tally.graphs, 1);
        dropped.retain(|d| {
            if d.settled() {
                return false;
            }
            if d.since.elapsed() > DROPPED_GRACE {
                tally.violation(format!(
                    "submitter {id}: a graph whose handle was dropped ran {} of {} nodes and still holds its closures after {DROPPED_GRACE:?}",
                    d.runs.load(Ordering::Acquire),
                    d.nodes
                ));
                return false;
            }
            true
        });
    }
    // The graphs still pending get their grace period too.
    for d in dropped {
        while !d.settled() && d.since.elapsed() <= DROPPED_GRACE {
            std::thread::sleep(Duration::from_millis(1));
        }
        if !d.settled() {
            tally.violation(format!(
                "submitter {id}: a graph whose handle was dropped ran {} of {} nodes and still holds its closures after {DROPPED_GRACE:?}",
                d.runs.load(Ordering::Acquire),
                d.nodes
            ));
        }
    }
}

/// A chain on a short-lived one-worker pool, cancelled by its shutdown while it runs.
fn cancel(rng: &mut Rng, what: &str, env: &Env<'_>) {
    let tally = env.tally;
    let shape = Shape {
        preds: (0..32u32)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect(),
        base: (0..32).map(|_| rng.next() >> 8).collect(),
    };
    let work = Arc::new(|| busy_work(5_000)) as Arc<dyn Fn() + Send + Sync>;
    let (g, refs) = host_graph::<u32>("cancelled", &shape, None, Some(work));
    Tally::add(&tally.nodes, shape.len() as u64);
    Tally::add(&tally.cancels, 1);
    let (on_start, on_stop) = (env.extra.clone(), env.extra.clone());
    // `build` returns once every worker's start hook ran: until then its one worker may be
    // listed and not registered yet.
    env.extra.building.fetch_add(1, Ordering::SeqCst);
    let built = PoolBuilder::new()
        .name("soak-cancel")
        .thread_name(|_| CANCEL_POOL_THREAD.into())
        .workers(1)
        .start_hook(move |_| {
            let tid = current_tid().ok_or("no /proc/thread-self")?;
            on_start.lock().insert(tid, None);
            Ok(tid)
        })
        .stop_hook(move |_, tid| {
            on_stop.lock().insert(tid, Some(Instant::now()));
        })
        .build();
    env.extra.building.fetch_sub(1, Ordering::SeqCst);
    let pool = match built {
        Ok(p) => p,
        Err(e) => {
            return tally.violation(format!("{what}: the short-lived pool did not start: {e}"));
        }
    };
    let handle = pool.submit(&g);
    std::thread::sleep(Duration::from_micros(rng.below(150)));
    pool.shutdown(ShutdownMode::Cancel);
    match handle.and_then(|h| h.wait()) {
        Ok(out) => check_values(tally, what, &shape, |i| out.get(refs[i]).copied(), false),
        Err(e) if e.kind() == ErrorKind::Cancelled => Tally::add(&tally.cancelled, 1),
        Err(e) => tally.violation(format!("{what}: a cancelled graph failed otherwise: {e}")),
    }
    match pool.submit(&g) {
        Err(e) if e.kind() == ErrorKind::ShutDown => {}
        Err(e) => tally.violation(format!("{what}: submit after shutdown: {e}")),
        Ok(_) => tally.violation(format!("{what}: submit after shutdown was accepted")),
    }
    drop(pool);
}

/// A node that submits a subgraph from inside the pool and waits on it.
fn nested<S: Send + 'static>(rng: &mut Rng, what: &str, pool: &Pool<S>, env: &Env<'_>) {
    let tally = env.tally;
    let inner = Shape::random(rng, 24);
    let fault = (rng.below(4) == 0).then(|| rng.below(inner.len() as u64) as usize);
    let want: u64 = inner.expected().iter().fold(0, |a, &v| a.wrapping_add(v));
    let (inner_graph, inner_refs) =
        host_graph::<S>("inner", &inner, fault.map(|at| (Fault::Error, at)), None);
    let inner_graph = Arc::new(inner_graph);
    let mut g = GraphBuilder::<S>::new("outer");
    let outer = g.node("outer", move |ctx| {
        let out = ctx.submit(&inner_graph)?.wait()?;
        let mut sum = 0u64;
        for r in &inner_refs {
            sum = sum.wrapping_add(*out.get(*r).ok_or("an inner node has no output")?);
        }
        Ok(sum)
    });
    let g = g.build().expect("one node");
    Tally::add(&tally.nodes, 1 + inner.len() as u64);
    Tally::add(&tally.nested, 1);
    if fault.is_some() {
        Tally::add(&tally.errors, 1);
    }
    let res = pool.submit(&g).and_then(|h| h.wait());
    match fault {
        Some(at) => {
            let names = ["outer".to_string(), format!("n{at}")];
            check_failure(tally, what, res, ErrorKind::NodeFailed, &names);
        }
        None => match res {
            Ok(out) if out.get(outer) == Some(&want) => {}
            Ok(out) => tally.violation(format!(
                "{what}: the nested graph's sum is {:?}, expected {want}",
                out.get(outer)
            )),
            Err(e) => tally.violation(format!("{what}: a fault-free nested graph failed: {e}")),
        },
    }
}

/// One GPU node: spin, then a new one-element buffer set to `value` plus each input's.
/// The built-in kernels as cudarc functions, loaded by each worker of the soak's GPU pool.
struct CudarcKernels {
    set: CudaFunction,
    add: CudaFunction,
    spin: CudaFunction,
}

/// As [`spin_set_add`], through cudarc: its launches (`launch_builder` on the node's stream) and
/// allocation (`alloc_zeros`), the slice adopted into a `DeviceBuffer` to leave the node.
fn spin_set_add_cudarc(
    ctx: &GpuCtx<'_, '_>,
    cycles: i64,
    value: i64,
    inputs: &[NodeRef<DeviceBuffer<i64>>],
) -> Result<DeviceBuffer<i64>, BoxError> {
    let k = ctx.state::<CudarcKernels>()?;
    let s = ctx.stream();
    let one = CuLaunch {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut out = s.alloc_zeros::<i64>(1)?;
    // SAFETY: the built-in kernels get the argument types they declare (bp_spin(i64),
    // bp_set_i64(i64*, i64), bp_add_i64(i64*, const i64*)); the inputs are node outputs, which
    // outlive the graph's GPU work, and `out` is adopted below (freed after the node's work).
    unsafe {
        s.launch_builder(&k.spin).arg(&cycles).launch(one)?;
        s.launch_builder(&k.set)
            .arg(&mut out)
            .arg(&value)
            .launch(one)?;
        for p in inputs {
            let src: &DeviceBuffer<i64> = ctx.input(*p)?;
            s.launch_builder(&k.add)
                .arg(&mut out)
                .arg(src.as_cuda_slice())
                .launch(one)?;
        }
    }
    Ok(ctx.adopt(out)?)
}

fn spin_set_add(
    ctx: &GpuCtx<'_, '_>,
    (set, add, spin): &(Kernel, Kernel, Kernel),
    cycles: i64,
    value: i64,
    inputs: &[NodeRef<DeviceBuffer<i64>>],
) -> Result<DeviceBuffer<i64>, BoxError> {
    let mut out = ctx.alloc::<i64>(1)?;
    // SAFETY: the built-in kernels get the argument types they declare (bp_spin(i64),
    // bp_set_i64(i64*, i64), bp_add_i64(i64*, const i64*)); the buffers are node outputs, which
    // outlive the graph's GPU work.
    unsafe {
        ctx.launch(spin, LaunchConfig::single())
            .arg(cycles)
            .launch()?;
        ctx.launch(set, LaunchConfig::single())
            .arg(&mut out)
            .arg(value)
            .launch()?;
        for p in inputs {
            let src: &DeviceBuffer<i64> = ctx.input(*p)?;
            ctx.launch(add, LaunchConfig::single())
                .arg(&mut out)
                .arg(src)
                .launch()?;
        }
    }
    Ok(out)
}

/// A random DAG of GPU nodes, at times with a node made to fail or panic.
fn gpu_scenario(rng: &mut Rng, what: &str, gpu: &GpuSide, env: &Env<'_>) {
    let tally = env.tally;
    let shape = Shape::random(rng, 16);
    let fault = match rng.below(10) {
        0 => Some((Fault::Error, rng.below(shape.len() as u64) as usize)),
        1 => Some((Fault::Panic, rng.below(shape.len() as u64) as usize)),
        _ => None,
    };
    let mut g = GpuGraphBuilder::new("gpu");
    let mut refs: Vec<NodeRef<DeviceBuffer<i64>>> = Vec::with_capacity(shape.len());
    for i in 0..shape.len() {
        let inputs: Vec<_> = shape.preds[i].iter().map(|&p| refs[p as usize]).collect();
        let value = shape.base[i] as i64;
        let cycles = rng.below(2_000) as i64;
        let kernels = gpu.kernels.clone();
        let f = fault.and_then(|(f, at)| (at == i).then_some(f));
        // Half the nodes through cudarc's types (the same kernels, loaded by cudarc).
        let cudarc = rng.below(2) == 0;
        if cudarc {
            Tally::add(&tally.cudarc_nodes, 1);
        }
        let r = g.gpu_node(&gpu.device, &format!("n{i}"), move |ctx| {
            match f {
                Some(Fault::Error) => return Err(format!("injected error in n{i}").into()),
                Some(Fault::Panic) => panic!("{PANIC_TAG} in n{i}"),
                None => {}
            }
            if cudarc {
                spin_set_add_cudarc(ctx, cycles, value, &inputs)
            } else {
                spin_set_add(ctx, &kernels, cycles, value, &inputs)
            }
        });
        for &p in &shape.preds[i] {
            g.edge(refs[p as usize], r);
        }
        refs.push(r);
    }
    let g = g.build().expect("a soak graph is acyclic");
    Tally::add(&tally.nodes, shape.len() as u64);
    Tally::add(&tally.gpu_graphs, 1);
    let res = match gpu.pool.submit(&g) {
        Ok(h) => h.wait(),
        Err(e) => return tally.violation(format!("{what}: GPU submit failed: {e}")),
    };
    if let Some((f, at)) = fault {
        let (kind, counter) = match f {
            Fault::Error => (ErrorKind::NodeFailed, &tally.errors),
            Fault::Panic => (ErrorKind::NodePanicked, &tally.panics),
        };
        Tally::add(counter, 1);
        return check_failure(tally, what, res, kind, &[format!("n{at}")]);
    }
    let mut out = match res {
        Ok(out) => out,
        Err(e) => return tally.violation(format!("{what}: a fault-free GPU graph failed: {e}")),
    };
    // The sinks and one other node are downloaded; their host sums cover every node above them.
    let probe = rng.below(shape.len() as u64) as usize;
    let want = shape.expected();
    let mut buffers = Vec::new();
    for (i, &w) in want.iter().enumerate() {
        if !shape.is_sink(i) && i != probe {
            continue;
        }
        let Some(buf) = out.take(refs[i]) else {
            return tally.violation(format!("{what}: GPU node n{i} has no output"));
        };
        match gpu.pool.download(&buf) {
            Ok(v) if v == [w as i64] => {}
            Ok(v) => tally.violation(format!("{what}: GPU node n{i} gave {v:?}, expected {w}")),
            Err(e) => tally.violation(format!("{what}: downloading n{i}: {e}")),
        }
        buffers.push(buf);
    }
    // Every buffer (taken or still in the output) is dropped here, on the submitter's thread.
    Tally::add(&tally.foreign_buffer_drops, shape.len() as u64);
    drop(buffers);
    drop(out);
    Tally::add(&tally.ok, 1);
}

/// Runs one small GPU graph on every worker's stream and downloads its result.
fn warm_up(gpu: &GpuSide) -> Result<(), BoxError> {
    let workers = gpu.pool.pool().workers().len();
    let mut g = GpuGraphBuilder::new("warm-up");
    let refs: Vec<NodeRef<DeviceBuffer<i64>>> = (0..workers.max(1) * 2)
        .map(|i| {
            let kernels = gpu.kernels.clone();
            g.gpu_node(&gpu.device, &format!("w{i}"), move |ctx| {
                spin_set_add(ctx, &kernels, 1_000, i as i64, &[])
            })
        })
        .collect();
    let g = g.build()?;
    let mut out = gpu.pool.submit(&g)?.wait()?;
    for (i, r) in refs.iter().enumerate() {
        let buf = out.take(*r).ok_or("a warm-up node has no output")?;
        if gpu.pool.download(&buf)? != [i as i64] {
            return Err(format!("warm-up node w{i} gave a wrong value").into());
        }
    }
    Ok(())
}

/// Resident memory of this process (Linux: `VmRSS` of `/proc/self/status`), in bytes.
fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

fn os_threads() -> usize {
    super::observe::os_threads().unwrap_or(0)
}

/// The name of the short-lived pools' worker threads.
const CANCEL_POOL_THREAD: &str = "soak-cancel";

/// The calling thread's OS id (Linux: `/proc/thread-self` links to `PID/task/TID`).
fn current_tid() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// The ids of this process's OS threads (`/proc/self/task`).
fn thread_ids() -> std::collections::HashSet<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Installs a panic hook that keeps injected panics off stderr (and counts nothing else out).
fn quiet_injected_panics() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !msg.starts_with(PANIC_TAG) {
            default(info);
        }
    }));
}

pub(crate) fn main(a: SoakArgs) -> ExitCode {
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        eprintln!("boundpool soak: --seconds must be a positive number");
        return ExitCode::from(2);
    }
    if a.submitters == 0 {
        eprintln!("boundpool soak: --submitters must be at least 1");
        return ExitCode::from(2);
    }
    let threads = a.threads.unwrap_or_else(default_workers);
    if threads == 0 {
        eprintln!("boundpool soak: --threads must be at least 1");
        return ExitCode::from(2);
    }
    let mut splits = Vec::new();
    let gpu = if a.gpu {
        if let Some(why) = boundpool::gpu::gpu_unavailable_reason() {
            eprintln!("boundpool soak: --gpu, but no GPU: {why}");
            return ExitCode::from(2);
        }
        let b = GpuPoolBuilder::new()
            .name("soak-gpu")
            .devices(Devices::List(vec![0]))
            .workers_per_device(threads)
            .worker_state(|s| -> Result<CudarcKernels, BoxError> {
                let m = s.context().load_module(Ptx::from_src(builtin::PTX))?;
                Ok(CudarcKernels {
                    set: m.load_function(builtin::SET_I64)?,
                    add: m.load_function(builtin::ADD_I64)?,
                    spin: m.load_function(builtin::SPIN)?,
                })
            });
        // With --partitions, the partitions' workers; the nodes are still placed on the device.
        let b = match &a.part.partitions {
            Some(p) => b.sm_partitions(p.0.clone()),
            None => b,
        };
        let pool = match b.build() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("boundpool soak: the GPU pool did not start: {e}");
                return super::partitions::build_failure(&e);
            }
        };
        splits = super::partitions::splits(&pool);
        if !a.json {
            super::partitions::print_lines(&splits);
        }
        let device = pool.devices()[0].clone();
        let m = Module::builtin();
        let kernels = match (|| {
            Ok::<_, boundpool::gpu::GpuError>((
                m.kernel(builtin::SET_I64)?,
                m.kernel(builtin::ADD_I64)?,
                m.kernel(builtin::SPIN)?,
            ))
        })() {
            Ok(k) => Arc::new(k),
            Err(e) => {
                eprintln!("boundpool soak: the built-in kernels did not load: {e}");
                return ExitCode::from(1);
            }
        };
        let side = GpuSide {
            pool,
            device,
            kernels,
        };
        // One GPU graph before anything is counted: the driver starts threads of its own and
        // loads the module lazily, and those belong to the levels the soak starts from.
        if let Err(e) = warm_up(&side) {
            eprintln!("boundpool soak: the GPU warm-up failed: {e}");
            return ExitCode::from(1);
        }
        Some(side)
    } else {
        None
    };
    quiet_injected_panics();
    let host_pool = match &gpu {
        Some(_) => None,
        None => match PoolBuilder::new().name("soak").workers(threads).build() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("boundpool soak: {e}");
                return ExitCode::from(2);
            }
        },
    };
    soak(a, host_pool, gpu, &splits)
}

fn soak(
    a: SoakArgs,
    host_pool: Option<Pool>,
    gpu: Option<GpuSide>,
    splits: &[super::partitions::DeviceSplit],
) -> ExitCode {
    let tally = Tally::default();
    let extra = Arc::new(ExtraThreads::default());
    let stop = AtomicBool::new(false);
    let wrong_value = AtomicBool::new(a.inject_wrong_value);
    let workers = match (&host_pool, &gpu) {
        (Some(p), _) => p.workers().len(),
        (None, Some(g)) => g.pool.pool().workers().len(),
        (None, None) => unreachable!("one pool or the other"),
    };
    let device_level = |g: &GpuSide| {
        let free = g.pool.call(&g.device, |ctx| Ok(ctx.memory_info()?.0)).ok();
        (free, g.device.live_allocations(), g.device.events_created())
    };
    // Main + workers, and with a GPU the driver's own threads: counted once, before any submitter.
    let base_threads = os_threads();
    let rss_start = rss_bytes();
    let dev_start = gpu.as_ref().map(device_level);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(a.seconds);
    let warm_at = t0 + Duration::from_secs_f64((a.seconds * 0.1).min(10.0));
    let start = Barrier::new(a.submitters + 1);
    let (mut min_threads, mut max_threads, mut samples) = (usize::MAX, 0usize, 0u64);
    let (mut max_cancel_threads, mut max_unregistered) = (0usize, 0usize);
    let mut rss_warm = None;
    let mut dev_warm = None;
    let env = Env {
        gpu: gpu.as_ref(),
        tally: &tally,
        extra: &extra,
        stop: &stop,
        wrong_value: &wrong_value,
    };
    std::thread::scope(|s| {
        let env = &env;
        let start = &start;
        let host_pool = host_pool.as_ref();
        let gpu_pool: Option<&Pool<GpuWorker>> = gpu.as_ref().map(|g| g.pool.pool());
        for id in 0..a.submitters {
            let seed = a.seed;
            // The host scenarios are the same code on a plain pool and on the GPU pool's.
            std::thread::Builder::new()
                .name(format!("soak-submitter-{id}"))
                .spawn_scoped(s, move || match (host_pool, gpu_pool) {
                    (Some(p), _) => submitter(id, seed, p, env, start),
                    (None, Some(p)) => submitter(id, seed, p, env, start),
                    (None, None) => unreachable!("one pool or the other"),
                })
                .expect("a submitter thread starts");
        }
        // The submitters wait at the barrier: no short-lived pool exists yet, so every thread
        // listed now is main, a worker, the driver's, or a submitter.
        let core_tids = thread_ids();
        if core_tids.len() != base_threads + a.submitters {
            tally.violation(format!(
                "{} OS threads with the submitters started, expected {}",
                core_tids.len(),
                base_threads + a.submitters
            ));
        }
        start.wait();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20).min(deadline - Instant::now()));
            // The threads listed before the start (main, workers, submitters) must all still
            // be there, and every other one must be a short-lived pool's worker: registered by
            // its start hook, and gone within EXIT_GRACE of its stop hook, or not registered yet
            // because its pool is still in `build`. Read in this order (the listing, then the
            // pools in `build`, then the registry), a worker found unregistered belongs to a
            // pool that was in `build` when the count was read, so unknown <= building.
            let tids = thread_ids();
            let building = extra.building.load(Ordering::SeqCst);
            let present = core_tids.iter().filter(|t| tids.contains(t)).count();
            let mut reg = extra.lock();
            // Forget the exited threads the listing no longer shows (ids are reused).
            reg.retain(|tid, stopped| stopped.is_none() || tids.contains(tid));
            let (mut others, mut unknown, mut late) = (0, 0, 0);
            for tid in tids.iter().filter(|t| !core_tids.contains(t)) {
                others += 1;
                match reg.get(tid) {
                    None => unknown += 1,
                    Some(Some(t)) if t.elapsed() > EXIT_GRACE => late += 1,
                    Some(_) => {}
                }
            }
            drop(reg);
            max_unregistered = max_unregistered.max(unknown);
            let unknown = unknown.saturating_sub(building);
            samples += 1;
            min_threads = min_threads.min(present + others);
            max_threads = max_threads.max(present + others);
            max_cancel_threads = max_cancel_threads.max(others);
            if present != core_tids.len() {
                tally.violation(format!(
                    "{} of the {} threads listed at the start (main + {workers} workers + {} submitters{}) have exited",
                    core_tids.len() - present,
                    core_tids.len(),
                    a.submitters,
                    if base_threads > 1 + workers { " + the driver's" } else { "" }
                ));
            }
            if unknown > 0 {
                tally.violation(format!(
                    "{unknown} OS threads that are neither main, a worker, a submitter nor a short-lived pool's worker"
                ));
            }
            if late > 0 {
                tally.violation(format!(
                    "{late} short-lived pools' threads still listed {EXIT_GRACE:?} after they stopped"
                ));
            }
            if rss_warm.is_none() && Instant::now() >= warm_at {
                rss_warm = rss_bytes();
                dev_warm = gpu.as_ref().map(device_level);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = t0.elapsed();
    if base_threads != 1 + workers && gpu.is_none() {
        tally.violation(format!(
            "{base_threads} OS threads before the submitters, expected main + {workers} workers"
        ));
    }
    // A scoped thread is joined once its closure returned, a moment before its OS thread exits.
    let t = Instant::now();
    let mut end_threads = os_threads();
    while end_threads != base_threads && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
        end_threads = os_threads();
    }
    if end_threads != base_threads {
        tally.violation(format!(
            "{end_threads} OS threads after the submitters were joined, {base_threads} before"
        ));
    }
    let rss_warm = rss_warm.or(rss_start);
    let rss_end = rss_bytes();
    if let (Some(w), Some(e)) = (rss_warm, rss_end) {
        if e > w + RSS_TOLERANCE_BYTES {
            tally.violation(format!(
                "resident memory {} MiB at the end, {} MiB after the warm-up (tolerance {} MiB)",
                e >> 20,
                w >> 20,
                RSS_TOLERANCE_BYTES >> 20
            ));
        }
    }
    // The device: buffers dropped on the submitters are released by its workers; give them a
    // moment, then compare with the levels after the warm-up.
    let mut dev_end = None;
    if let Some(g) = &gpu {
        let (start_free, start_live, start_events) = dev_start.expect("measured with the pool");
        let (warm_free, _, warm_events) =
            dev_warm.unwrap_or((start_free, start_live, start_events));
        // Nothing the soak made is held now: every buffer was dropped (on the submitters), and
        // the device's idle workers must release them without another graph to wake them, so
        // the count is polled without submitting anything (the issue-9 deadline is 1 ms; 2 s
        // here is a hang guard).
        let t = Instant::now();
        while g.device.live_allocations() != 0 && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let idle_live = g.device.live_allocations();
        if idle_live != 0 {
            tally.violation(format!(
                "{idle_live} device allocations still live {:?} after the last graph, with the workers idle ({start_live} after the warm-up)",
                t.elapsed()
            ));
        }
        let t = Instant::now();
        let mut end = device_level(g);
        while end
            .0
            .zip(warm_free)
            .is_some_and(|(e, w)| e + DEVICE_TOLERANCE_BYTES < w)
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
            end = device_level(g);
        }
        let (end_free, end_live, end_events) = end;
        if end_live != 0 {
            tally.violation(format!("{end_live} device allocations live at the end"));
        }
        match (end_free, warm_free) {
            (Some(e), Some(w)) if e + DEVICE_TOLERANCE_BYTES < w => tally.violation(format!(
                "device free memory {} MiB at the end, {} MiB after the warm-up (tolerance {} MiB)",
                e >> 20,
                w >> 20,
                DEVICE_TOLERANCE_BYTES >> 20
            )),
            (Some(_), Some(_)) => {}
            _ => tally.violation("the device's free memory could not be read".into()),
        }
        // Events are recycled: after the warm-up the table may grow a little (a burst), not
        // with the number of graphs.
        let grown = end_events.saturating_sub(warm_events);
        if grown > warm_events.saturating_sub(start_events) + 64 {
            tally.violation(format!(
                "the event table grew by {grown} after the warm-up ({start_events} at the start, {warm_events} after the warm-up, {end_events} at the end)"
            ));
        }
        dev_end = Some((end_free, end_live, end_events));
        if let Some(why) = g.device.failure() {
            tally.violation(format!("the device failed: {why}"));
        }
    }
    drop(host_pool);
    drop(gpu);

    let t = &tally;
    let g = Tally::get;
    let violations = g(&t.violations);
    let messages = t.messages.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mib = |x: Option<u64>| x.map(|b| b as f64 / (1 << 20) as f64);
    let expected_threads = base_threads + a.submitters;
    if a.json {
        let mut v = json!({
            "seconds": elapsed.as_secs_f64(),
            "gpu": a.gpu,
            "submitters": a.submitters,
            "workers": workers,
            "seed": a.seed,
            "graphs": g(&t.graphs),
            "nodes": g(&t.nodes),
            "graphs_ok": g(&t.ok),
            "faults": {
                "errors": g(&t.errors),
                "panics": g(&t.panics),
                "cancels": g(&t.cancels),
                "cancelled": g(&t.cancelled),
                "nested": g(&t.nested),
                "dropped_handles": g(&t.dropped),
                "foreign_buffer_drops": g(&t.foreign_buffer_drops),
                "cudarc_nodes": g(&t.cudarc_nodes),
            },
            "gpu_graphs": g(&t.gpu_graphs),
            "os_threads": {
                "expected": expected_threads,
                "min": (samples > 0).then_some(min_threads),
                "max": (samples > 0).then_some(max_threads),
                "samples": samples,
                "max_starting": max_unregistered,
                "max_short_lived_pool_threads": max_cancel_threads,
                "end": end_threads,
            },
            "rss_mib": {"start": mib(rss_start), "warm": mib(rss_warm), "end": mib(rss_end)},
            "violations": violations,
            "violation_messages": messages,
        });
        if !splits.is_empty() {
            v["partitions"] = super::partitions::json_of(splits);
        }
        if let (Some(s), Some(w), Some(e)) = (dev_start, dev_warm, dev_end) {
            v["device"] = json!({
                "free_mib": {"start": mib(s.0.map(|x| x as u64)), "warm": mib(w.0.map(|x| x as u64)), "end": mib(e.0.map(|x| x as u64))},
                "live_allocations": {"start": s.1, "end": e.1},
                "events_created": {"start": s.2, "warm": w.2, "end": e.2},
            });
        }
        println!("{v}");
    } else {
        let f = |x: Option<f64>| x.map_or("?".into(), |m| format!("{m:.1}"));
        println!(
            "soak             {:.1} s, {} submitters, {workers} workers{}, seed {}",
            elapsed.as_secs_f64(),
            a.submitters,
            if a.gpu { " (GPU)" } else { "" },
            a.seed
        );
        println!(
            "graphs           {} ({} nodes; {} succeeded and checked{})",
            g(&t.graphs),
            g(&t.nodes),
            g(&t.ok),
            if a.gpu {
                format!(", {} on the GPU", g(&t.gpu_graphs))
            } else {
                String::new()
            }
        );
        println!(
            "faults           {} errors, {} panics, {} cancels ({} cancelled), {} nested, {} dropped handles{}",
            g(&t.errors),
            g(&t.panics),
            g(&t.cancels),
            g(&t.cancelled),
            g(&t.nested),
            g(&t.dropped),
            if a.gpu {
                format!(
                    ", {} buffers dropped off the workers, {} GPU nodes through cudarc",
                    g(&t.foreign_buffer_drops),
                    g(&t.cudarc_nodes)
                )
            } else {
                String::new()
            }
        );
        println!(
            "OS threads       {} to {} during (expected {expected_threads}: main + {workers} workers + {} submitters{}), {end_threads} at the end",
            if samples > 0 { min_threads } else { 0 },
            max_threads,
            a.submitters,
            if base_threads > 1 + workers {
                format!(" + {} of the driver", base_threads - 1 - workers)
            } else {
                String::new()
            }
        );
        println!(
            "                 {samples} samples; short-lived pools: at most {max_cancel_threads} threads at once ({max_unregistered} of them starting)"
        );
        println!(
            "resident memory  {} MiB at the start, {} after the warm-up, {} at the end",
            f(mib(rss_start)),
            f(mib(rss_warm)),
            f(mib(rss_end))
        );
        if let (Some(s), Some(w), Some(e)) = (dev_start, dev_warm, dev_end) {
            let m = |x: Option<usize>| f(mib(x.map(|x| x as u64)));
            println!(
                "device memory    {} MiB free at the start, {} after the warm-up, {} at the end",
                m(s.0),
                m(w.0),
                m(e.0)
            );
            println!("live allocations {} at the start, {} at the end", s.1, e.1);
            println!(
                "events created   {} at the start, {} after the warm-up, {} at the end",
                s.2, w.2, e.2
            );
        }
        println!("violations       {violations}");
        for m in &messages {
            println!("  {m}");
        }
        if violations as usize > messages.len() {
            println!("  … ({} more)", violations as usize - messages.len());
        }
    }
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
