//! Scheduler statistics: live counters (read by `Pool::stats`) and their export through the
//! `metrics` facade.
//!
//! Each worker counts into its own cache-padded block with plain loads and stores (one writer),
//! and pushes the deltas to the `metrics` facade only every `FLUSH_EVERY` nodes and when it goes
//! idle, so with no recorder installed the hot path pays one ordinary add per event.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use crate::config::WorkerInfo;
use crate::error::Error;
use crate::sync::{AtomicU64, OwnedCounter};

/// Nodes between two flushes of a busy worker's counters to the `metrics` facade.
pub(crate) const FLUSH_EVERY: u64 = 1024;
/// One node in this many has its run time measured for the `boundpool_node_run_seconds` histogram.
pub(crate) const SAMPLE_EVERY: u64 = 4096;

pub(crate) struct WorkerCounters {
    pub(crate) nodes_run: OwnedCounter,
    pub(crate) steals: OwnedCounter,
    pub(crate) injector_pops: OwnedCounter,
    pub(crate) parks: OwnedCounter,
    pub(crate) skipped: OwnedCounter,
}

impl WorkerCounters {
    pub(crate) fn new() -> Self {
        WorkerCounters {
            nodes_run: OwnedCounter::new(),
            steals: OwnedCounter::new(),
            injector_pops: OwnedCounter::new(),
            parks: OwnedCounter::new(),
            skipped: OwnedCounter::new(),
        }
    }
}

pub(crate) struct PoolCounters {
    pub(crate) graphs_submitted: AtomicU64,
    pub(crate) graphs_completed: AtomicU64,
    pub(crate) graphs_failed: AtomicU64,
    pub(crate) nodes_cancelled: AtomicU64,
    /// Nodes run on the cpu lane (counted by the lane's threads, so shared).
    pub(crate) cpu_lane_nodes: AtomicU64,
    /// Submissions admitted under the pool's limit of graphs in flight.
    pub(crate) submissions_admitted: AtomicU64,
    /// Of those, the ones that waited for a slot.
    pub(crate) submissions_waited: AtomicU64,
    /// `try_submit`s turned away at the limit.
    pub(crate) submissions_rejected: AtomicU64,
}

impl PoolCounters {
    pub(crate) fn new() -> Self {
        PoolCounters {
            graphs_submitted: AtomicU64::new(0),
            graphs_completed: AtomicU64::new(0),
            graphs_failed: AtomicU64::new(0),
            nodes_cancelled: AtomicU64::new(0),
            cpu_lane_nodes: AtomicU64::new(0),
            submissions_admitted: AtomicU64::new(0),
            submissions_waited: AtomicU64::new(0),
            submissions_rejected: AtomicU64::new(0),
        }
    }
}

/// One worker's counters, as read by [`Pool::stats`](crate::Pool::stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Nodes this worker ran (bodies executed, failed or not).
    pub nodes_run: u64,
    /// Successful steals from other workers' deques.
    pub steals: u64,
    /// Batches taken from an injector (submissions from outside the pool, cross-group hand-offs).
    pub injector_pops: u64,
    /// Times the worker parked for lack of work.
    pub parks: u64,
    /// Ready nodes it skipped because their graph had failed or was cancelled.
    pub skipped: u64,
}

/// The pool's counters, read live, without a metrics recorder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Per worker, in index order.
    pub workers: Vec<WorkerStats>,
    /// Nodes run on the cpu lane.
    pub cpu_lane_nodes: u64,
    /// Graphs submitted.
    pub graphs_submitted: u64,
    /// Graphs that finished successfully.
    pub graphs_completed: u64,
    /// Graphs that failed or were cancelled.
    pub graphs_failed: u64,
    /// Nodes that never ran because their graph failed or was cancelled.
    pub nodes_cancelled: u64,
    /// Ready nodes waiting in queues at the time of the call (a snapshot).
    pub queue_depth: usize,
    /// Submissions admitted under the limit of graphs in flight (0 without a limit).
    pub submissions_admitted: u64,
    /// Admitted submissions that had to wait for a slot first.
    pub submissions_waited: u64,
    /// `try_submit`s turned away at the limit.
    pub submissions_rejected: u64,
    /// Submissions waiting for a slot now (blocked threads and pending futures; a snapshot).
    pub submissions_waiting: usize,
}

impl PoolStats {
    /// Nodes run, over all workers and the cpu lane.
    pub fn nodes_run(&self) -> u64 {
        self.workers.iter().map(|w| w.nodes_run).sum::<u64>() + self.cpu_lane_nodes
    }

    /// Steals, over all workers.
    pub fn steals(&self) -> u64 {
        self.workers.iter().map(|w| w.steals).sum()
    }

    /// Injector pops, over all workers.
    pub fn injector_pops(&self) -> u64 {
        self.workers.iter().map(|w| w.injector_pops).sum()
    }

    /// Parks, over all workers.
    pub fn parks(&self) -> u64 {
        self.workers.iter().map(|w| w.parks).sum()
    }
}

/// Every metric this crate emits: (name, kind, unit, labels, meaning). The table of
/// `docs/metrics.md` is generated from the same list by the `boundpool metrics` command.
pub const METRICS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "boundpool_nodes_run_total",
        "counter",
        "count",
        "pool, worker",
        "node bodies run by a worker",
    ),
    (
        "boundpool_steals_total",
        "counter",
        "count",
        "pool, worker",
        "ready nodes stolen from another worker's deque",
    ),
    (
        "boundpool_injector_pops_total",
        "counter",
        "count",
        "pool, worker",
        "batches taken from an injector (outside submissions, cross-group hand-offs)",
    ),
    (
        "boundpool_parks_total",
        "counter",
        "count",
        "pool, worker",
        "times a worker parked for lack of work",
    ),
    (
        "boundpool_cpu_lane_nodes_total",
        "counter",
        "count",
        "pool",
        "CPU-heavy nodes run on the rayon host-work lane",
    ),
    (
        "boundpool_graphs_submitted_total",
        "counter",
        "count",
        "pool",
        "graphs submitted",
    ),
    (
        "boundpool_graphs_completed_total",
        "counter",
        "count",
        "pool",
        "graphs that finished successfully",
    ),
    (
        "boundpool_graphs_failed_total",
        "counter",
        "count",
        "pool",
        "graphs failed by a node error or panic, or cancelled",
    ),
    (
        "boundpool_nodes_cancelled_total",
        "counter",
        "count",
        "pool",
        "nodes that never ran because their graph failed or was cancelled",
    ),
    (
        "boundpool_submissions_admitted_total",
        "counter",
        "count",
        "pool",
        "submissions admitted under the pool's limit of graphs in flight",
    ),
    (
        "boundpool_submissions_waited_total",
        "counter",
        "count",
        "pool",
        "admitted submissions that waited for a slot first",
    ),
    (
        "boundpool_submissions_rejected_total",
        "counter",
        "count",
        "pool",
        "try_submit calls turned away at the limit of graphs in flight",
    ),
    (
        "boundpool_submissions_waiting",
        "gauge",
        "count",
        "pool",
        "submissions waiting for admission (blocked threads and pending futures)",
    ),
    (
        "boundpool_workers",
        "gauge",
        "count",
        "pool",
        "worker threads of the pool (fixed at build)",
    ),
    (
        "boundpool_queue_depth",
        "gauge",
        "count",
        "pool, worker",
        "ready nodes in the worker's deque when it last flushed",
    ),
    (
        "boundpool_node_run_seconds",
        "histogram",
        "seconds",
        "pool",
        "run time of a node body (one node in 4,096 per worker is timed)",
    ),
    (
        "boundpool_graph_latency_seconds",
        "histogram",
        "seconds",
        "pool",
        "time from submit to the graph's completion",
    ),
];

fn describe() {
    for &(name, kind, unit, _, help) in METRICS {
        let unit = if unit == "seconds" {
            Unit::Seconds
        } else {
            Unit::Count
        };
        match kind {
            "counter" => describe_counter!(name, unit, help),
            "gauge" => describe_gauge!(name, unit, help),
            _ => describe_histogram!(name, unit, help),
        }
    }
}

/// A pool as its export sees it: the `pool` label, and whether it exports at all
/// (`PoolBuilder::metrics`). Made by `Registry::export`; every method is a no-op when off.
#[derive(Clone, Copy)]
pub(crate) struct Export<'a> {
    pub(crate) pool: &'a str,
    pub(crate) on: bool,
}

/// The per-worker counters a [`Flusher`] pushes, in its order.
const FLUSHED_COUNTERS: [&str; 4] = [
    "boundpool_nodes_run_total",
    "boundpool_steals_total",
    "boundpool_injector_pops_total",
    "boundpool_parks_total",
];

impl Export<'_> {
    /// Describes every metric, sets the workers gauge and registers every counter series of
    /// the pool at zero, so that a scrape shows each counter (its `# TYPE` line and a 0) before
    /// its first event: a pool that has not stolen yet still exports `boundpool_steals_total`,
    /// and `rate()` has a starting point.
    pub(crate) fn pool_started(self, infos: &[WorkerInfo], cpu_lane: bool) {
        if !self.on {
            return;
        }
        describe();
        let pool = self.pool.to_string();
        gauge!("boundpool_workers", "pool" => pool.clone()).set(infos.len() as f64);
        for name in [
            "boundpool_graphs_submitted_total",
            "boundpool_graphs_completed_total",
            "boundpool_graphs_failed_total",
            "boundpool_nodes_cancelled_total",
        ] {
            counter!(name, "pool" => pool.clone()).increment(0);
        }
        if cpu_lane {
            counter!("boundpool_cpu_lane_nodes_total", "pool" => pool.clone()).increment(0);
        }
        // Also without a limit (they stay at zero), so every pool exports every listed series.
        {
            for name in [
                "boundpool_submissions_admitted_total",
                "boundpool_submissions_waited_total",
                "boundpool_submissions_rejected_total",
            ] {
                counter!(name, "pool" => pool.clone()).increment(0);
            }
            gauge!("boundpool_submissions_waiting", "pool" => pool.clone()).set(0.0);
        }
        for info in infos {
            let worker = info.index.to_string();
            for name in FLUSHED_COUNTERS {
                counter!(name, "pool" => pool.clone(), "worker" => worker.clone()).increment(0);
            }
        }
    }

    pub(crate) fn graph_submitted(self) {
        if !self.on {
            return;
        }
        counter!("boundpool_graphs_submitted_total", "pool" => self.pool.to_string()).increment(1);
    }

    pub(crate) fn graph_finished(self, err: Option<&Error>, latency: Duration) {
        if !self.on {
            return;
        }
        let pool = self.pool.to_string();
        match err {
            None => {
                counter!("boundpool_graphs_completed_total", "pool" => pool.clone()).increment(1)
            }
            Some(e) => {
                counter!("boundpool_graphs_failed_total", "pool" => pool.clone()).increment(1);
                counter!("boundpool_nodes_cancelled_total", "pool" => pool.clone())
                    .increment(e.cancelled_nodes() as u64);
            }
        }
        histogram!("boundpool_graph_latency_seconds", "pool" => pool).record(latency.as_secs_f64());
    }

    /// A submission admitted under the pool's limit (after `waited`).
    pub(crate) fn submission_admitted(self, waited: bool) {
        if !self.on {
            return;
        }
        let pool = self.pool.to_string();
        counter!("boundpool_submissions_admitted_total", "pool" => pool.clone()).increment(1);
        if waited {
            counter!("boundpool_submissions_waited_total", "pool" => pool).increment(1);
        }
    }

    pub(crate) fn submission_rejected(self) {
        if !self.on {
            return;
        }
        counter!("boundpool_submissions_rejected_total", "pool" => self.pool.to_string())
            .increment(1);
    }

    /// The number of waiting submissions changed.
    pub(crate) fn submissions_waiting(self, waiting: usize) {
        if !self.on {
            return;
        }
        gauge!("boundpool_submissions_waiting", "pool" => self.pool.to_string())
            .set(waiting as f64);
    }

    pub(crate) fn cpu_lane_node(self) {
        if !self.on {
            return;
        }
        counter!("boundpool_cpu_lane_nodes_total", "pool" => self.pool.to_string()).increment(1);
    }
}

/// A worker's record of what it already pushed to the facade, and its metric handles, taken
/// from the recorder once when the worker starts (so a flush makes no allocation and no lookup;
/// install the recorder before building pools, as with any `metrics` library).
pub(crate) struct Flusher {
    counters: [metrics::Counter; 4],
    queue_depth: metrics::Gauge,
    run_time: metrics::Histogram,
    last: [u64; 4],
    samples: Vec<f64>,
}

impl Flusher {
    pub(crate) fn new(pool: &str, worker: usize) -> Self {
        let (pool, worker) = (pool.to_string(), worker.to_string());
        let counters = FLUSHED_COUNTERS
            .map(|name| counter!(name, "pool" => pool.clone(), "worker" => worker.clone()));
        Flusher {
            counters,
            queue_depth: gauge!("boundpool_queue_depth", "pool" => pool.clone(), "worker" => worker),
            run_time: histogram!("boundpool_node_run_seconds", "pool" => pool),
            last: [0; 4],
            samples: Vec::new(),
        }
    }

    pub(crate) fn sample(&mut self, secs: f64) {
        self.samples.push(secs);
    }

    pub(crate) fn flush(&mut self, c: &WorkerCounters, queue_depth: usize) {
        let now = [
            c.nodes_run.get(),
            c.steals.get(),
            c.injector_pops.get(),
            c.parks.get(),
        ];
        for (i, counter) in self.counters.iter().enumerate() {
            let d = now[i] - self.last[i];
            if d > 0 {
                counter.increment(d);
            }
        }
        self.last = now;
        self.queue_depth.set(queue_depth as f64);
        for s in self.samples.drain(..) {
            self.run_time.record(s);
        }
    }
}
