//! Replay: a reused graph's GPU work captured once into CUDA graphs and replayed.
//!
//! A [`ReplayBuilder`] describes a graph of three kinds of node: *captured* GPU nodes
//! ([`ReplayBuilder::gpu_node`]), *eager* GPU nodes ([`ReplayBuilder::eager_gpu_node`], run
//! every time like host nodes, for per-run uploads and downloads) and host nodes
//! ([`ReplayBuilder::host_node`]). [`ReplayBuilder::build`] makes a [`Replayable`]:
//!
//! * **Segments.** Captured nodes are split into segments by *cut level* (the most host nodes,
//!   eager nodes and device changes on a path from a source to the node) and device: a path
//!   between two nodes of a segment keeps the level, so it has no host node, eager node or other
//!   device on it, and every edge between segments raises the level, so segments and the other
//!   nodes form a DAG. Independent nodes of a level share a segment. Each segment becomes
//!   one CUDA graph per instance, launched by one GPU node of the scheduler graph; host and
//!   eager nodes stay scheduler nodes, so they run every time, in DAG order, between the
//!   segments, and a host node after a segment waits for it the way host successors of GPU
//!   nodes always do (its worker polls an event; no spin, no driver callback). Edges between
//!   segments, also across devices, are the ordinary GPU edges (stream hand-off or events).
//! * **Capture** (the first run of an instance, and the first after [`Replayable::update`]):
//!   the segment's node runs on a bound worker; it makes a capture stream, begins a capture in
//!   thread-local mode (other workers go on running eager graphs), and calls the members'
//!   bodies in a topological order, each with its own dependencies set on the capture
//!   (`cuStreamUpdateCaptureDependencies`: the union of its segment predecessors' last captured
//!   nodes), so the CUDA graph keeps the DAG's parallelism though one thread captured it.
//!   Allocations are hoisted out of the capture (made on the worker's own stream, relaxed mode:
//!   they live as long as the node outputs holding them); host-to-device copies are staged
//!   into a device buffer the segment keeps and captured as device-to-device copies; a
//!   download, a dropped buffer (a free) or anything that invalidates the capture fails it with
//!   [`GpuErrorKind::Capture`](crate::error::GpuErrorKind::Capture) naming the node and the
//!   reason. Then the graph is instantiated (or, after an update, the executable updated in
//!   place with `cuGraphExecUpdate`, re-instantiated only when the driver refuses) and launched.
//! * **Replay**: the segment's node launches the executable on its stream. GPU bodies are not
//!   called; GPU nodes' outputs are the values their bodies returned at the capture (the same
//!   buffers every run, new contents).
//! * **In-place writes** (`take.rs`): a node takes a predecessor's output by value
//!   ([`ReplayCtx::take`], the edge declared with [`ReplayBuilder::hand_on`] so that `build`
//!   checks it) when it is that output's only successor and both run at the same rate: two
//!   captured nodes of one segment (at the capture: the taker writes into the buffer and
//!   returns it, the instance keeps it as the taker's output, and every replay writes it in
//!   place), or two host or eager nodes (every run). Other pairs are refused naming both
//!   nodes.
//! * **Runs and instances.** A run brings a value for each *input node*
//!   ([`ReplayBuilder::input`], [`RunInputs`]) and gets its own outputs ([`ReplayOutput`]),
//!   so runs never share a feed. CUDA runs one launch of an executable at a time, and captured
//!   outputs are shared, so a run holds one *instance* (a scheduler graph of its own with its
//!   executables, captured outputs and input slots) from the start of its graph to its end, and
//!   gives it back from a done hook (`GraphHandle::on_done`) before its waiter wakes.
//!   [`ReplayBuilder::instances`] (default 1) replayed instances at most are made, each
//!   captured at its first run; a run that finds them all busy waits for one, first come first
//!   served ([`Replayable::submit`] returns at once with a [`ReplayHandle`] to wait or await;
//!   dropping it while it waits withdraws the run). Eager runs make eager instances as needed.
//!   A run's priority level is its graph's ([`ReplayBuilder::priority`]).
//! * **Lifetimes.** Executables are owned by `ExecSlot`s (`device.rs`); dropping the last owner anywhere
//!   queues the executable on its device's release queue, destroyed by a bound worker; the
//!   device's teardown destroys what is left. Capture templates are destroyed on the capturing
//!   worker right after instantiation.

mod builder;
mod capture;
mod check;
mod desc;
mod graph;
mod instance;
mod plan;
mod probe;
mod replayable;
mod run;
mod take;

pub use builder::ReplayBuilder;
pub use desc::{RNode, ReplayCtx};
pub use instance::ReplayStats;
pub use probe::LaunchRecord;
pub use replayable::Replayable;
pub use run::{ReplayHandle, ReplayOutput, RunInputs};
