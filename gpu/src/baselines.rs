//! Reference implementations of the alternatives boundpool is measured against, written straight
//! on the driver so that benchmarks can compare in one process: raw launches from `k` bound
//! threads, an OS thread per task, one server thread fed by a channel, and cross-stream edges
//! made with an event or with a host synchronise. Each launches the built-in empty kernel
//! `<<<1,1>>>` and counts the time until the work has completed on the device.
//!
//! These are benchmark baselines, not part of the framework: they bind threads themselves.

use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use crate::driver::{self, Ctx, Func, PrimaryCtx, StreamRef};
use crate::error::{GpuError, GpuErrorKind, GpuResult};
use crate::module::{builtin, Module};

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

/// A retained primary context plus the empty kernel, for the baselines.
struct Raw {
    ctx: Ctx,
    /// The retain and the module, owned; taken by the drop, which destroys them.
    primary: Option<PrimaryCtx>,
    module: Option<driver::Module>,
    empty: Func,
}

impl Raw {
    fn open(ordinal: i32) -> GpuResult<Raw> {
        crate::detect::detect()?;
        let what = format!("baseline device {ordinal}");
        let dev =
            driver::device_get(ordinal).map_err(|e| GpuError::driver("cuDeviceGet", &what, e))?;
        let primary = driver::primary_ctx_retain(dev)
            .map_err(|e| GpuError::driver("cuDevicePrimaryCtxRetain", &what, e))?;
        let ctx = primary.ctx();
        let m = Module::builtin();
        let loaded = on_bound(ctx, || {
            let module = driver::module_load(ctx, &m.inner.ptx)
                .map_err(|e| GpuError::driver("cuModuleLoadData", &what, e))?;
            let name = std::ffi::CString::new(builtin::EMPTY).expect("no NUL");
            match driver::module_function(ctx, &module, &name) {
                Ok(f) => Ok::<_, GpuError>((module, f)),
                Err(e) => {
                    let _ = module.unload(ctx);
                    Err(GpuError::driver("cuModuleGetFunction", &what, e))
                }
            }
        });
        let (module, empty) = match loaded {
            Ok(l) => l,
            Err(e) => {
                let _ = primary.release();
                return Err(e);
            }
        };
        Ok(Raw {
            ctx,
            primary: Some(primary),
            module: Some(module),
            empty,
        })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let (ctx, m) = (self.ctx, self.module.take());
        let _ = on_bound(ctx, || {
            let _ = driver::ctx_synchronize(ctx);
            if let Some(m) = m {
                let _ = m.unload(ctx);
            }
            Ok::<_, GpuError>(())
        });
        if let Some(p) = self.primary.take() {
            let _ = p.release();
        }
    }
}

/// Runs `f` on a fresh thread bound to `ctx`.
fn on_bound<R: Send>(ctx: Ctx, f: impl FnOnce() -> GpuResult<R> + Send) -> GpuResult<R> {
    std::thread::scope(|s| {
        s.spawn(move || {
            bind(ctx)?;
            let r = f();
            let _ = driver::ctx_unbind();
            r
        })
        .join()
        .unwrap_or_else(|_| {
            Err(GpuError::new(
                GpuErrorKind::Driver,
                "baseline thread panicked",
            ))
        })
    })
}

fn bind(ctx: Ctx) -> GpuResult<()> {
    driver::ctx_set_current(ctx).map_err(|e| GpuError::driver("cuCtxSetCurrent", "baseline", e))
}

fn drv<T>(call: &str, r: driver::DResult<T>) -> GpuResult<T> {
    r.map_err(|e| GpuError::driver(call, "baseline", e))
}

fn launch_empty(ctx: Ctx, f: Func, s: StreamRef) -> GpuResult<()> {
    // SAFETY: the empty kernel takes no parameters.
    drv("cuLaunchKernel", unsafe {
        driver::launch(ctx, f, (1, 1, 1), (1, 1, 1), 0, s, &mut [])
    })
}

/// `threads` OS threads, each bound once with its own stream, each launching the empty kernel
/// `per_thread` times. `ops` = all launches.
pub fn raw_launches(ordinal: i32, threads: usize, per_thread: usize) -> GpuResult<Measurement> {
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let barrier = Arc::new(Barrier::new(threads));
    let results: Vec<GpuResult<(Instant, Instant)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = barrier.clone();
                s.spawn(move || -> GpuResult<(Instant, Instant)> {
                    bind(ctx)?;
                    let owned = drv("cuStreamCreate", driver::stream_create(ctx))?;
                    let st = owned.view();
                    for _ in 0..64 {
                        launch_empty(ctx, f, st)?;
                    }
                    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..per_thread {
                        launch_empty(ctx, f, st)?;
                    }
                    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
                    let t1 = Instant::now();
                    let _ = owned.destroy(ctx);
                    let _ = driver::ctx_unbind();
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
    drop(raw);
    Ok(Measurement {
        ops: (threads * per_thread) as u64,
        elapsed: end.unwrap_or_else(Instant::now) - start.unwrap_or_else(Instant::now),
    })
}

/// One OS thread per task: spawn, bind, launch the empty kernel on a shared stream, exit; all
/// `tasks` spawned as one burst and joined at the end. `ops` = tasks.
pub fn thread_per_task(ordinal: i32, tasks: usize) -> GpuResult<Measurement> {
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let owned = on_bound(ctx, || drv("cuStreamCreate", driver::stream_create(ctx)))?;
    let st = owned.view();
    let t0 = Instant::now();
    let hs: Vec<_> = (0..tasks)
        .map(|_| {
            std::thread::spawn(move || -> GpuResult<()> {
                bind(ctx)?;
                launch_empty(ctx, f, st)
            })
        })
        .collect();
    let mut first_err = None;
    for h in hs {
        if let Err(e) = h
            .join()
            .unwrap_or_else(|_| Err(GpuError::new(GpuErrorKind::Driver, "task thread panicked")))
        {
            first_err.get_or_insert(e);
        }
    }
    on_bound(ctx, || {
        drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))
    })?;
    let elapsed = t0.elapsed();
    on_bound(ctx, || drv("cuStreamDestroy", owned.destroy(ctx)))?;
    if let Some(e) = first_err {
        return Err(e);
    }
    drop(raw);
    Ok(Measurement {
        ops: tasks as u64,
        elapsed,
    })
}

type Job = Box<dyn FnOnce() + Send>;

/// One bound server thread with one stream, fed closures through a channel by `submitters`
/// threads; each closure launches the empty kernel. `ops` = launches.
pub fn server_thread(ordinal: i32, submitters: usize, total: usize) -> GpuResult<Measurement> {
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let (tx, rx) = mpsc::sync_channel::<Job>(4096);
    // The server owns its stream; the submitters' jobs get a view, used only on the server
    // thread before it destroys the stream.
    let (ready_tx, ready_rx) = mpsc::channel::<GpuResult<StreamRef>>();
    let server = std::thread::spawn(move || {
        let st = bind(ctx).and_then(|_| drv("cuStreamCreate", driver::stream_create(ctx)));
        let _ = ready_tx.send(
            st.as_ref()
                .map(driver::Stream::view)
                .map_err(|e| GpuError::new(GpuErrorKind::Driver, e.message().to_owned())),
        );
        while let Ok(job) = rx.recv() {
            job();
        }
        if let Ok(st) = st {
            let _ = driver::stream_synchronize(ctx, st.view());
            let _ = st.destroy(ctx);
        }
        let _ = driver::ctx_unbind();
    });
    let st = ready_rx
        .recv()
        .map_err(|_| GpuError::new(GpuErrorKind::Driver, "server thread died"))??;
    let per = total / submitters.max(1);
    let (done_tx, done_rx) = mpsc::channel::<Instant>();
    let barrier = Arc::new(Barrier::new(submitters + 1));
    let subs: Vec<_> = (0..submitters)
        .map(|_| {
            let tx = tx.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..per {
                    let job: Job = Box::new(move || {
                        let _ = launch_empty(ctx, f, st);
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
        let _ = driver::stream_synchronize(ctx, st);
        let _ = done.send(Instant::now());
    }));
    drop(tx);
    let t1 = done_rx
        .recv()
        .map_err(|_| GpuError::new(GpuErrorKind::Driver, "server thread died"))?;
    let _ = server.join();
    drop(raw);
    Ok(Measurement {
        ops: (per * submitters) as u64,
        elapsed: t1 - t0,
    })
}

/// One thread, two streams: a chain of `edges` cross-stream edges, each made on the device with
/// an event (launch on A, record on A, wait on B, launch on B, record on B, wait on A, ...).
/// `ops` = edges.
pub fn event_edge_chain(ordinal: i32, edges: usize) -> GpuResult<Measurement> {
    chain(ordinal, edges, false)
}

/// Same chain as [`event_edge_chain`], but each edge waits on the host (stream synchronise)
/// before the next launch. `ops` = edges.
pub fn host_sync_edge_chain(ordinal: i32, edges: usize) -> GpuResult<Measurement> {
    chain(ordinal, edges, true)
}

fn chain(ordinal: i32, edges: usize, host: bool) -> GpuResult<Measurement> {
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let m = on_bound(ctx, || {
        let owned = [
            drv("cuStreamCreate", driver::stream_create(ctx))?,
            drv("cuStreamCreate", driver::stream_create(ctx))?,
        ];
        let s = [owned[0].view(), owned[1].view()];
        let ev = drv("cuEventCreate", driver::event_create(ctx))?;
        let run = |n: usize| -> GpuResult<Duration> {
            let t0 = Instant::now();
            launch_empty(ctx, f, s[0])?;
            for i in 1..=n {
                let (a, b) = (s[(i - 1) % 2], s[i % 2]);
                if host {
                    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, a))?;
                } else {
                    drv("cuEventRecord", driver::event_record(ctx, &ev, a))?;
                    drv("cuStreamWaitEvent", driver::stream_wait_event(ctx, b, &ev))?;
                }
                launch_empty(ctx, f, b)?;
            }
            drv(
                "cuStreamSynchronize",
                driver::stream_synchronize(ctx, s[n % 2]),
            )?;
            Ok(t0.elapsed())
        };
        run(256)?;
        let el = run(edges)?;
        let _ = ev.destroy(ctx);
        for s in owned {
            let _ = s.destroy(ctx);
        }
        Ok(Measurement {
            ops: edges as u64,
            elapsed: el,
        })
    })?;
    drop(raw);
    Ok(m)
}

/// A baseline thread's result; a panic is an error.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, GpuResult<T>>) -> GpuResult<T> {
    h.join().unwrap_or_else(|_| {
        Err(GpuError::new(
            GpuErrorKind::Driver,
            "baseline thread panicked",
        ))
    })
}

/// The event-edge chain of [`event_edge_chain`] with its nodes alternating between two bound
/// threads, each with its own stream: thread `i % 2` runs node `i` once node `i - 1` was
/// enqueued (a spin on a shared counter, the cheapest possible host handoff): wait on the
/// predecessor's event, launch, record. The floor for a chain whose consecutive nodes run on
/// different workers and streams. `ops` = edges.
pub fn event_edge_chain_two_threads(ordinal: i32, edges: usize) -> GpuResult<Measurement> {
    two_thread_chain(ordinal, edges, false)
}

/// [`event_edge_chain_two_threads`] with both threads launching on one stream, so an edge is
/// a launch and nothing else: the floor for a chain whose consecutive nodes run on different
/// workers and hand their stream over. `ops` = edges.
pub fn shared_stream_chain_two_threads(ordinal: i32, edges: usize) -> GpuResult<Measurement> {
    two_thread_chain(ordinal, edges, true)
}

fn two_thread_chain(ordinal: i32, edges: usize, shared: bool) -> GpuResult<Measurement> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const RING: usize = 4;
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let (owned, events) = on_bound(ctx, || {
        let s = [
            drv("cuStreamCreate", driver::stream_create(ctx))?,
            drv("cuStreamCreate", driver::stream_create(ctx))?,
        ];
        let mut ev = Vec::with_capacity(RING);
        for _ in 0..RING {
            ev.push(drv("cuEventCreate", driver::event_create(ctx))?);
        }
        Ok((s, ev))
    })?;
    let streams = [owned[0].view(), owned[1].view()];
    let run = |n: usize| -> GpuResult<Duration> {
        let turn = AtomicUsize::new(0);
        let barrier = Barrier::new(2);
        let times: Vec<GpuResult<(Option<Instant>, Option<Instant>)>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let (turn, barrier, events) = (&turn, &barrier, &events);
                    sc.spawn(move || -> GpuResult<(Option<Instant>, Option<Instant>)> {
                        bind(ctx)?;
                        let own = if shared { streams[0] } else { streams[t] };
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
                                            return Err(GpuError::new(
                                                GpuErrorKind::Driver,
                                                "the other baseline thread failed",
                                            ))
                                        }
                                        _ => std::hint::spin_loop(),
                                    }
                                }
                                if i > 0 && !shared {
                                    let e = &events[(i - 1) % RING];
                                    drv(
                                        "cuStreamWaitEvent",
                                        driver::stream_wait_event(ctx, own, e),
                                    )?;
                                }
                                launch_empty(ctx, f, own)?;
                                if i < n && !shared {
                                    let e = &events[i % RING];
                                    drv("cuEventRecord", driver::event_record(ctx, e, own))?;
                                } else {
                                    drv(
                                        "cuStreamSynchronize",
                                        driver::stream_synchronize(ctx, own),
                                    )?;
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
                        let _ = driver::ctx_unbind();
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
            _ => Err(GpuError::new(
                GpuErrorKind::Driver,
                "baseline chain ended early",
            )),
        }
    };
    let m = run(256).and_then(|_| run(edges)).map(|el| Measurement {
        ops: edges as u64,
        elapsed: el,
    });
    let _ = on_bound(ctx, || {
        for e in events {
            let _ = e.destroy(ctx);
        }
        for s in owned {
            let _ = s.destroy(ctx);
        }
        Ok(())
    });
    drop(raw);
    m
}

/// Cost of one `cuEventRecord` + `cuEventQuery` pair and of one launch, on one bound thread, in
/// nanoseconds: `(launch, record, query)`. For the probe and for tuning.
pub fn call_costs(ordinal: i32, n: usize) -> GpuResult<(f64, f64, f64)> {
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let r = on_bound(ctx, || {
        let owned = drv("cuStreamCreate", driver::stream_create(ctx))?;
        let s = owned.view();
        let ev = drv("cuEventCreate", driver::event_create(ctx))?;
        let t0 = Instant::now();
        for _ in 0..n {
            launch_empty(ctx, f, s)?;
        }
        let tl = t0.elapsed();
        drv("cuStreamSynchronize", driver::stream_synchronize(ctx, s))?;
        let t0 = Instant::now();
        for _ in 0..n {
            drv("cuEventRecord", driver::event_record(ctx, &ev, s))?;
        }
        let tr = t0.elapsed();
        drv("cuStreamSynchronize", driver::stream_synchronize(ctx, s))?;
        let t0 = Instant::now();
        for _ in 0..n {
            drv("cuEventQuery", driver::event_query(ctx, &ev))?;
        }
        let tq = t0.elapsed();
        let _ = ev.destroy(ctx);
        let _ = owned.destroy(ctx);
        let per = |d: Duration| d.as_secs_f64() * 1e9 / n as f64;
        Ok((per(tl), per(tr), per(tq)))
    })?;
    drop(raw);
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
fn check_preds(what: &str, preds: &[Vec<u32>]) -> GpuResult<()> {
    match preds
        .iter()
        .enumerate()
        .find(|(i, ps)| ps.iter().any(|&p| p as usize >= *i))
    {
        Some((i, _)) => Err(GpuError::new(
            GpuErrorKind::InvalidArgument,
            format!("{what}: node {i} has a predecessor not below it"),
        )),
        None => Ok(()),
    }
}

/// A raw CUDA graph of the empty kernel `<<<1,1>>>`, one kernel node per entry of `preds`
/// (node `i` after every node in `preds[i]`, each of them below `i`), built with the driver
/// API, instantiated once, then launched and waited for (stream synchronise) `runs` times after
/// 3 warm-up runs, on one bound thread: the floor a replayed graph of the same topology is
/// measured against.
pub fn raw_graph(ordinal: i32, preds: &[Vec<u32>], runs: usize) -> GpuResult<RawGraph> {
    check_preds("raw_graph", preds)?;
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let r = on_bound(ctx, || {
        let owned = drv("cuStreamCreate", driver::stream_create(ctx))?;
        let s = owned.view();
        let t0 = Instant::now();
        let mut g = drv("cuGraphCreate", driver::graph_create(ctx))?;
        let mut nodes: Vec<driver::GraphNode> = Vec::with_capacity(preds.len());
        let mut built = Ok(());
        for ps in preds {
            let deps: Vec<driver::GraphNode> = ps.iter().map(|&p| nodes[p as usize]).collect();
            match driver::graph_add_empty_kernel(ctx, &mut g, &deps, f) {
                Ok(n) => nodes.push(n),
                Err(e) => {
                    built = Err(GpuError::driver("cuGraphAddKernelNode", "baseline", e));
                    break;
                }
            }
        }
        let build = t0.elapsed();
        let t1 = Instant::now();
        let exec = built.and_then(|()| {
            drv(
                "cuGraphInstantiateWithFlags",
                driver::graph_instantiate(ctx, &g),
            )
        });
        let instantiate = t1.elapsed();
        let _ = g.destroy(ctx);
        let exec = match exec {
            Ok(e) => e,
            Err(e) => {
                let _ = owned.destroy(ctx);
                return Err(e);
            }
        };
        let mut timed = Vec::with_capacity(runs);
        let mut res = Ok(());
        for i in 0..runs + 3 {
            let t = Instant::now();
            let r = drv("cuGraphLaunch", driver::graph_launch(ctx, &exec, s))
                .and_then(|()| drv("cuStreamSynchronize", driver::stream_synchronize(ctx, s)));
            if let Err(e) = r {
                res = Err(e);
                break;
            }
            if i >= 3 {
                timed.push(t.elapsed());
            }
        }
        let _ = exec.destroy(ctx);
        let _ = owned.destroy(ctx);
        res.map(|()| RawGraph {
            nodes: preds.len(),
            build,
            instantiate,
            runs: timed,
        })
    });
    drop(raw);
    r
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
) -> GpuResult<CapturedGraph> {
    check_preds("captured_graph", preds)?;
    let raw = Raw::open(ordinal)?;
    let (ctx, f) = (raw.ctx, raw.empty);
    let r = on_bound(ctx, || {
        capture_and_time(ctx, f, preds, runs, read_back_all, None)
    });
    drop(raw);
    r
}

/// [`captured_graph`] (tails read back only where needed) inside a node on a worker of `dev`:
/// captured on the worker's thread and launched on the node's stream, with the baseline's own
/// load of the empty kernel or, with `worker_function`, the worker's (the device's load of the
/// built-in module, which a replay captures). Tells apart what the thread, the stream and the
/// function handle do to a captured graph.
pub fn captured_graph_on_worker(
    pool: &crate::GpuPool,
    dev: &crate::GpuDevice,
    preds: &[Vec<u32>],
    runs: usize,
    worker_function: bool,
) -> GpuResult<CapturedGraph> {
    check_preds("captured_graph_on_worker", preds)?;
    let raw = Raw::open(dev.ordinal())?;
    let f = raw.empty;
    let preds = preds.to_vec();
    let kernel = Module::builtin().kernel(builtin::EMPTY)?;
    let r = pool.call(dev, move |gctx| {
        let f = if worker_function {
            gctx.b.function(&kernel)?
        } else {
            f
        };
        Ok(capture_and_time(
            gctx.b.ctx,
            f,
            &preds,
            runs,
            false,
            Some(gctx.stream),
        )?)
    });
    drop(raw);
    r
}

/// The body of [`captured_graph`] on a thread bound to `ctx`: launches on `launch` (else a
/// stream of its own).
fn capture_and_time(
    ctx: Ctx,
    f: Func,
    preds: &[Vec<u32>],
    runs: usize,
    read_back_all: bool,
    launch: Option<StreamRef>,
) -> GpuResult<CapturedGraph> {
    let owned = drv("cuStreamCreate", driver::stream_create(ctx))?;
    let s = launch.unwrap_or_else(|| owned.view());
    // The node-by-node graph, for the description only.
    let mut rg = drv("cuGraphCreate", driver::graph_create(ctx))?;
    let mut built: Vec<driver::GraphNode> = Vec::new();
    for ps in preds.iter().take(4) {
        let deps: Vec<driver::GraphNode> = ps.iter().map(|&p| built[p as usize]).collect();
        built.push(drv(
            "cuGraphAddKernelNode",
            driver::graph_add_empty_kernel(ctx, &mut rg, &deps, f),
        )?);
    }
    let raw_first_nodes = drv("cuGraphGetNodes", driver::graph_describe(ctx, &rg, 4));
    let _ = rg.destroy(ctx);
    let raw_first_nodes = raw_first_nodes?;

    let cap_owned = drv("cuStreamCreate", driver::stream_create(ctx))?;
    let cs = cap_owned.view();
    let t0 = Instant::now();
    drv(
        "cuStreamBeginCapture",
        driver::stream_begin_capture(ctx, cs),
    )?;
    let mut tails: Vec<Vec<driver::GraphNode>> = vec![Vec::new(); preds.len()];
    let mut needed = vec![read_back_all; preds.len()];
    for ps in preds {
        for &p in ps {
            needed[p as usize] = true;
        }
    }
    let mut current: Option<Vec<driver::GraphNode>> = Some(Vec::new());
    let mut root: Option<driver::GraphNode> = None;
    let mut failed = None;
    for (i, ps) in preds.iter().enumerate() {
        let mut deps: Vec<driver::GraphNode> = Vec::new();
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
        let set = if !read_back_all && current.as_ref() == Some(&deps) {
            Ok(())
        } else {
            match driver::capture_set_dependencies(ctx, cs, &deps) {
                Err(_) if deps.is_empty() => driver::capture_add_root(ctx, cs).and_then(|r| {
                    root = Some(r);
                    driver::capture_set_dependencies(ctx, cs, &[r])
                }),
                other => other,
            }
        };
        let r = set
            .map_err(|e| GpuError::driver("cuStreamUpdateCaptureDependencies", "baseline", e))
            .and_then(|()| launch_empty(ctx, f, cs))
            .and_then(|()| {
                if needed[i] {
                    drv(
                        "cuStreamGetCaptureInfo",
                        driver::capture_dependencies(ctx, cs),
                    )
                    .map(Some)
                } else {
                    Ok(None)
                }
            });
        match r {
            Ok(t) => {
                current = t.clone();
                tails[i] = t.unwrap_or_default();
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let g = driver::stream_end_capture(ctx, cs);
    let _ = cap_owned.destroy(ctx);
    let mut g = match (g, failed) {
        (Ok(Some(g)), None) => g,
        (Ok(Some(g)), Some(e)) => {
            let _ = g.destroy(ctx);
            return Err(e);
        }
        (_, Some(e)) => return Err(e),
        (Ok(None), None) => {
            return Err(GpuError::new(GpuErrorKind::Driver, "capture made no graph"))
        }
        (Err(e), None) => return Err(GpuError::driver("cuStreamEndCapture", "baseline", e)),
    };
    if let Some(r) = root {
        drv(
            "cuGraphDestroyNode",
            driver::graph_remove_node(ctx, &mut g, r),
        )?;
    }
    let capture = t0.elapsed();
    let nodes = drv("cuGraphGetNodes", driver::graph_node_count(ctx, &g))?;
    let edges = drv("cuGraphGetEdges", driver::graph_edge_count(ctx, &g))?;
    let first_nodes = drv("cuGraphGetNodes", driver::graph_describe(ctx, &g, 4))?;
    let t1 = Instant::now();
    let exec = drv(
        "cuGraphInstantiateWithFlags",
        driver::graph_instantiate(ctx, &g),
    );
    let instantiate = t1.elapsed();
    let _ = g.destroy(ctx);
    let exec = exec?;
    let ev = drv("cuEventCreate", driver::event_create(ctx))?;
    let (mut timed, mut polled) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let mut res = Ok(());
    for i in 0..runs + 3 {
        let t = Instant::now();
        let r = drv("cuGraphLaunch", driver::graph_launch(ctx, &exec, s))
            .and_then(|()| drv("cuStreamSynchronize", driver::stream_synchronize(ctx, s)));
        let d = t.elapsed();
        let t = Instant::now();
        let r = r
            .and_then(|()| drv("cuGraphLaunch", driver::graph_launch(ctx, &exec, s)))
            .and_then(|()| drv("cuEventRecord", driver::event_record(ctx, &ev, s)))
            .and_then(|()| loop {
                match driver::event_query(ctx, &ev) {
                    Ok(true) => break Ok(()),
                    Ok(false) => std::hint::spin_loop(),
                    Err(e) => break Err(GpuError::driver("cuEventQuery", "baseline", e)),
                }
            });
        let p = t.elapsed();
        if let Err(e) = r {
            res = Err(e);
            break;
        }
        if i >= 3 {
            timed.push(d);
            polled.push(p);
        }
    }
    let _ = ev.destroy(ctx);
    let _ = exec.destroy(ctx);
    let _ = owned.destroy(ctx);
    res.map(|()| CapturedGraph {
        nodes,
        edges,
        stand_in_root: root.is_some(),
        capture,
        instantiate,
        runs: timed,
        polled_runs: polled,
        first_nodes,
        raw_first_nodes,
    })
}
