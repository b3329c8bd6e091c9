//! A worker thread, split by role as tokio splits its worker:
//!
//! * `mod.rs` (here): [`WorkerThread`], what a worker owns, and its main loop: find a task, run
//!   it, else poll deferred completions, else go idle;
//! * `life.rs`: the thread's life: the start-up gate, pinning and the start hook, the stop hook,
//!   and the aborts for panics outside a node body;
//! * `find.rs`: finding work: the own deque, the injectors, stealing, the levels' poll order,
//!   and the re-check before parking;
//! * `execute.rs`: running nodes: a task, the chain loop over its continuations with its landing
//!   pad, the slow paths (failed runs, CPU-heavy nodes, sampled and traced bodies);
//! * `complete.rs`: completing a node: releasing its successors (by class byte, a span, a wide
//!   join's batch, or the general path), queueing the ready ones, finishing runs;
//! * `idle.rs`: running dry: the spin, parking, the idle hook and metrics flush, deferred
//!   completions, and the help loop of a nested wait.
//!
//! A body sees its worker only as the [`NodeHost`] the worker owns (`ctx.rs`).

mod complete;
mod execute;
mod find;
mod idle;
mod life;

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_deque::Worker as Deque;
use crossbeam_utils::CachePadded;

pub(crate) use self::idle::{default_paced_spin, SPIN_BEFORE_PARK};
pub(crate) use self::life::{main, StartGate};
use crate::ctx::{DeferFn, NodeHost};
use crate::handle::Helper;
use crate::latch::Completion;
use crate::metrics::{Flusher, WorkerCounters, FLUSH_EVERY, SAMPLE_EVERY};
use crate::priority::WorkerDeques;
use crate::registry::{Finished, Registry};
use crate::run::{Credit, LeafBatcher, Task};

/// Nodes between two service points of a busy worker (idle hook, metrics flush, timing
/// sample); [`FLUSH_EVERY`] and [`SAMPLE_EVERY`] are multiples of it.
const SERVICE_EVERY: u64 = 64;
const _: () = assert!(FLUSH_EVERY % SERVICE_EVERY == 0 && SAMPLE_EVERY % SERVICE_EVERY == 0);

/// A node whose body deferred its completion, and the poll that completes it.
struct Deferred<S> {
    task: Task<S>,
    poll: DeferFn<S>,
    /// The node is of the high level: its completion is polled between tasks too, not only
    /// when the worker runs dry (a latency-critical request's GPU work ends while this worker
    /// runs other levels' nodes).
    urgent: bool,
}

pub(crate) struct WorkerThread<S> {
    pub(crate) registry: Arc<Registry<S>>,
    /// This worker's block of `registry.workers`, held directly to save the indexing per node.
    counters: Arc<CachePadded<WorkerCounters>>,
    pub(crate) index: usize,
    group: usize,
    /// The normal level's deque (the only one a pool without priorities uses).
    local: Deque<Task<S>>,
    high: Deque<Task<S>>,
    low: Deque<Task<S>>,
    /// Tasks taken from the queues in prioritized mode, for the fixed shares (`poll_order`).
    takes: Cell<u32>,
    /// What the bodies run here see: the worker's state and identity, the pool, the deferred
    /// completion a body leaves, and the `attention` flag of the chain loop.
    pub(crate) host: NodeHost<S>,
    deferred: RefCell<Vec<Deferred<S>>>,
    /// How many of `deferred` are `urgent`.
    urgent: Cell<u32>,
    /// Runs that finished here, to settle once no frame holds a reference to them.
    finished: RefCell<Vec<Finished<S>>>,
    /// Spare in-flight units of one run (see `Credit`): node completions and hand-offs on this
    /// worker touch no shared count.
    credit: Credit<S>,
    /// Nested waits (`help_until`) and spans (`run_span`) in progress on this worker: while
    /// there are any, a chain does not go on with the deque's top (`pop_local_of`).
    nesting: Cell<u32>,
    /// The run whose wide-join arrivals this worker batches (`batcher.run`), set by the
    /// outermost span in progress here (`run_span`), whose unit keeps the run alive until the
    /// span flushes the batch; nodes of that run count their arrivals at a wide join's leaf in
    /// `batcher.batch` (one read-modify-write per batch instead of one per node, which made a
    /// map-reduce's reduce a large part of a mapped node's cost).
    batcher: LeafBatcher<S>,
    /// When this worker, with deferred completions, last ran dry (see `idle::DEFERRED_SPIN`).
    dry_since: Cell<Option<Instant>>,
    /// When this worker last ran dry with nothing deferred, until it finds work again.
    went_dry: Cell<Option<Instant>>,
    /// The pace of this worker's recent pauses between running dry and finding work
    /// (`idle::next_pace`), for the paced spin.
    pace: Cell<Option<Duration>>,
    flusher: RefCell<Flusher>,
    rng: Cell<u64>,
    /// The task `find_task` just returned was stolen (for the trace).
    stolen: Cell<bool>,
}

impl<S: Send + 'static> Helper for WorkerThread<S> {
    fn help_until(&self, c: &Completion, deadline: Option<Instant>) -> bool {
        // The waiting body may already have deferred its completion: keep that apart while
        // other nodes run here, and put it back for the waiting node.
        let waiting = self.host.defer_slot.take();
        // The loop below does not go on with the span that batches here: count the batch now
        // (the span's unit keeps its run alive), and batch again once the body goes on.
        let batching = self.batcher.run.take();
        if let Some(run) = batching {
            self.flush_batch(run);
        }
        self.nesting.set(self.nesting.get() + 1);
        let done = self.help_loop(c, deadline);
        self.nesting.set(self.nesting.get() - 1);
        self.batcher.run.set(batching);
        self.host.defer_slot.set(waiting);
        self.host.attention.set(true);
        done
    }

    fn registry_addr(&self) -> usize {
        Arc::as_ptr(&self.registry) as *const () as usize
    }
}

impl<S: Send + 'static> WorkerThread<S> {
    fn new(reg: Arc<Registry<S>>, index: usize, deques: WorkerDeques<Task<S>>, state: S) -> Self {
        let WorkerDeques {
            normal: local,
            high,
            low,
        } = deques;
        let host = NodeHost::new(state, reg.infos[index].clone(), reg.clone());
        WorkerThread {
            group: reg.infos[index].group.index(),
            flusher: RefCell::new(Flusher::new(&reg.name, index)),
            counters: reg.workers[index].clone(),
            registry: reg,
            index,
            local,
            high,
            low,
            takes: Cell::new(0),
            host,
            deferred: RefCell::new(Vec::new()),
            urgent: Cell::new(0),
            finished: RefCell::new(Vec::new()),
            credit: Credit::new(),
            nesting: Cell::new(0),
            batcher: LeafBatcher::new(),
            dry_since: Cell::new(None),
            went_dry: Cell::new(None),
            pace: Cell::new(None),
            stolen: Cell::new(false),
            rng: Cell::new(
                0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
            ),
        }
    }

    #[inline]
    pub(super) fn counters(&self) -> &WorkerCounters {
        &self.counters
    }

    pub(super) fn main_loop(&self) {
        let mut idle_rounds = 0;
        loop {
            if let Some(t) = self.find_task() {
                self.note_work_found();
                self.execute(t);
                self.poll_urgent();
                idle_rounds = 0;
            } else if self.poll_deferred() {
                idle_rounds = 0;
            } else if self.registry.is_terminated() && self.deferred.borrow().is_empty() {
                // Spare units keep their run in the table, so none are left at termination.
                debug_assert_eq!(self.credit.units(), 0);
                break;
            } else {
                self.go_idle(&mut idle_rounds, &|| false, None);
            }
        }
    }
}
