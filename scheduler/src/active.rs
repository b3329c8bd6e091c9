//! The pool's table of active runs and its life (running, shutting down, terminated). A run
//! enters the table when it starts and leaves it when it finishes; shutdown reaches every run
//! through it (to cancel them) and ends once it is empty.
//!
//! Every start and every end of every client's graph passes here, so the table is split into
//! shards by run id, and nothing on that path makes a system call. With one lock, a client
//! thread preempted while holding it (a server's client threads often outnumber its cores)
//! held up the start and the end of every other graph, a latency-critical one's included.
//! Only shutdown locks every shard, waits and wakes.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::{self, AtomicU8, Condvar, Mutex, Ordering};

/// A pool's number of shards: enough that a preempted holder stalls few of the runs in flight.
pub(crate) const SHARDS: usize = 32;

const RUNNING: u8 = 0;
const SHUTTING_DOWN: u8 = 1;
const TERMINATED: u8 = 2;

type Shard<R> = CachePadded<Mutex<HashMap<u64, Arc<R>>>>;

/// The active runs (`R`: the registry's `Run`) of a pool, by id, and the pool's life.
pub(crate) struct ActiveRuns<R> {
    shards: Box<[Shard<R>]>,
    state: AtomicU8,
    /// Held by a thread that waits for the end of the shutdown, and by the one that ends it.
    ended: Mutex<()>,
    ended_changed: Condvar,
}

impl<R> ActiveRuns<R> {
    /// An empty table of `shards` shards (at least one).
    pub(crate) fn new(shards: usize) -> Self {
        ActiveRuns {
            shards: (0..shards.max(1))
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            state: AtomicU8::new(RUNNING),
            ended: Mutex::new(()),
            ended_changed: Condvar::new(),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Arc<R>>> {
        &self.shards[(id % self.shards.len() as u64) as usize]
    }

    /// Enters `run` under `id`, unless the pool is shutting down (`false`: not entered).
    pub(crate) fn enter(&self, id: u64, run: &Arc<R>) -> bool {
        let mut shard = sync::lock(self.shard(id));
        // Read under the shard's lock: `close` changes the state holding every shard's, so a
        // run is either entered before it (and cancelled by it) or refused.
        if self.state.load(Ordering::Acquire) != RUNNING {
            return false;
        }
        shard.insert(id, run.clone());
        true
    }

    /// Takes run `id` out, returning the table's reference to it. If the pool is shutting down
    /// and this was its last run, ends the shutdown, calling `on_end` first.
    pub(crate) fn leave(&self, id: u64, on_end: impl FnOnce()) -> Option<Arc<R>> {
        let keep = sync::lock(self.shard(id)).remove(&id);
        // After the shard's lock: if `close` held it before us, this load sees its state; if
        // after, its own look at the shards sees this run gone. Either way someone ends it.
        if self.state.load(Ordering::Acquire) == SHUTTING_DOWN {
            self.end_if_empty(on_end);
        }
        keep
    }

    /// The number of runs in the table: a snapshot, every shard held at once (in order, as
    /// `close` holds them). A look at each shard in turn could count a run that left one shard
    /// and the next run of its client, entered in a later one, both: more than were ever in
    /// flight at once (more than an admission limit allows).
    pub(crate) fn len(&self) -> usize {
        let shards: Vec<_> = self.shards.iter().map(|s| sync::lock(s)).collect();
        shards.iter().map(|s| s.len()).sum()
    }

    /// Whether the pool still takes runs (no shutdown has begun).
    pub(crate) fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == RUNNING
    }

    pub(crate) fn is_terminated(&self) -> bool {
        self.state.load(Ordering::Acquire) == TERMINATED
    }

    /// Stops new entries, calls `each` on every run in the table (with every shard held, so
    /// none enters or leaves meanwhile), and ends the shutdown at once if the table is empty,
    /// calling `on_end` first. Later calls only call `each` again.
    pub(crate) fn close(&self, each: impl Fn(&R), on_end: impl FnOnce()) {
        {
            let shards: Vec<_> = self.shards.iter().map(|s| sync::lock(s)).collect();
            let _ = self.state.compare_exchange(
                RUNNING,
                SHUTTING_DOWN,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            for run in shards.iter().flat_map(|s| s.values()) {
                each(run);
            }
        }
        self.end_if_empty(on_end);
    }

    /// Ends the shutdown if no run is left; once only, whoever calls it.
    fn end_if_empty(&self, on_end: impl FnOnce()) {
        if self.shards.iter().any(|s| !sync::lock(s).is_empty()) {
            return;
        }
        if self
            .state
            .compare_exchange(
                SHUTTING_DOWN,
                TERMINATED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            on_end();
            let _ended = sync::lock(&self.ended);
            self.ended_changed.notify_all();
        }
    }

    /// Blocks until the shutdown has ended (the last run left after `close`).
    pub(crate) fn wait_terminated(&self) {
        let mut ended = sync::lock(&self.ended);
        while !self.is_terminated() {
            ended = match self.ended_changed.wait(ended) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};

    #[test]
    fn runs_enter_and_leave_their_shards_and_a_closed_table_refuses_them() {
        let t = ActiveRuns::<u32>::new(4);
        for id in 0..10 {
            assert!(t.enter(id, &Arc::new(id as u32)));
        }
        assert_eq!(t.len(), 10);
        assert_eq!(
            t.leave(3, || panic!("not shutting down")).as_deref(),
            Some(&3)
        );
        assert!(t.leave(3, || panic!("not shutting down")).is_none());
        assert_eq!(t.len(), 9);
        let seen = AtomicUsize::new(0);
        let ended = AtomicUsize::new(0);
        t.close(
            |_| {
                seen.fetch_add(1, StdOrdering::Relaxed);
            },
            || {
                ended.fetch_add(1, StdOrdering::Relaxed);
            },
        );
        assert_eq!(
            seen.load(StdOrdering::Relaxed),
            9,
            "close reaches every run"
        );
        assert!(!t.is_open());
        assert!(!t.is_terminated(), "runs are left");
        assert!(!t.enter(42, &Arc::new(42)), "no run enters after close");
        for id in (0..10).filter(|&i| i != 3) {
            assert!(t
                .leave(id, || {
                    ended.fetch_add(1, StdOrdering::Relaxed);
                })
                .is_some());
        }
        assert!(t.is_terminated());
        assert_eq!(ended.load(StdOrdering::Relaxed), 1, "the end comes once");
        t.wait_terminated();
    }

    #[test]
    fn the_count_never_exceeds_the_runs_in_flight_at_once() {
        // Four clients, each with one run in the table at a time, ids spread over the shards.
        let t = Arc::new(ActiveRuns::<u64>::new(SHARDS));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..4u64)
            .map(|c| {
                let (t, stop) = (t.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut id = c;
                    while !stop.load(StdOrdering::Relaxed) {
                        assert!(t.enter(id, &Arc::new(id)));
                        assert!(t.leave(id, || {}).is_some());
                        id += 4 * 7;
                    }
                })
            })
            .collect();
        let mut peak = 0;
        for _ in 0..if cfg!(miri) { 50 } else { 20_000 } {
            peak = peak.max(t.len());
        }
        stop.store(true, StdOrdering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
        assert!(peak <= 4, "counted {peak} runs, 4 at most were in at once");
    }

    #[test]
    fn an_empty_table_ends_at_close() {
        let t = ActiveRuns::<u32>::new(SHARDS);
        let ended = AtomicUsize::new(0);
        t.close(
            |_| unreachable!(),
            || {
                ended.fetch_add(1, StdOrdering::Relaxed);
            },
        );
        assert!(t.is_terminated());
        t.close(|_| unreachable!(), || unreachable!("ended once"));
        assert_eq!(ended.load(StdOrdering::Relaxed), 1);
        t.wait_terminated();
    }

    #[test]
    fn a_shutdown_racing_the_last_runs_ends_once() {
        for _ in 0..if cfg!(miri) { 4 } else { 200 } {
            let t = Arc::new(ActiveRuns::<u32>::new(2));
            for id in 0..4 {
                assert!(t.enter(id, &Arc::new(id as u32)));
            }
            let ended = Arc::new(AtomicUsize::new(0));
            let leavers: Vec<_> = (0..4)
                .map(|id| {
                    let (t, ended) = (t.clone(), ended.clone());
                    std::thread::spawn(move || {
                        t.leave(id, || {
                            ended.fetch_add(1, StdOrdering::Relaxed);
                        })
                    })
                })
                .collect();
            t.close(
                |_| {},
                || {
                    ended.fetch_add(1, StdOrdering::Relaxed);
                },
            );
            t.wait_terminated();
            for l in leavers {
                assert!(l.join().unwrap().is_some());
            }
            assert_eq!(ended.load(StdOrdering::Relaxed), 1);
        }
    }
}
