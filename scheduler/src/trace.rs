//! Optional timeline recording: one track per worker with a slice per node and per park, plus
//! extra tracks (GPU streams) added through `Pool::record_span`.
//!
//! Off by default; when off, a worker pays one predictable branch per node. When on, each slice
//! is appended under a lock as soon as it ends, so a trace taken after `wait` returns holds every
//! node of that graph.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use crate::pool::WorkerInfo;
use crate::sync::{self, Mutex};

/// What a slice stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceKind {
    /// A node body ran; `stolen` when the worker took it from another worker's deque.
    Node {
        /// Taken from another worker's deque.
        stolen: bool,
    },
    /// The worker was parked for lack of work.
    Park,
    /// A span recorded with [`Pool::record_span`](crate::Pool::record_span) (e.g. GPU time).
    Span,
}

/// A row of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceTrack {
    /// Display name, e.g. `worker 0 (core 3, host)`.
    pub name: String,
    /// The worker, for worker tracks.
    pub worker: Option<usize>,
    /// The worker's core, if pinned.
    pub core: Option<usize>,
    /// The worker's group (empty for extra tracks).
    pub group: String,
}

/// One interval on a track.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSlice {
    /// Index into [`Trace::tracks`].
    pub track: usize,
    /// Node name (or park / span name).
    pub name: String,
    /// Graph name (empty for parks).
    pub graph: String,
    /// The node's index in its graph, for node slices and spans that stand for a node.
    pub node: Option<u32>,
    /// Start, in nanoseconds since [`Trace::epoch`].
    pub start_ns: u64,
    /// End, in nanoseconds since [`Trace::epoch`].
    pub end_ns: u64,
    /// What it is.
    pub kind: SliceKind,
}

/// A recorded timeline, from [`Pool::take_trace`](crate::Pool::take_trace).
#[derive(Clone, Debug)]
pub struct Trace {
    /// The instant all times are measured from (the pool's build).
    pub epoch: Instant,
    /// Worker tracks in worker order, then extra tracks.
    pub tracks: Vec<TraceTrack>,
    /// Slices, in the order they were recorded.
    pub slices: Vec<TraceSlice>,
}

struct Raw {
    track: usize,
    name: Cow<'static, str>,
    graph: Option<Arc<str>>,
    node: Option<u32>,
    start: Instant,
    end: Instant,
    kind: SliceKind,
}

/// The recording state; shared (cheap clones) so that a [`SpanRecorder`] can outlive a borrow
/// of the pool.
#[derive(Clone)]
pub(crate) struct TraceSink(Arc<SinkInner>);

pub(crate) struct SinkInner {
    epoch: Instant,
    workers: usize,
    raw: Mutex<Vec<Raw>>,
    extra: Mutex<Vec<String>>,
}

impl std::ops::Deref for TraceSink {
    type Target = SinkInner;
    fn deref(&self) -> &SinkInner {
        &self.0
    }
}

/// A handle that adds slices to extra tracks of a pool's trace from any thread, for example a
/// GPU stream's per-node device time (from [`Pool::span_recorder`](crate::Pool::span_recorder);
/// only exists while the pool records a trace). Keeps the recorded slices alive, not the pool.
#[derive(Clone)]
pub struct SpanRecorder(TraceSink);

impl std::fmt::Debug for SpanRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanRecorder").finish_non_exhaustive()
    }
}

impl SpanRecorder {
    pub(crate) fn new(sink: TraceSink) -> Self {
        SpanRecorder(sink)
    }

    /// The instant the trace's times are measured from.
    pub fn epoch(&self) -> Instant {
        self.0.epoch
    }

    /// Creates the extra track `track` now, if it does not exist yet (extra tracks come in the
    /// order they were created: create them up front to fix their order).
    pub fn add_track(&self, track: &str) {
        self.0.extra_track(track);
    }

    /// Adds a slice named `name` to the extra track `track` (created on first use).
    pub fn span(&self, track: &str, name: &str, start: Instant, end: Instant) {
        self.0.span(track, name, None, start, end);
    }

    /// Adds a slice standing for node `node` (its index in its graph) of graph `graph` to the
    /// extra track `track`: the slice carries the graph's name and the node's index, like a
    /// worker track's node slice, with [`SliceKind::Span`].
    pub fn node_span(
        &self,
        track: &str,
        name: &str,
        (graph, node): (&str, u32),
        start: Instant,
        end: Instant,
    ) {
        self.0
            .span(track, name, Some((Arc::from(graph), node)), start, end);
    }
}

impl TraceSink {
    pub(crate) fn new(workers: usize) -> Self {
        TraceSink(Arc::new(SinkInner {
            epoch: Instant::now(),
            workers,
            raw: Mutex::new(Vec::new()),
            extra: Mutex::new(Vec::new()),
        }))
    }

    pub(crate) fn node(
        &self,
        worker: usize,
        name: Cow<'static, str>,
        graph: &Arc<str>,
        node: u32,
        (start, end): (Instant, Instant),
        stolen: bool,
    ) {
        let r = Raw {
            track: worker,
            name,
            graph: Some(graph.clone()),
            node: Some(node),
            start,
            end,
            kind: SliceKind::Node { stolen },
        };
        sync::lock(&self.raw).push(r);
    }

    pub(crate) fn park(&self, worker: usize, start: Instant, end: Instant) {
        let r = Raw {
            track: worker,
            name: Cow::Borrowed("park"),
            graph: None,
            node: None,
            start,
            end,
            kind: SliceKind::Park,
        };
        sync::lock(&self.raw).push(r);
    }

    /// The index of extra track `track` among the extra tracks, created if new.
    pub(crate) fn extra_track(&self, track: &str) -> usize {
        let mut extra = sync::lock(&self.extra);
        match extra.iter().position(|t| t == track) {
            Some(i) => i,
            None => {
                extra.push(track.to_string());
                extra.len() - 1
            }
        }
    }

    pub(crate) fn span(
        &self,
        track: &str,
        name: &str,
        node: Option<(Arc<str>, u32)>,
        start: Instant,
        end: Instant,
    ) {
        let idx = self.extra_track(track);
        let (graph, node) = match node {
            Some((g, n)) => (Some(g), Some(n)),
            None => (None, None),
        };
        let r = Raw {
            track: self.workers + idx,
            name: Cow::Owned(name.to_string()),
            graph,
            node,
            start,
            end,
            kind: SliceKind::Span,
        };
        sync::lock(&self.raw).push(r);
    }

    pub(crate) fn take(&self, infos: &[WorkerInfo]) -> Trace {
        let ns = |t: Instant| t.saturating_duration_since(self.epoch).as_nanos() as u64;
        let mut tracks: Vec<TraceTrack> = infos
            .iter()
            .map(|i| TraceTrack {
                name: match i.core {
                    Some(c) => format!("worker {} (core {c}, {})", i.index, i.group_name),
                    None => format!("worker {} (unpinned, {})", i.index, i.group_name),
                },
                worker: Some(i.index),
                core: i.core,
                group: i.group_name.clone(),
            })
            .collect();
        tracks.extend(sync::lock(&self.extra).iter().map(|t| TraceTrack {
            name: t.clone(),
            worker: None,
            core: None,
            group: String::new(),
        }));
        let raw = std::mem::take(&mut *sync::lock(&self.raw));
        let slices = raw
            .into_iter()
            .map(|r| TraceSlice {
                track: r.track,
                name: r.name.into_owned(),
                graph: r.graph.map(|g| g.to_string()).unwrap_or_default(),
                node: r.node,
                start_ns: ns(r.start),
                end_ns: ns(r.end),
                kind: r.kind,
            })
            .collect();
        Trace {
            epoch: self.epoch,
            tracks,
            slices,
        }
    }
}
