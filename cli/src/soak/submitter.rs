//! A submitter thread: it loops over scenarios picked by its own seeded generator, runs each on
//! the soak's pool and checks its outcome, until told to stop.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Weak};
use std::time::{Duration, Instant};

use boundpool::{ErrorKind, GraphBuilder, Pool, PoolBuilder, ShutdownMode};
use boundpool_workloads::busy_work;

use super::gpu::{self, GpuSide};
use super::graphs::{host_graph, Fault, Rng, Shape};
use super::tally::{check_failure, check_values, Tally};
use super::watch::{ExtraThreads, CANCEL_POOL_THREAD};
use crate::process::current_tid;

/// How long a dropped handle's graph may take to run and release what it holds.
const DROPPED_GRACE: Duration = Duration::from_secs(10);

/// What every submitter shares.
pub(super) struct Env<'a> {
    pub(super) gpu: Option<&'a GpuSide>,
    pub(super) tally: &'a Tally,
    pub(super) extra: &'a Arc<ExtraThreads>,
    pub(super) stop: &'a AtomicBool,
    pub(super) wrong_value: &'a AtomicBool,
}

/// What a submitter runs next.
enum Scenario {
    Plain,
    Faulty(Fault),
    Cancel,
    Nested,
    Dropped,
    Gpu,
}

impl Scenario {
    /// A pick in 0..100 as a scenario: 40% of the graphs are GPU ones with `gpu`, the host
    /// scenarios share the rest in fixed proportions.
    fn of(pick: u64, gpu: bool) -> Scenario {
        let pick = match gpu {
            true if pick < 40 => return Scenario::Gpu,
            true => (pick - 40) * 92 / 60,
            false => pick * 92 / 100,
        };
        match pick {
            0..=39 => Scenario::Plain,
            40..=51 => Scenario::Faulty(Fault::Error),
            52..=61 => Scenario::Faulty(Fault::Panic),
            62..=66 => Scenario::Cancel,
            67..=79 => Scenario::Nested,
            _ => Scenario::Dropped,
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

    fn late(&self) -> bool {
        self.since.elapsed() > DROPPED_GRACE
    }

    /// The violation of a graph that did not settle in time, for submitter `id`.
    fn violation(&self, id: usize) -> String {
        format!(
            "submitter {id}: a graph whose handle was dropped ran {} of {} nodes and still holds its closures after {DROPPED_GRACE:?}",
            self.runs.load(Ordering::Acquire),
            self.nodes
        )
    }
}

/// Submitter `id`: from `start` until `env.stop`, one scenario after another on `pool`.
pub(super) fn submitter<S: Send + 'static>(
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
        match Scenario::of(rng.below(100), env.gpu.is_some()) {
            Scenario::Plain => plain(&mut rng, &what, pool, env),
            Scenario::Faulty(f) => faulty(&mut rng, &what, pool, env, f),
            Scenario::Cancel => cancel(&mut rng, &what, env),
            Scenario::Nested => nested(&mut rng, &what, pool, env),
            Scenario::Dropped => dropped.push(drop_handle(&mut rng, &what, pool, env)),
            Scenario::Gpu => match env.gpu {
                Some(g) => gpu::scenario(&mut rng, &what, g, env.tally),
                None => unreachable!("the GPU scenario is only picked with --gpu"),
            },
        }
        Tally::add(&tally.graphs, 1);
        dropped.retain(|d| {
            if d.settled() {
                return false;
            }
            if d.late() {
                tally.violation(d.violation(id));
                return false;
            }
            true
        });
    }
    // The graphs still pending get their grace period too.
    for d in dropped {
        while !d.settled() && !d.late() {
            std::thread::sleep(Duration::from_millis(1));
        }
        if !d.settled() {
            tally.violation(d.violation(id));
        }
    }
}

/// A random DAG of host nodes, every output checked against the host's sum.
fn plain<S: Send + 'static>(rng: &mut Rng, what: &str, pool: &Pool<S>, env: &Env<'_>) {
    let tally = env.tally;
    let shape = Shape::random(rng, 48);
    let (g, refs) = host_graph::<S>("plain", &shape, None, None);
    Tally::add(&tally.nodes, shape.len() as u64);
    match pool.submit(&g).and_then(|h| h.wait()) {
        Ok(out) => {
            let wrong = env.wrong_value.swap(false, Ordering::Relaxed);
            check_values(tally, what, &shape, |i| out.get(refs[i]).copied(), wrong);
            Tally::add(&tally.ok, 1);
        }
        Err(e) => tally.violation(format!("{what}: a fault-free graph failed: {e}")),
    }
}

/// The same with one node made to return an error or to panic: the graph must fail so,
/// naming that node.
fn faulty<S: Send + 'static>(
    rng: &mut Rng,
    what: &str,
    pool: &Pool<S>,
    env: &Env<'_>,
    fault: Fault,
) {
    let tally = env.tally;
    let shape = Shape::random(rng, 48);
    let at = rng.below(shape.len() as u64) as usize;
    let (kind, counter) = match fault {
        Fault::Error => (ErrorKind::NodeFailed, &tally.errors),
        Fault::Panic => (ErrorKind::NodePanicked, &tally.panics),
    };
    let (g, _) = host_graph::<S>("faulty", &shape, Some((fault, at)), None);
    Tally::add(&tally.nodes, shape.len() as u64);
    Tally::add(counter, 1);
    let res = pool.submit(&g).and_then(|h| h.wait());
    check_failure(tally, what, res, kind, &[format!("n{at}")]);
}

/// A random DAG whose handle is dropped at once: it must still run every node and release
/// what its closures hold (checked later, by [`Dropped::settled`]).
fn drop_handle<S: Send + 'static>(
    rng: &mut Rng,
    what: &str,
    pool: &Pool<S>,
    env: &Env<'_>,
) -> Dropped {
    let tally = env.tally;
    let shape = Shape::random(rng, 32);
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
    Dropped {
        runs,
        nodes: shape.len() as u32,
        sentinel: weak,
        since: Instant::now(),
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
