//! Reference implementations of the alternatives boundpool is measured against, written straight
//! on the driver so that benchmarks can compare in one process: raw launches from `k` bound
//! threads, an OS thread per task, one server thread fed by a channel, and cross-stream edges
//! made with an event or with a host synchronise. Each launches the built-in empty kernel
//! `<<<1,1>>>` and counts the time until the work has completed on the device.
//!
//! These are benchmark baselines, not part of the framework: they bind threads themselves and
//! make their driver calls through [`crate::raw`], on cudarc's own layers (its safe types own
//! the context, streams, events and module; the measured calls are its `result` calls), and
//! build, capture and read CUDA graph templates with `boundpool-gpu`'s [`CudaGraphTemplate`]
//! and [`CaptureExt`] (cudarc has no template); [`captured_graph_on_worker`] runs inside a
//! node of a `boundpool-gpu` pool through its public API. They load the built-in kernels' PTX
//! ([`builtin::PTX`]) themselves.

use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use boundpool_gpu::{
    builtin, CaptureExt, CudaGraphNode, CudaGraphTemplate, GpuCtx, GpuDevice, GpuPool, Kernel,
    LaunchConfig, Module,
};
use cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};

use crate::raw::{self, Error, Func, GraphExec, Result};

/// What a baseline measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// Operations done (launches, tasks or edges, as the function says).
    pub ops: u64,
    /// Wall-clock time from the first operation until the device finished the last.
    pub elapsed: Duration,
}

impl Measurement {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-12)
    }
    /// Seconds per operation, in microseconds.
    pub fn micros_per_op(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e6 / (self.ops.max(1) as f64)
    }
}

/// A device's primary context plus the empty kernel, for the baselines. Made, and dropped, so
/// that only bound threads of its own make driver calls (the caller's thread stays unbound).
struct Raw {
    /// The retain (cudarc's); taken by the drop, which releases it on a thread of its own.
    ctx: Option<Arc<CudaContext>>,
    /// The empty kernel (it holds its module); taken by the drop, which unloads the module on
    /// a bound thread.
    empty: Option<CudaFunction>,
}

impl Raw {
    fn open(ordinal: i32) -> Result<Raw> {
        // Says why when there is no driver or device (cudarc would panic without libcuda).
        boundpool_gpu::device_count()?;
        let what = format!("baseline device {ordinal}");
        let ctx = raw::open_primary(ordinal)
            .map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", &what, e))?;
        let loaded = on_bound(&ctx, || {
            let module = raw::load_ptx(&ctx, builtin::PTX)
                .map_err(|e| Error::driver("cuModuleLoadData", &what, e))?;
            module
                .load_function(builtin::EMPTY)
                .map_err(|e| Error::driver("cuModuleGetFunction", &what, e))
        });
        let mut base = Raw {
            ctx: Some(ctx),
            empty: None,
        };
        base.empty = Some(loaded?);
        Ok(base)
    }

    fn ctx(&self) -> &Arc<CudaContext> {
        self.ctx.as_ref().expect("held until dropped")
    }

    /// The empty kernel's handle, valid while `self` lives.
    fn empty(&self) -> Func {
        Func::of(self.empty.as_ref().expect("held until dropped"))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let (ctx, f) = (self.ctx.take(), self.empty.take());
        if let Some(ctx) = ctx {
            let _ = on_bound(&ctx, move || {
                let _ = raw::ctx_synchronize();
                drop(f); // the module's last `Arc`: unloaded here
                Ok::<_, Error>(())
            });
            // cudarc's drop binds the dropping thread before the release: one of its own.
            std::thread::scope(|s| {
                s.spawn(move || {
                    drop(ctx);
                    let _ = raw::unbind();
                });
            });
        }
    }
}

/// Runs `f` on a fresh thread bound to `ctx`.
fn on_bound<R: Send>(ctx: &CudaContext, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    std::thread::scope(|s| {
        s.spawn(move || {
            bind(ctx)?;
            let r = f();
            let _ = raw::unbind();
            r
        })
        .join()
        .unwrap_or_else(|_| Err(Error::new("baseline thread panicked")))
    })
}

fn bind(ctx: &CudaContext) -> Result<()> {
    raw::bind(ctx).map_err(|e| Error::driver("cuCtxSetCurrent", "baseline", e))
}

fn drv<T>(call: &str, r: raw::DResult<T>) -> Result<T> {
    r.map_err(|e| Error::driver(call, "baseline", e))
}

/// A new stream of `ctx` (cudarc's: non-blocking, destroyed when its last `Arc` drops), made on
/// the calling thread, which must be bound to `ctx`.
fn new_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    drv("cuStreamCreate", ctx.new_stream())
}

fn launch_empty(f: Func, s: &CudaStream) -> Result<()> {
    // SAFETY: the empty kernel takes no parameters; its module is loaded while the baseline's
    // `Raw` (or the pool's device) lives.
    drv("cuLaunchKernel", unsafe {
        raw::launch(f, (1, 1, 1), (1, 1, 1), 0, s, &mut [])
    })
}

/// `threads` OS threads, each bound once with its own stream, each launching the empty kernel
/// `per_thread` times. `ops` = all launches.
pub fn raw_launches(ordinal: i32, threads: usize, per_thread: usize) -> Result<Measurement> {
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let barrier = Arc::new(Barrier::new(threads));
    let results: Vec<Result<(Instant, Instant)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = barrier.clone();
                s.spawn(move || -> Result<(Instant, Instant)> {
                    bind(ctx)?;
                    let st = new_stream(ctx)?;
                    for _ in 0..64 {
                        launch_empty(f, &st)?;
                    }
                    drv("cuStreamSynchronize", raw::stream_synchronize(&st))?;
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..per_thread {
                        launch_empty(f, &st)?;
                    }
                    drv("cuStreamSynchronize", raw::stream_synchronize(&st))?;
                    let t1 = Instant::now();
                    drop(st);
                    let _ = raw::unbind();
                    Ok((t0, t1))
                })
            })
            .collect();
        hs.into_iter().map(joined).collect()
    });
    let mut start: Option<Instant> = None;
    let mut end: Option<Instant> = None;
    for r in results {
        let (a, b) = r?;
        start = Some(start.map_or(a, |s| s.min(a)));
        end = Some(end.map_or(b, |e| e.max(b)));
    }
    drop(base);
    Ok(Measurement {
        ops: (threads * per_thread) as u64,
        elapsed: end.unwrap_or_else(Instant::now) - start.unwrap_or_else(Instant::now),
    })
}

/// One OS thread per task: spawn, bind, launch the empty kernel on a shared stream, exit; all
/// `tasks` spawned as one burst and joined at the end. `ops` = tasks.
pub fn thread_per_task(ordinal: i32, tasks: usize) -> Result<Measurement> {
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let st = on_bound(ctx, || new_stream(ctx))?;
    let t0 = Instant::now();
    let first_err = std::thread::scope(|s| {
        let hs: Vec<_> = (0..tasks)
            .map(|_| {
                let st = &st;
                s.spawn(move || -> Result<()> {
                    bind(ctx)?;
                    launch_empty(f, st)
                })
            })
            .collect();
        let mut first_err = None;
        for h in hs {
            if let Err(e) = joined(h) {
                first_err.get_or_insert(e);
            }
        }
        first_err
    });
    on_bound(ctx, || {
        drv("cuStreamSynchronize", raw::stream_synchronize(&st))
    })?;
    let elapsed = t0.elapsed();
    on_bound(ctx, move || {
        drop(st);
        Ok(())
    })?;
    if let Some(e) = first_err {
        return Err(e);
    }
    drop(base);
    Ok(Measurement {
        ops: tasks as u64,
        elapsed,
    })
}

type Job<'a> = Box<dyn FnOnce() + Send + 'a>;

/// One bound server thread with one stream, fed closures through a channel by `submitters`
/// threads; each closure launches the empty kernel. `ops` = launches.
pub fn server_thread(ordinal: i32, submitters: usize, total: usize) -> Result<Measurement> {
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    // The server's stream; the submitters' jobs borrow it, used only on the server thread.
    let st = on_bound(ctx, || new_stream(ctx))?;
    let per = total / submitters.max(1);
    let measured = std::thread::scope(|sc| {
        let st = &st;
        let (tx, rx) = mpsc::sync_channel::<Job<'_>>(4096);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let server = sc.spawn(move || {
            let _ = ready_tx.send(bind(ctx));
            while let Ok(job) = rx.recv() {
                job();
            }
            let _ = raw::stream_synchronize(st);
            let _ = raw::unbind();
        });
        ready_rx
            .recv()
            .map_err(|_| Error::new("server thread died"))??;
        let (done_tx, done_rx) = mpsc::channel::<Instant>();
        let barrier = Arc::new(Barrier::new(submitters + 1));
        let subs: Vec<_> = (0..submitters)
            .map(|_| {
                let tx = tx.clone();
                let barrier = barrier.clone();
                sc.spawn(move || {
                    barrier.wait();
                    for _ in 0..per {
                        let job: Job<'_> = Box::new(move || {
                            let _ = launch_empty(f, st);
                        });
                        if tx.send(job).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        for h in subs {
            let _ = h.join();
        }
        let done = done_tx.clone();
        let _ = tx.send(Box::new(move || {
            let _ = raw::stream_synchronize(st);
            let _ = done.send(Instant::now());
        }));
        drop(tx);
        let t1 = done_rx
            .recv()
            .map_err(|_| Error::new("server thread died"))?;
        let _ = server.join();
        Ok::<_, Error>(t1 - t0)
    });
    let _ = on_bound(ctx, move || {
        drop(st);
        Ok(())
    });
    let elapsed = measured?;
    drop(base);
    Ok(Measurement {
        ops: (per * submitters) as u64,
        elapsed,
    })
}

/// One thread, two streams: a chain of `edges` cross-stream edges, each made on the device with
/// an event (launch on A, record on A, wait on B, launch on B, record on B, wait on A, ...).
/// `ops` = edges.
pub fn event_edge_chain(ordinal: i32, edges: usize) -> Result<Measurement> {
    chain(ordinal, edges, false)
}

/// Same chain as [`event_edge_chain`], but each edge waits on the host (stream synchronise)
/// before the next launch. `ops` = edges.
pub fn host_sync_edge_chain(ordinal: i32, edges: usize) -> Result<Measurement> {
    chain(ordinal, edges, true)
}

fn chain(ordinal: i32, edges: usize, host: bool) -> Result<Measurement> {
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let m = on_bound(ctx, || {
        let s = [new_stream(ctx)?, new_stream(ctx)?];
        let ev = drv("cuEventCreate", ctx.new_event(None))?;
        let run = |n: usize| -> Result<Duration> {
            let t0 = Instant::now();
            launch_empty(f, &s[0])?;
            for i in 1..=n {
                let (a, b) = (&s[(i - 1) % 2], &s[i % 2]);
                if host {
                    drv("cuStreamSynchronize", raw::stream_synchronize(a))?;
                } else {
                    drv("cuEventRecord", raw::event_record(&ev, a))?;
                    drv("cuStreamWaitEvent", raw::stream_wait_event(b, &ev))?;
                }
                launch_empty(f, b)?;
            }
            drv("cuStreamSynchronize", raw::stream_synchronize(&s[n % 2]))?;
            Ok(t0.elapsed())
        };
        run(256)?;
        let el = run(edges)?;
        Ok(Measurement {
            ops: edges as u64,
            elapsed: el,
        })
    })?;
    drop(base);
    Ok(m)
}

/// A baseline thread's result; a panic is an error.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    h.join()
        .unwrap_or_else(|_| Err(Error::new("baseline thread panicked")))
}

/// The event-edge chain of [`event_edge_chain`] with its nodes alternating between two bound
/// threads, each with its own stream: thread `i % 2` runs node `i` once node `i - 1` was
/// enqueued (a spin on a shared counter, the cheapest possible host handoff): wait on the
/// predecessor's event, launch, record. The floor for a chain whose consecutive nodes run on
/// different workers and streams. `ops` = edges.
pub fn event_edge_chain_two_threads(ordinal: i32, edges: usize) -> Result<Measurement> {
    two_thread_chain(ordinal, edges, false)
}

/// [`event_edge_chain_two_threads`] with both threads launching on one stream, so an edge is
/// a launch and nothing else: the floor for a chain whose consecutive nodes run on different
/// workers and hand their stream over. `ops` = edges.
pub fn shared_stream_chain_two_threads(ordinal: i32, edges: usize) -> Result<Measurement> {
    two_thread_chain(ordinal, edges, true)
}

fn two_thread_chain(ordinal: i32, edges: usize, shared: bool) -> Result<Measurement> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const RING: usize = 4;
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let (streams, events) = on_bound(ctx, || {
        let s = [new_stream(ctx)?, new_stream(ctx)?];
        let mut ev = Vec::with_capacity(RING);
        for _ in 0..RING {
            ev.push(drv("cuEventCreate", ctx.new_event(None))?);
        }
        Ok((s, ev))
    })?;
    let run = |n: usize| -> Result<Duration> {
        let turn = AtomicUsize::new(0);
        let barrier = Barrier::new(2);
        let times: Vec<Result<(Option<Instant>, Option<Instant>)>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let (turn, barrier, events, streams) = (&turn, &barrier, &events, &streams);
                    sc.spawn(move || -> Result<(Option<Instant>, Option<Instant>)> {
                        bind(ctx)?;
                        let own = if shared { &streams[0] } else { &streams[t] };
                        barrier.wait();
                        let start = (t == 0).then(Instant::now);
                        let mut end = None;
                        let mut i = t;
                        let r = (|| {
                            while i <= n {
                                loop {
                                    match turn.load(Ordering::Acquire) {
                                        v if v == i => break,
                                        usize::MAX => {
                                            return Err(Error::new(
                                                "the other baseline thread failed",
                                            ))
                                        }
                                        _ => std::hint::spin_loop(),
                                    }
                                }
                                if i > 0 && !shared {
                                    let e = &events[(i - 1) % RING];
                                    drv("cuStreamWaitEvent", raw::stream_wait_event(own, e))?;
                                }
                                launch_empty(f, own)?;
                                if i < n && !shared {
                                    let e = &events[i % RING];
                                    drv("cuEventRecord", raw::event_record(e, own))?;
                                } else {
                                    drv("cuStreamSynchronize", raw::stream_synchronize(own))?;
                                    end = Some(Instant::now());
                                }
                                turn.store(i + 1, Ordering::Release);
                                i += 2;
                            }
                            Ok(())
                        })();
                        if r.is_err() {
                            // Let the other thread finish.
                            turn.store(usize::MAX, Ordering::Release);
                        }
                        let _ = raw::unbind();
                        r.map(|_| (start, end))
                    })
                })
                .collect();
            hs.into_iter().map(joined).collect()
        });
        let (mut start, mut end) = (None, None);
        for t in times {
            let (s, e) = t?;
            start = start.or(s);
            end = end.or(e);
        }
        match (start, end) {
            (Some(s), Some(e)) => Ok(e - s),
            _ => Err(Error::new("baseline chain ended early")),
        }
    };
    let m = run(256).and_then(|_| run(edges)).map(|el| Measurement {
        ops: edges as u64,
        elapsed: el,
    });
    let _ = on_bound(ctx, move || {
        drop(events);
        drop(streams);
        Ok(())
    });
    drop(base);
    m
}

/// Cost of one `cuEventRecord` + `cuEventQuery` pair and of one launch, on one bound thread, in
/// nanoseconds: `(launch, record, query)`. For the probe and for tuning.
pub fn call_costs(ordinal: i32, n: usize) -> Result<(f64, f64, f64)> {
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let r = on_bound(ctx, || {
        let s = new_stream(ctx)?;
        let ev = drv("cuEventCreate", ctx.new_event(None))?;
        let t0 = Instant::now();
        for _ in 0..n {
            launch_empty(f, &s)?;
        }
        let tl = t0.elapsed();
        drv("cuStreamSynchronize", raw::stream_synchronize(&s))?;
        let t0 = Instant::now();
        for _ in 0..n {
            drv("cuEventRecord", raw::event_record(&ev, &s))?;
        }
        let tr = t0.elapsed();
        drv("cuStreamSynchronize", raw::stream_synchronize(&s))?;
        let t0 = Instant::now();
        for _ in 0..n {
            drv("cuEventQuery", raw::event_query(&ev))?;
        }
        let tq = t0.elapsed();
        let per = |d: Duration| d.as_secs_f64() * 1e9 / n as f64;
        Ok((per(tl), per(tr), per(tq)))
    })?;
    drop(base);
    Ok(r)
}

/// What [`raw_graph`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct RawGraph {
    /// Kernel nodes of the graph.
    pub nodes: usize,
    /// Building the graph node by node (`cuGraphAddKernelNode`).
    pub build: Duration,
    /// `cuGraphInstantiateWithFlags`.
    pub instantiate: Duration,
    /// Each timed run: one launch and a stream synchronise.
    pub runs: Vec<Duration>,
}

/// Fails unless every predecessor of every node is below it (the order the graphs are built in).
fn check_preds(what: &str, preds: &[Vec<u32>]) -> Result<()> {
    match preds
        .iter()
        .enumerate()
        .find(|(i, ps)| ps.iter().any(|&p| p as usize >= *i))
    {
        Some((i, _)) => Err(Error::new(format!(
            "{what}: node {i} has a predecessor not below it"
        ))),
        None => Ok(()),
    }
}

/// A raw CUDA graph of the empty kernel `<<<1,1>>>`, one kernel node per entry of `preds`
/// (node `i` after every node in `preds[i]`, each of them below `i`), built with the driver
/// API, instantiated once, then launched and waited for (stream synchronise) `runs` times after
/// 3 warm-up runs, on one bound thread: the floor a replayed graph of the same topology is
/// measured against.
pub fn raw_graph(ordinal: i32, preds: &[Vec<u32>], runs: usize) -> Result<RawGraph> {
    check_preds("raw_graph", preds)?;
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let r = on_bound(ctx, || {
        let s = new_stream(ctx)?;
        let t0 = Instant::now();
        let g = build_graph(f, preds, StandInRoot::None)?;
        let build = t0.elapsed();
        let t1 = Instant::now();
        let exec = drv("cuGraphInstantiateWithFlags", GraphExec::instantiate(&g));
        let instantiate = t1.elapsed();
        drop(g);
        let exec = exec?;
        let mut timed = Vec::with_capacity(runs);
        for i in 0..runs + 3 {
            let t = Instant::now();
            drv("cuGraphLaunch", exec.launch(&s))?;
            drv("cuStreamSynchronize", raw::stream_synchronize(&s))?;
            if i >= 3 {
                timed.push(t.elapsed());
            }
        }
        Ok(RawGraph {
            nodes: preds.len(),
            build,
            instantiate,
            runs: timed,
        })
    });
    drop(base);
    r
}

/// Whether [`build_graph`] puts an empty node before the graph's roots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StandInRoot {
    /// No: the roots are the kernel nodes without predecessors.
    None,
    /// One empty node first, every kernel node without predecessors after it, destroyed
    /// (`cuGraphDestroyNode`) once the graph is built, as a capture's stand-in root is.
    Removed,
    /// The same empty node, kept.
    Kept,
}

/// The empty kernel `<<<1,1>>>` once per entry of `preds` (each predecessor below its node,
/// checked by the caller), added node by node (`cuGraphAddKernelNode`) to a new graph, with or
/// without an empty root first.
fn build_graph(f: Func, preds: &[Vec<u32>], root: StandInRoot) -> Result<CudaGraphTemplate> {
    let mut g = CudaGraphTemplate::new()?;
    let r = match root {
        StandInRoot::None => None,
        // SAFETY: no dependencies.
        StandInRoot::Removed | StandInRoot::Kept => Some(unsafe { g.add_empty_node(&[]) }?),
    };
    let mut nodes: Vec<CudaGraphNode> = Vec::with_capacity(preds.len());
    for ps in preds {
        let mut deps: Vec<CudaGraphNode> = ps.iter().map(|&p| nodes[p as usize]).collect();
        if let (true, Some(r)) = (deps.is_empty(), r) {
            deps.push(r);
        }
        // SAFETY: `deps` are nodes added to `g` above; `f` is the empty kernel (no
        // parameters) of a module the caller keeps loaded in the current context.
        nodes.push(unsafe { raw::add_empty_kernel(&mut g, &deps, f) }?);
    }
    if let (StandInRoot::Removed, Some(r)) = (root, r) {
        // SAFETY: `r` is the empty root added to `g` above.
        unsafe { g.remove_node(r) }?;
    }
    Ok(g)
}

/// What [`captured_graph`] measured, for telling apart what a replayed graph costs from what
/// the scheduler around it costs.
#[derive(Clone, Debug, PartialEq)]
pub struct CapturedGraph {
    /// Nodes and edges of the captured graph (after the stand-in root, if any, is removed).
    pub nodes: usize,
    /// Edges of the captured graph.
    pub edges: usize,
    /// Whether the driver refused an empty dependency set (a stand-in root was used).
    pub stand_in_root: bool,
    /// The capture, node by node.
    pub capture: Duration,
    /// `cuGraphInstantiateWithFlags` of the captured graph.
    pub instantiate: Duration,
    /// Each timed run: one launch and a stream synchronise.
    pub runs: Vec<Duration>,
    /// Each timed run: one launch, an event recorded after it and polled with `cuEventQuery`
    /// until complete (how a worker waits for a segment).
    pub polled_runs: Vec<Duration>,
    /// The first captured nodes, described (type, parameters, non-zero launch attributes).
    pub first_nodes: Vec<String>,
    /// The same for the graph [`raw_graph`] builds node by node.
    pub raw_first_nodes: Vec<String>,
}

/// The graph of [`raw_graph`], but captured from a stream the way a replay segment is
/// (thread-local mode, each node's dependencies set with `cuStreamUpdateCaptureDependencies`,
/// the empty kernel launched with `cuLaunchKernel`), then instantiated and launched like the
/// raw one; and the first nodes of both graphs described, to compare what the capture records.
/// `read_back_all`: each node's tail is read back (`cuStreamGetCaptureInfo`) after it, needed
/// or not; otherwise only where a later node depends on it, and the dependencies are set only
/// when they differ from the capture's current ones.
pub fn captured_graph(
    ordinal: i32,
    preds: &[Vec<u32>],
    runs: usize,
    read_back_all: bool,
) -> Result<CapturedGraph> {
    check_preds("captured_graph", preds)?;
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let r = on_bound(ctx, || {
        capture_and_time(ctx, f, preds, runs, read_back_all, None)
    });
    drop(base);
    r
}

/// [`captured_graph`] (tails read back only where needed) inside a node on a worker of `dev`:
/// captured on the worker's thread and launched on the node's stream, with the baseline's own
/// load of the empty kernel or, with `worker_function`, the worker's (the device's load of the
/// built-in module, which a replay captures). Tells apart what the thread, the stream and the
/// function handle do to a captured graph.
pub fn captured_graph_on_worker(
    pool: &GpuPool,
    dev: &GpuDevice,
    preds: &[Vec<u32>],
    runs: usize,
    worker_function: bool,
) -> Result<CapturedGraph> {
    check_preds("captured_graph_on_worker", preds)?;
    let base = Raw::open(dev.ordinal())?;
    let (ctx, f) = (base.ctx().clone(), base.empty());
    let preds = preds.to_vec();
    let kernel = Module::builtin().kernel(builtin::EMPTY)?;
    let r = pool.call(dev, move |gctx| {
        let s: &CudaStream = gctx.stream();
        let f = if worker_function {
            worker_function_of(gctx, &kernel, s)?
        } else {
            f
        };
        Ok(capture_and_time(&ctx, f, &preds, runs, false, Some(s))?)
    });
    drop(base);
    Ok(r?)
}

/// The function handle the worker running `gctx` launches `kernel` with (its device's load of
/// the module), through the pool's public API: one launch on the node's stream `s` (which
/// loads the module where the device has not yet, outside any capture), then one captured on
/// `s` (thread-local mode), whose kernel node names the function.
fn worker_function_of(gctx: &GpuCtx<'_, '_>, kernel: &Kernel, s: &CudaStream) -> Result<Func> {
    // SAFETY: the empty kernel takes no parameters.
    unsafe { gctx.launch(kernel, LaunchConfig::single()).launch()? };
    drv("cuStreamSynchronize", raw::stream_synchronize(s))?;
    drv(
        "cuStreamBeginCapture",
        s.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    )?;
    // SAFETY: as above.
    let launched = unsafe { gctx.launch(kernel, LaunchConfig::single()).launch() };
    let g = match (s.end_capture_template(), launched) {
        (Ok(Some(g)), Ok(())) => g,
        (_, Err(e)) | (Err(e), Ok(())) => return Err(e.into()),
        (Ok(None), Ok(())) => return Err(Error::new("capture made no graph")),
    };
    let f = match g.nodes()?[..] {
        // SAFETY: `n` is a node of `g`, which holds it.
        [n] => unsafe { raw::kernel_function(&g, n) }?,
        _ => None,
    };
    f.ok_or_else(|| Error::new("the captured launch is not one kernel node"))
}

/// The body of [`captured_graph`] on a thread bound to `ctx`: launches on `launch` (else a
/// stream of its own).
fn capture_and_time(
    ctx: &Arc<CudaContext>,
    f: Func,
    preds: &[Vec<u32>],
    runs: usize,
    read_back_all: bool,
    launch: Option<&CudaStream>,
) -> Result<CapturedGraph> {
    let owned = match launch {
        Some(_) => None,
        None => Some(new_stream(ctx)?),
    };
    let s = launch.or(owned.as_deref()).expect("one of the two");
    capture_and_time_on(ctx, f, preds, runs, read_back_all, s)
}

/// [`capture_and_time`] launching on `s`.
fn capture_and_time_on(
    ctx: &Arc<CudaContext>,
    f: Func,
    preds: &[Vec<u32>],
    runs: usize,
    read_back_all: bool,
    s: &CudaStream,
) -> Result<CapturedGraph> {
    // The node-by-node graph, for the description only.
    let rg = build_graph(f, &preds[..preds.len().min(4)], StandInRoot::None)?;
    let raw_first_nodes = rg.describe(4)?;
    drop(rg);

    let Captured {
        graph: g,
        stand_in_root,
        elapsed: capture,
    } = capture_graph(ctx, f, preds, read_back_all)?;
    let nodes = g.node_count()?;
    let edges = g.edge_count()?;
    let first_nodes = g.describe(4)?;
    let t1 = Instant::now();
    let exec = drv("cuGraphInstantiateWithFlags", GraphExec::instantiate(&g));
    let instantiate = t1.elapsed();
    drop(g);
    let exec = exec?;
    let ev = drv("cuEventCreate", ctx.new_event(None))?;
    let (mut timed, mut polled) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for i in 0..runs + 3 {
        let t = Instant::now();
        drv("cuGraphLaunch", exec.launch(s))?;
        drv("cuStreamSynchronize", raw::stream_synchronize(s))?;
        let d = t.elapsed();
        let t = Instant::now();
        drv("cuGraphLaunch", exec.launch(s))?;
        drv("cuEventRecord", raw::event_record(&ev, s))?;
        while !drv("cuEventQuery", raw::event_query(&ev))? {
            std::hint::spin_loop();
        }
        let p = t.elapsed();
        if i >= 3 {
            timed.push(d);
            polled.push(p);
        }
    }
    Ok(CapturedGraph {
        nodes,
        edges,
        stand_in_root,
        capture,
        instantiate,
        runs: timed,
        polled_runs: polled,
        first_nodes,
        raw_first_nodes,
    })
}

/// A graph captured by [`capture_graph`].
struct Captured {
    graph: CudaGraphTemplate,
    /// The driver refused an empty dependency set: a stand-in root was used, and removed.
    stand_in_root: bool,
    /// From the capture's start until its graph was ready (stand-in root removed).
    elapsed: Duration,
}

/// Captures the empty kernel once per entry of `preds` on a capture stream of its own, on a
/// thread bound to `ctx`, the way a replay segment is captured (`replay.rs`): thread-local
/// mode, each node's dependencies set with `cuStreamUpdateCaptureDependencies` to its
/// predecessors' tails, read back with `cuStreamGetCaptureInfo` (after every node with
/// `read_back_all`, else only after those a later node depends on, and the set skipped where it
/// is already the capture's current one); where the driver refuses an empty set, the roots
/// depend on a stand-in empty root instead, destroyed (`cuGraphDestroyNode`) after the capture.
fn capture_graph(
    ctx: &Arc<CudaContext>,
    f: Func,
    preds: &[Vec<u32>],
    read_back_all: bool,
) -> Result<Captured> {
    let cs = new_stream(ctx)?;
    let t0 = Instant::now();
    drv(
        "cuStreamBeginCapture",
        cs.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    )?;
    let failed = capture_nodes(&cs, f, preds, read_back_all);
    let g = cs.end_capture_template();
    drop(cs);
    let (root, mut g) = match (g, failed) {
        (Ok(Some(g)), Ok(root)) => (root, g),
        (_, Err(e)) => return Err(e),
        (Ok(None), Ok(_)) => return Err(Error::new("capture made no graph")),
        (Err(e), Ok(_)) => return Err(e.into()),
    };
    if let Some(r) = root {
        // SAFETY: `r` is the stand-in root the capture added to the graph it made, `g`.
        unsafe { g.remove_node(r) }?;
    }
    Ok(Captured {
        graph: g,
        stand_in_root: root.is_some(),
        elapsed: t0.elapsed(),
    })
}

/// [`capture_graph`]'s nodes, captured on `cs`; the stand-in root, if one was needed.
fn capture_nodes(
    cs: &CudaStream,
    f: Func,
    preds: &[Vec<u32>],
    read_back_all: bool,
) -> Result<Option<CudaGraphNode>> {
    let mut tails: Vec<Vec<CudaGraphNode>> = vec![Vec::new(); preds.len()];
    let mut needed = vec![read_back_all; preds.len()];
    for ps in preds {
        for &p in ps {
            needed[p as usize] = true;
        }
    }
    let mut current: Option<Vec<CudaGraphNode>> = Some(Vec::new());
    let mut root: Option<CudaGraphNode> = None;
    for (i, ps) in preds.iter().enumerate() {
        let mut deps: Vec<CudaGraphNode> = Vec::new();
        for &p in ps {
            for d in &tails[p as usize] {
                if !deps.contains(d) {
                    deps.push(*d);
                }
            }
        }
        if let (true, Some(r)) = (deps.is_empty(), root) {
            deps.push(r);
        }
        if read_back_all || current.as_ref() != Some(&deps) {
            // SAFETY: `deps` are tails read back from this capture, or its stand-in root.
            match unsafe { cs.set_capture_dependencies(&deps) } {
                Err(_) if deps.is_empty() => cs.add_capture_root().and_then(|r| {
                    root = Some(r);
                    // SAFETY: `r` was just added to this capture's graph.
                    unsafe { cs.set_capture_dependencies(&[r]) }
                }),
                other => other,
            }?;
        }
        launch_empty(f, cs)?;
        let t = if needed[i] {
            Some(cs.capture_dependencies()?)
        } else {
            None
        };
        current = t.clone();
        tails[i] = t.unwrap_or_default();
    }
    Ok(root)
}

/// A new graph with the kernel nodes and edges of `g`, added node by node in a topological
/// order (`cuGraphGetNodes`, `cuGraphGetEdges`, then `cuGraphKernelNodeGetParams` and
/// `cuGraphAddKernelNode` per node): the same work and topology as `g` without anything else
/// the capture recorded (launch attributes, the driver's internal layout). Fails on a node
/// that is not a kernel node.
fn rebuild_graph(g: &CudaGraphTemplate) -> Result<CudaGraphTemplate> {
    let nodes = g.nodes()?;
    let edges = g.edges()?;
    let index: std::collections::HashMap<CudaGraphNode, usize> =
        nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (a, b) in &edges {
        match (index.get(a), index.get(b)) {
            (Some(&a), Some(&b)) => {
                preds[b].push(a);
                succs[a].push(b);
            }
            _ => {
                return Err(Error::new(
                    "rebuild: an edge of the graph names a node cuGraphGetNodes did not list",
                ))
            }
        }
    }
    // Kahn's order, seeded in the driver's node order (for 1,000 roots: that order itself).
    let mut waiting: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut order: Vec<usize> = (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut next = 0;
    while next < order.len() {
        for &s in &succs[order[next]] {
            waiting[s] -= 1;
            if waiting[s] == 0 {
                order.push(s);
            }
        }
        next += 1;
    }
    if order.len() != nodes.len() {
        return Err(Error::new("rebuild: the graph's edges make a cycle"));
    }
    let mut new = CudaGraphTemplate::new()?;
    let mut added: Vec<Option<CudaGraphNode>> = vec![None; nodes.len()];
    for &i in &order {
        // Every predecessor came earlier in `order`, so it was added.
        let deps: Vec<CudaGraphNode> = preds[i].iter().filter_map(|&p| added[p]).collect();
        // SAFETY: `nodes[i]` is a node of `g`, which holds it.
        let Some(p) = unsafe { g.kernel_node_params(nodes[i]) }? else {
            return Err(Error::new(format!(
                "rebuild: node {i} of the graph is not a kernel node"
            )));
        };
        // SAFETY: `deps` are nodes added to `new` above; `p` is a kernel node's parameters as
        // the driver gave them (its function loaded in this context, its argument pointers
        // into the node's copy, valid while `g`, borrowed, lives).
        added[i] = Some(unsafe { new.add_kernel_node(&deps, &p) }?);
    }
    Ok(new)
}

/// The variants [`graph_variants`] builds, in its order: node by node (`plain`, as
/// [`raw_graph`]); node by node after an empty root that is then destroyed (`root_removed`)
/// or kept (`root_kept`); captured as a replay segment is (`captured`, as [`captured_graph`]
/// reading tails back only where needed); `cuGraphClone` of that capture (`captured_clone`);
/// and the capture rebuilt node by node from its nodes' parameters and its edges
/// (`captured_rebuilt`).
pub const GRAPH_VARIANTS: [&str; 6] = [
    "plain",
    "root_removed",
    "root_kept",
    "captured",
    "captured_clone",
    "captured_rebuilt",
];

/// One variant of [`graph_variants`].
#[derive(Clone, Debug, PartialEq)]
pub struct GraphVariant {
    /// Its name, one of [`GRAPH_VARIANTS`].
    pub name: &'static str,
    /// Nodes of its graph (`root_kept`: the kernel nodes and the empty root).
    pub nodes: usize,
    /// Edges of its graph.
    pub edges: usize,
    /// `cuGraphInstantiateWithFlags` of its graph.
    pub instantiate: Duration,
    /// Each timed run: one launch and a stream synchronise.
    pub runs: Vec<Duration>,
}

/// What [`graph_variants`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphVariants {
    /// The variants, in the order of [`GRAPH_VARIANTS`].
    pub variants: Vec<GraphVariant>,
    /// Whether the driver refused an empty dependency set during the capture (a stand-in root
    /// was used, and destroyed).
    pub stand_in_root: bool,
    /// The first nodes of the `plain`, `captured` and `captured_rebuilt` graphs, described
    /// (type, parameters, non-zero launch attributes).
    pub described: Vec<(&'static str, Vec<String>)>,
}

/// Why a graph captured from a stream launches slower than one built node by node: the graph of
/// [`raw_graph`] (the empty kernel once per entry of `preds`) made six ways
/// ([`GRAPH_VARIANTS`]) on one bound thread, each instantiated once, then all launched and
/// waited for (stream synchronise) in turn, `runs` times after 3 warm-up turns, so that drift
/// hits every variant alike. Fails if a variant's node or edge count differs from the DAG's
/// (`root_kept`: one node more, and an edge to each root).
pub fn graph_variants(ordinal: i32, preds: &[Vec<u32>], runs: usize) -> Result<GraphVariants> {
    check_preds("graph_variants", preds)?;
    let base = Raw::open(ordinal)?;
    let (ctx, f) = (base.ctx(), base.empty());
    let r = on_bound(ctx, || {
        let mut templates: Vec<(&'static str, CudaGraphTemplate)> = Vec::new();
        make_variants(ctx, f, preds, &mut templates)
            .and_then(|stand_in_root| time_variants(ctx, preds, runs, &templates, stand_in_root))
    });
    drop(base);
    r
}

/// Builds the graphs of [`GRAPH_VARIANTS`] into `out` (which owns them even when this fails
/// halfway); returns whether the capture used a stand-in root.
fn make_variants(
    ctx: &Arc<CudaContext>,
    f: Func,
    preds: &[Vec<u32>],
    out: &mut Vec<(&'static str, CudaGraphTemplate)>,
) -> Result<bool> {
    out.push(("plain", build_graph(f, preds, StandInRoot::None)?));
    out.push(("root_removed", build_graph(f, preds, StandInRoot::Removed)?));
    out.push(("root_kept", build_graph(f, preds, StandInRoot::Kept)?));
    let cap = capture_graph(ctx, f, preds, false)?;
    let c = out.len();
    out.push(("captured", cap.graph));
    let clone = out[c].1.try_clone()?;
    out.push(("captured_clone", clone));
    let rebuilt = rebuild_graph(&out[c].1)?;
    out.push(("captured_rebuilt", rebuilt));
    debug_assert!(out.iter().map(|v| v.0).eq(GRAPH_VARIANTS));
    Ok(cap.stand_in_root)
}

/// Checks, describes, instantiates and times the graphs of [`make_variants`].
fn time_variants(
    ctx: &Arc<CudaContext>,
    preds: &[Vec<u32>],
    runs: usize,
    templates: &[(&'static str, CudaGraphTemplate)],
    stand_in_root: bool,
) -> Result<GraphVariants> {
    let (n, e) = (preds.len(), preds.iter().map(Vec::len).sum::<usize>());
    let roots = preds.iter().filter(|ps| ps.is_empty()).count();
    let mut variants = Vec::with_capacity(templates.len());
    let mut described = Vec::new();
    for (name, g) in templates {
        let nodes = g.node_count()?;
        let edges = g.edge_count()?;
        let want = if *name == "root_kept" {
            (n + 1, e + roots)
        } else {
            (n, e)
        };
        if (nodes, edges) != want {
            return Err(Error::new(format!(
                "graph_variants: {name} has {nodes} nodes and {edges} edges, not {} and {}",
                want.0, want.1
            )));
        }
        if matches!(*name, "plain" | "captured" | "captured_rebuilt") {
            described.push((*name, g.describe(3)?));
        }
        variants.push(GraphVariant {
            name,
            nodes,
            edges,
            instantiate: Duration::ZERO,
            runs: Vec::with_capacity(runs),
        });
    }
    // Each variant its own executable, instantiated in the order of `GRAPH_VARIANTS`.
    let mut execs = Vec::with_capacity(templates.len());
    for ((_, g), v) in templates.iter().zip(&mut variants) {
        let t = Instant::now();
        let x = drv("cuGraphInstantiateWithFlags", GraphExec::instantiate(g))?;
        v.instantiate = t.elapsed();
        execs.push(x);
    }
    let st = new_stream(ctx)?;
    launch_in_turns(&st, &execs, &mut variants, runs)?;
    Ok(GraphVariants {
        variants,
        stand_in_root,
        described,
    })
}

/// Launches each of `execs` in turn on `s` and waits for it (stream synchronise), `runs + 3`
/// turns; from the fourth turn on, each launch's time goes to its variant's runs.
fn launch_in_turns(
    s: &CudaStream,
    execs: &[GraphExec],
    variants: &mut [GraphVariant],
    runs: usize,
) -> Result<()> {
    for i in 0..runs + 3 {
        for (x, v) in execs.iter().zip(variants.iter_mut()) {
            let t = Instant::now();
            drv("cuGraphLaunch", x.launch(s))?;
            drv("cuStreamSynchronize", raw::stream_synchronize(s))?;
            if i >= 3 {
                v.runs.push(t.elapsed());
            }
        }
    }
    Ok(())
}
