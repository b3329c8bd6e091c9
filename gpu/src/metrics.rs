//! The GPU backend's metrics, through the `metrics` facade, per device (labels `pool` and
//! `device`), named as the scheduler's (`_total` counters, base units).
//!
//! Each device keeps handles registered once at build (so a recorder must be installed before
//! the pool is built, as for the scheduler's); an event is one add on a handle, and with no
//! recorder a handle does nothing. Edges are counted per worker in plain cells and pushed
//! every [`FLUSH_EVERY`] GPU nodes and when the worker goes idle or stops.

use std::cell::Cell;

use metrics::{counter, describe_counter, describe_gauge, gauge, Counter, Gauge, Unit};

/// Every metric of the GPU backend: (name, type, unit, labels, meaning), as the scheduler's
/// `METRICS` (the facade's `metrics_table` lists both).
pub const GPU_METRICS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "boundpool_gpu_live_buffers",
        "gauge",
        "count",
        "pool, device",
        "device buffers (`DeviceBuffer`) of the device not yet freed",
    ),
    (
        "boundpool_gpu_live_bytes",
        "gauge",
        "bytes",
        "pool, device",
        "the bytes of those buffers",
    ),
    (
        "boundpool_gpu_releases_queued_total",
        "counter",
        "count",
        "pool, device",
        "device and pinned buffers and replay executables dropped and queued for a bound worker of the device",
    ),
    (
        "boundpool_gpu_releases_done_total",
        "counter",
        "count",
        "pool, device",
        "of those, released by a bound worker (or by the device's teardown)",
    ),
    (
        "boundpool_gpu_event_edges_total",
        "counter",
        "count",
        "pool, device",
        "GPU edges crossed with a device-side event wait (`cuStreamWaitEvent`)",
    ),
    (
        "boundpool_gpu_stream_handoffs_total",
        "counter",
        "count",
        "pool, device",
        "GPU edges crossed by handing the predecessor's stream over (no event)",
    ),
    (
        "boundpool_gpu_captures_total",
        "counter",
        "count",
        "pool, device",
        "replay segments captured (first captures and updates)",
    ),
    (
        "boundpool_gpu_capture_failures_total",
        "counter",
        "count",
        "pool, device",
        "replay segment captures that failed (the error names the graph, the node and why; the graph then runs eagerly until `Replayable::update`)",
    ),
    (
        "boundpool_gpu_replays_total",
        "counter",
        "count",
        "pool, device",
        "replay segment executables launched",
    ),
    (
        "boundpool_gpu_exec_updates_total",
        "counter",
        "count",
        "pool, device",
        "replay executables updated in place (`cuGraphExecUpdate`)",
    ),
    (
        "boundpool_gpu_exec_instantiations_total",
        "counter",
        "count",
        "pool, device",
        "replay executables instantiated (first captures, and updates the driver refused)",
    ),
    (
        "boundpool_gpu_sticky_failures_total",
        "counter",
        "count",
        "pool, device",
        "devices marked failed by a sticky CUDA error (1 at most per device and pool)",
    ),
    (
        "boundpool_gpu_partition_sms",
        "gauge",
        "count",
        "pool, device, partition",
        "the SMs of each SM partition of the device, as the driver gave them (`GpuPoolBuilder::sm_partitions`; `unused` for SMs no partition got; `all`, the device's SMs, without partitions)",
    ),
    (
        "boundpool_gpu_worker_partition",
        "gauge",
        "count",
        "pool, device, worker, partition",
        "1 for each device worker, naming its SM partition (`all` without partitions): the `worker` label of the scheduler's metrics",
    ),
];

/// GPU nodes between two pushes of a busy worker's edge counts.
pub(crate) const FLUSH_EVERY: u64 = 1024;

fn describe() {
    for &(name, kind, unit, _, help) in GPU_METRICS {
        let unit = if unit == "bytes" {
            Unit::Bytes
        } else {
            Unit::Count
        };
        if kind == "gauge" {
            describe_gauge!(name, unit, help);
        } else {
            describe_counter!(name, unit, help);
        }
    }
}

/// One device's metric handles.
#[derive(Debug)]
pub(crate) struct DeviceMetrics {
    pub(crate) live_buffers: Gauge,
    pub(crate) live_bytes: Gauge,
    pub(crate) releases_queued: Counter,
    pub(crate) releases_done: Counter,
    pub(crate) event_edges: Counter,
    pub(crate) stream_handoffs: Counter,
    pub(crate) captures: Counter,
    pub(crate) capture_failures: Counter,
    pub(crate) replays: Counter,
    pub(crate) exec_updates: Counter,
    pub(crate) exec_instantiations: Counter,
    pub(crate) sticky_failures: Counter,
}

impl DeviceMetrics {
    /// Handles that do nothing (a device not yet registered, or the probe's).
    pub(crate) fn noop() -> Self {
        Self {
            live_buffers: Gauge::noop(),
            live_bytes: Gauge::noop(),
            releases_queued: Counter::noop(),
            releases_done: Counter::noop(),
            event_edges: Counter::noop(),
            stream_handoffs: Counter::noop(),
            captures: Counter::noop(),
            capture_failures: Counter::noop(),
            replays: Counter::noop(),
            exec_updates: Counter::noop(),
            exec_instantiations: Counter::noop(),
            sticky_failures: Counter::noop(),
        }
    }

    /// Describes the metrics and registers the device's series at zero, so that a scrape shows
    /// each one before its first event.
    pub(crate) fn register(pool: &str, device: i32) -> Self {
        describe();
        let l = |name: &'static str| {
            let c = counter!(name, "pool" => pool.to_owned(), "device" => device.to_string());
            c.increment(0);
            c
        };
        let g = |name: &'static str| {
            let g = gauge!(name, "pool" => pool.to_owned(), "device" => device.to_string());
            g.set(0.0);
            g
        };
        Self {
            live_buffers: g("boundpool_gpu_live_buffers"),
            live_bytes: g("boundpool_gpu_live_bytes"),
            releases_queued: l("boundpool_gpu_releases_queued_total"),
            releases_done: l("boundpool_gpu_releases_done_total"),
            event_edges: l("boundpool_gpu_event_edges_total"),
            stream_handoffs: l("boundpool_gpu_stream_handoffs_total"),
            captures: l("boundpool_gpu_captures_total"),
            capture_failures: l("boundpool_gpu_capture_failures_total"),
            replays: l("boundpool_gpu_replays_total"),
            exec_updates: l("boundpool_gpu_exec_updates_total"),
            exec_instantiations: l("boundpool_gpu_exec_instantiations_total"),
            sticky_failures: l("boundpool_gpu_sticky_failures_total"),
        }
    }
}

/// Sets the SM count of each of device `device`'s partitions (name, SMs), and of its unused SMs
/// if any, once at the pool's build.
pub(crate) fn register_partitions(pool: &str, device: i32, parts: &[(&str, u32)], unused: u32) {
    describe();
    let unused = (unused > 0).then_some(("unused", unused));
    for &(name, sms) in parts.iter().chain(unused.as_ref()) {
        gauge!("boundpool_gpu_partition_sms", "pool" => pool.to_owned(), "device" => device.to_string(), "partition" => name.to_owned())
            .set(f64::from(sms));
    }
}

/// Names the SM partition (`all` without partitions) of each device worker, by its index in
/// the pool (the scheduler's `worker` label), once at the pool's build.
pub(crate) fn register_workers(pool: &str, workers: &[(i32, usize, &str)]) {
    describe();
    for &(device, worker, partition) in workers {
        gauge!("boundpool_gpu_worker_partition", "pool" => pool.to_owned(), "device" => device.to_string(), "worker" => worker.to_string(), "partition" => partition.to_owned())
            .set(1.0);
    }
}

/// A worker's edge counts not yet pushed (one writer: the worker).
#[derive(Debug, Default)]
pub(crate) struct EdgeCounts {
    event_edges: Cell<u64>,
    handoffs: Cell<u64>,
    nodes: Cell<u64>,
}

impl EdgeCounts {
    /// Counts one GPU node's edges; pushes every [`FLUSH_EVERY`] nodes.
    #[inline]
    pub(crate) fn node(&self, event_edges: u64, handoff: bool, m: &DeviceMetrics) {
        self.event_edges.set(self.event_edges.get() + event_edges);
        self.handoffs.set(self.handoffs.get() + u64::from(handoff));
        let n = self.nodes.get() + 1;
        self.nodes.set(n);
        if n % FLUSH_EVERY == 0 {
            self.flush(m);
        }
    }

    /// Pushes the counts to the device's handles.
    pub(crate) fn flush(&self, m: &DeviceMetrics) {
        let (e, h) = (self.event_edges.take(), self.handoffs.take());
        if e > 0 {
            m.event_edges.increment(e);
        }
        if h > 0 {
            m.stream_handoffs.increment(h);
        }
    }
}
