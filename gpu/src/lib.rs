//! # boundpool-gpu
//!
//! The CUDA backend of boundpool, on [cudarc]'s driver bindings: a [`GpuPool`] of pinned
//! workers, several per device, each holding its device's primary context bound for life and
//! its own streams (one per priority level); GPU nodes ([`GpuGraphExt::gpu_node`]) that enqueue
//! kernels, copies and allocations on their worker's stream of their level; GPU-side edges
//! between them; and resource tables so that no driver call is ever made from an unbound
//! thread.
//!
//! * **Binding.** A device worker's start hook retains the device's primary context (once per
//!   device), binds it, checks it with `cuCtxGetCurrent` and creates the worker's stream. A
//!   machine without a driver or a missing device is an error from [`GpuPoolBuilder::build`],
//!   never a panic.
//! * **Priorities.** A node of level [`Priority::High`] enqueues on its worker's stream of the
//!   device's greatest CUDA stream priority, [`Priority::Low`] on one of its least (both made at
//!   the worker's first node of the level), [`Priority::Normal`] on the stream made at start
//!   (its group's priority, [`GpuPoolBuilder::stream_priority`]).
//! * **Edges.** A GPU node publishes the stream its work went to. A GPU successor on the same
//!   stream needs nothing; one placed on another group (another worker, or another device), or
//!   of another priority level, waits (`cuStreamWaitEvent`) on an event the predecessor
//!   recorded right after its work;
//!   one of the same group that was stolen by another worker records an event on the
//!   predecessor's stream itself and waits on it. No host synchronise between GPU nodes.
//! * **Completion.** A GPU node with a host successor, or none (a sink), completes only when
//!   the device has done its work: its worker enqueues one write of a mapped host word per
//!   burst of nodes (`cuStreamWriteValue32`, after the work) and reads the word between other
//!   nodes (a load, no driver call; the stream is queried every 50 µs for a failed device),
//!   never from a driver callback thread.
//! * **Drops anywhere.** [`DeviceBuffer`] and the event table's events may be dropped on any
//!   thread: the drop queues the handle for a bound worker of its device (woken for it), which
//!   frees it after the work already enqueued on the device. Shutdown frees what was queued,
//!   unloads modules, trims the memory pool and drops the device's context; a buffer still held
//!   keeps its memory, stream and context alive until its owner drops it (then freed on that
//!   thread, as cudarc does: no bound worker is left).
//! * **Errors.** A failed launch or copy fails the graph naming the node and the driver error;
//!   a sticky error (illegal address) marks the device failed and later submissions to it say
//!   why, whether boundpool's own call or a cudarc call in the node's body hit it (a body's
//!   error that is, or wraps, a sticky `DriverError`); out of memory fails the node only.
//! * **Libraries.** [`GpuCtx::cublas`] and [`GpuCtx::solver`] lend a node its worker's cuBLAS
//!   and cuSOLVER handles as cudarc's `CudaBlas` and `DnHandle`, set to the node's stream, with
//!   the worker's workspaces ([`GpuCtx::cublaslt`] its cuBLASLt handle, with a workspace for the
//!   node's stream): one library surface, cudarc's. Per-worker user state comes from
//!   [`GpuPoolBuilder::worker_state`]. (`boundpool-bench`'s `cholesky` builds a tiled Cholesky
//!   factorization, and its f64 routines, on them.)
//! * **Replay.** A graph made with a [`ReplayBuilder`] is a [`Replayable`]: its GPU nodes'
//!   work is captured at the first run into CUDA graphs (one per *segment*: the captured nodes
//!   between host nodes, per device) on a bound worker, in thread-local capture mode, and
//!   replayed by later runs without calling the GPU bodies; host nodes run every time, in DAG
//!   order. Each run brings its own inputs ([`RunInputs`]) and is submitted without blocking
//!   ([`Replayable::submit`] gives a [`ReplayHandle`] to wait or await), on one of the graph's
//!   instances; [`PinnedBuffer`]s carry a served request in and out inside the CUDA graph.
//!   [`Replayable::update`] re-captures and updates the executables in place
//!   (`cuGraphExecUpdate`). A node writes a predecessor's buffer in place by taking it
//!   ([`ReplayCtx::take`], [`ReplayBuilder::hand_on`]) when it is that buffer's only reader:
//!   captured, the taker's output is the buffer the instance keeps and every replay writes. Operations a graph cannot hold (a download, a free, and, read from
//!   the captured graph, an allocation it would keep or a copy from or to pageable host
//!   memory) fail the capture naming the graph, the node and why
//!   ([`GpuErrorKind::Capture`], the device counter `boundpool_gpu_capture_failures_total`);
//!   the graph's later runs go eager until [`Replayable::update`] asks for a new capture.
//!   [`Replayable::probe_launches`], a diagnostic, times each replayed launch while on
//!   ([`LaunchRecord`]: the host time in `cuGraphLaunch`, the device's from timing events
//!   around it, when the worker saw it done).
//!   A capture holds its device's capture gate (one per device and process, every pool's)
//!   alone from its begin to its end, and calls that synchronise the device (a worker's start
//!   and stop, host frees, [`GpuCtx::outside_captures`]) hold it shared: the driver invalidates
//!   every capture of a context such a call meets, from whichever thread (see
//!   [`Replayable`], "Captures beside other threads"). Replayed launches take no lock.
//! * **SM partitions.** [`GpuPoolBuilder::sm_partitions`] splits each device's SMs into
//!   disjoint partitions ([`SmPartition`]), each a worker group whose streams are made in the
//!   partition's green context, so its work runs on its SMs only: a latency-critical graph
//!   placed there ([`GpuDevice::on_partition`]) never waits for SMs behind bulk work. Sizes are
//!   exact (a count the device cannot give fails the build, [`GpuErrorKind::Partition`]);
//!   [`GpuDevice::partitions`] reports what the driver gave. Workers keep the primary context
//!   bound; only their streams are the partition's (`driver/green.rs` says why).
//! * **Peer reads.** A node reading a buffer of another device ([`GpuCtx::on_device`]) reads it
//!   in place where the pair supports peer access (the owner's memory pool grants it at the
//!   first read), else gets a copy made on its stream (`cuMemcpyPeerAsync`,
//!   [`GpuCtx::copy_peer`]) after its event waits; either way the buffer's release waits for
//!   the reader, through an event of the reader's device that the owner's draining worker
//!   waits on (a copy's right after it, an in-place read's after the body; a buffer dropped
//!   while a body still reads it in place is freed at a later drain).
//! * **Host signals.** [`HostSignal`]: a mapped host word a node's stream writes after its
//!   earlier work ([`GpuCtx::signal`]), read by any thread with a load, no driver call: how a
//!   thread that must not call the driver (the ranks' communication thread) learns that a
//!   chunk's copy to page-locked memory is done ([`GpuCtx::copy_to_pinned_at`]).
//! * **NCCL** (feature `nccl`). A communicator per device, made by a node on a bound worker
//!   from an id another rank sent (`NcclId`, `GpuCtx::nccl_init`, then
//!   `GpuCtx::nccl_connect`); its operations (`GpuCtx::nccl_all_reduce`, broadcast,
//!   reduce-scatter, all-gather, send, receive) run on a stream of the communicator's own,
//!   after an event wait for the node's stream, and the node's successors follow that stream:
//!   an NCCL kernel waiting for its peers holds back only later NCCL operations, never the
//!   worker's other nodes. A missing libnccl is an error naming the files tried
//!   (`nccl_library_check`, `GpuPoolBuilder::nccl` at build). cudarc's `Comm` is not
//!   used: it fixes its stream when made, is not `Send` (a device's workers share one
//!   communicator, under a lock) and aborts itself on the dropping thread.
//! * **Checking.** [`context_check`] counts driver calls made with the wrong or no context,
//!   and, on a partitioned device, work enqueued on a stream of another partition.
//! * **Metrics.** Per device, through the `metrics` facade ([`GPU_METRICS`] lists them): live
//!   buffers and bytes, releases queued and done, event edges and stream hand-offs, captures,
//!   replays, executable updates and instantiations, sticky failures. The `nvtx` feature puts
//!   each GPU node's body in an NVTX range named after it, on its worker's thread.
//!
//! # cudarc inside a node
//!
//! boundpool links one cudarc, re-exported as [`cudarc`] (and its `half` as [`half`]), with
//! the features `driver`, `nvrtc`, `cublas`, `cublaslt`, `curand`, `cusolver`, `f16`,
//! `cuda-13000` and `fallback-dynamic-loading`. A program that also depends on cudarc directly,
//! or through candle or burn, gets one cudarc only if it asks for the same minor version (0.19)
//! and the same CUDA version feature (cargo unifies the features of one cudarc, and cudarc
//! expects one `cuda-*` feature): name `boundpool::gpu::cudarc` instead of a dependency of your
//! own where you can.
//!
//! A node's body gets the stream it enqueues on as `&Arc<CudaStream>` ([`GpuCtx::stream`]: its
//! worker's stream of its level, one handed over, or the capturing stream under a replay
//! capture) and the device's context as `&Arc<CudaContext>` ([`GpuCtx::context`]); cudarc code
//! given them (`launch_builder`, `alloc_zeros`, copies, `CudaBlas`, cuRAND) runs on a bound
//! worker of the node's device, ordered by the node's edges. Under a replay capture each
//! cudarc call either works (a scratch slice allocated and dropped in the body becomes graph
//! memory nodes) or fails the capture naming the graph, the node and the call (a slice kept
//! past the body, a copy from or to pageable memory, `load_module`, a `CudaBlas`,
//! `CudaBlasLT` or `CudaRng` made in the body): the table in `gpu/README.md` says which. The pool's context has cudarc's
//! per-buffer event tracking off: boundpool orders streams, so one node's work stays on its
//! stream. [`GpuCtx::cublas`] is the worker's cuBLAS handle as cudarc's `CudaBlas`, set to the
//! node's stream with the worker's workspace for it (typed GEMMs in f16, bf16, f32, f64,
//! strided-batched), also under a replay capture (a workspace of the capture's own, made
//! outside the graph and kept with it). [`WorkerSetup::context`] lets a worker load cudarc
//! modules once, into its state. A [`DeviceBuffer<T>`] is a `CudaSlice<T>` whose drop is routed
//! to a bound worker; cudarc takes it where it takes a slice (it is a `DevicePtr`, a
//! `DevicePtrMut` and a `launch_builder` argument; it dereferences to its `CudaSlice` for
//! reading), but never hands out `&mut CudaSlice`, so safe code cannot replace or free its
//! memory behind it (writers get a `CudaViewMut`); [`GpuCtx::adopt`] and
//! [`DeviceBuffer::into_cuda_slice`] move memory between the two without a copy. A plain
//! `CudaSlice` keeps cudarc's rule (freed on the dropping thread): adopt one that leaves its
//! node. A cudarc handle kept past the pool's shutdown (a stream, the context, a slice) keeps
//! what it needs alive through cudarc's reference counts; work enqueued on it then is the
//! caller's to order. [`GpuCtx::cublaslt`] is the worker's cuBLASLt handle with a workspace for
//! the node's stream: [`CublasLt::matmul`] takes cudarc's `MatmulConfig` and `Activation` and
//! does what cudarc's `Matmul::matmul` does (f32, f16, bf16 as [`LtElement`]s; bias, ReLU and
//! GELU epilogues; strided batches) on the node's stream, also under a replay capture (a
//! workspace per call, made outside the graph and kept with it). Its algorithm is the device's
//! for the problem: the heuristic's first (asked once per problem, then kept), or the fastest of
//! the heuristic's offers that [`CublasLt::tune`] timed, eagerly, before a replay captures it
//! (what that gains the served model: docs/benchmarks.md). cudarc's own `CudaBlasLT`
//! still works eagerly inside a node (one per stream, made there), not under a capture. A
//! cudarc call in a body that synchronises the device or its context (a `CudaBlas`,
//! `CudaBlasLT` or `CudaRng` made or dropped, a `CudaRng`'s first draw, `load_module` and a
//! module's unload, `CudaContext::synchronize`) goes inside [`GpuCtx::outside_captures`], or into
//! [`GpuPoolBuilder::worker_state`] (made at a worker's start, dropped at its stop, both
//! outside captures): made bare, it invalidates any capture another thread is making on the
//! device, and may fail itself. candle
//! cannot take an external stream yet (its CUDA device is built by a private constructor), so
//! candle code does not run on the pool's streams.
//!
//! # What stays hand-written, and why
//!
//! cudarc does the device's context and streams (with priorities), buffers (`CudaSlice`),
//! modules and functions (`CudaModule`, `CudaFunction`), kernel launches (its
//! `result::launch_kernel`: the `launch_builder` would add a `Vec` and a context bind to each
//! launch, on a thread bound for life), the event calls (`result::event`) and the cuBLAS and
//! cuSOLVER handles (`CudaBlas`, `DnHandle`). What remains is boundpool's own:
//!
//! * **Events** (`driver::Event`, over cudarc's `result::event` calls). A GPU edge's event
//!   travels in a marker that may be dropped on any thread; the drop hands the event back to
//!   the worker that recorded it, and only a bound worker destroys one, by consuming it.
//!   cudarc's `CudaEvent` destroys itself in its `Drop`, on the dropping thread (a driver call
//!   off a bound worker), binds the context again at each `record` and `CudaStream::wait`
//!   (one more driver call on every edge: the chain edge would grow), and takes a
//!   `&CudaStream` where the node path names a handed-over stream by its view. The trace's
//!   timing events share the owner, the recycling and the teardown.
//! * **`Module`, `Kernel` and the launch's argument slots.** A [`Module`] stays a plain value
//!   (PTX, or NVRTC's output), not a loaded `CudaModule`, so that one value serves every
//!   device: each loads it at its first launch, on a bound worker, and unloads it at teardown
//!   on its last one. [`Launch::arg`] keeps each argument by value in an 8-byte slot
//!   ([`KernelArg`]) and the launch points one pointer at each: cudarc's `PushKernelArg`
//!   borrows every argument for the builder's lifetime, which a by-value builder cannot give,
//!   and the public API stays as it was.
//! * **Owners destroyed by consuming them** (events, allocations, CUDA graphs and executables,
//!   the primary context's retain for `MemoryProbe`): destroying one twice does not compile,
//!   and their owners decide on which bound worker that happens.
//! * **The release queue**: a [`DeviceBuffer`] or a replay executable dropped anywhere is
//!   freed by a bound worker of its device, ordered after the work already enqueued; cudarc
//!   frees on the dropping thread.
//! * **The cuBLASLt matmul** ([`CublasLt::matmul`], `blaslt.rs`), on cudarc's
//!   `cublaslt::result` calls with a guard per descriptor. cudarc's `CudaBlasLT` fixes its
//!   stream when made (the matmul always goes there), and allocates its workspace then, on that
//!   stream, as a `CudaSlice` inside a private field: it cannot be freed through the release
//!   queue (by a bound worker, after a fence) nor hoisted out of a capture and kept with the
//!   segment (a `CudaBlasLT` made per node would allocate and free 32 MiB on Hopper each time).
//!   A cuBLASLt handle itself has no stream: boundpool keeps one per worker (`libs.rs`) and
//!   passes the node's stream and a workspace of its choosing to each matmul.
//! * **CUDA graph templates** ([`CudaGraphTemplate`], [`CudaGraphNode`], [`CaptureExt`], over
//!   `driver/graph.rs`). cudarc's `CudaStream::end_capture` instantiates at once and has no call
//!   that reads or edits a template; the replay's capture needs them (each node's dependencies
//!   set on the one capturing stream, the stand-in root removed, the captured graph read
//!   before instantiation), and so do the raw CUDA-graph baselines of `boundpool-workloads`:
//!   one set of calls, public for code on cudarc (the replay's go through the context check).
//! * **The context check** ([`context_check`]): each driver call of boundpool's own code
//!   (through `driver.rs`, the module loads, lookups and launches it hands to cudarc included)
//!   is first checked against the context it expects, so the tests can prove that none is
//!   made off a bound worker of the right device.
//!
//! # Where the driver and the unsafe code are
//!
//! The one list (the README points here). Every block has a `// SAFETY:` comment and every
//! unsafe fn or trait a `# Safety` section.
//!
//! * `driver.rs` (with `driver/green.rs` and `driver/graph.rs`): the only files that call the
//!   CUDA driver's API itself (`cudarc::driver::sys` and `result`, and cudarc's module load and
//!   function lookup, each behind the context check, but for the calls made for
//!   [`CudaGraphTemplate`] and [`CaptureExt`], which are their caller's; elsewhere the driver
//!   is reached only through cudarc's safe types: the context, streams, slices and library
//!   handles) and the only ones with raw driver handles. Its wrappers check (when on) that
//!   the expected context is current. A handle that must be destroyed comes out of it as an
//!   *owner* (`PrimaryCtx`, `Event`, `DeviceAlloc`, `HostAlloc`, `CudaGraph`, `GraphExec`): not
//!   `Copy` nor `Clone`, its raw field private, destroyed by a method that consumes it
//!   (`destroy(self)`, `release(self)`, `free(self)`; a `CudaGraph` left undestroyed, by its
//!   drop), so destroying one twice does not compile (its unit test
//!   `owners_are_not_copy_or_clone` asserts it at compile time). Whoever needs to name a
//!   handle it does not own gets a `Copy` *view* made from the owner (`Ctx`, `StreamRef`,
//!   `CudaGraphNode`), which destroys nothing. The owners live where their lifetime is
//!   decided: a device's table (`device.rs`) owns its spare events, destroyed by the
//!   device's last worker, after every node that could hold a view, and holds the device's
//!   context, workers' streams and modules (cudarc's `Arc`s, dropped there: the last `Arc` of
//!   a module, once every worker has dropped its `CudaFunction`s, unloads it on that bound
//!   worker); events move by value between a worker's spares, markers and that table; capture
//!   streams (cudarc's) and graphs are owned by the replay's capture (`replay/capture.rs`),
//!   executables by their replay slot, public templates by their [`CudaGraphTemplate`].
//!   `StreamRef::raw_ptr` and `CudaGraph::raw` are the only ways a raw handle leaves the module
//!   (to cuBLAS / cuSOLVER / cuBLASLt and [`GpuCtx::raw_stream`]; to
//!   [`CudaGraphTemplate::cu_graph`], for cudarc's `result::graph`). Its unsafe fns are the
//!   launch (cudarc's `result::launch_kernel` given one pointer per kernel parameter), the
//!   copies (also between devices, `memcpy_peer_async`) and the memset, which take raw
//!   pointers; it also asks whether a pair of devices can reach each other and grants a device
//!   access to another's memory pool.
//! * `driver/graph.rs` (a part of `driver.rs`): the CUDA-graph calls (templates made, cloned,
//!   read, edited, described and destroyed; a capture's begin, end, dependencies and root;
//!   instantiate, update, launch, destroy of executables; the capture-mode exchange), node
//!   types read as `u32`s and parameter blocks read into zeroed memory, the `Send` of
//!   `CudaGraph` and `GraphExec` (neither `Sync`: the driver serialises no call on one graph)
//!   and `CudaGraphNode`'s `Send` and `Sync`.
//! * `cuda_graph.rs`: no unsafe block; the unsafe fns of [`CudaGraphTemplate`] and
//!   [`CaptureExt`] that take nodes (a node is a plain handle, valid while its graph holds it)
//!   or a kernel's parameters.
//! * `driver/green.rs` (a part of `driver.rs`): the green-context calls of SM partitions (the
//!   device's SM resource and its split, descriptors, green contexts and their streams, owned
//!   as `GreenCtx` and `GreenStream` and destroyed by consuming them, handed to node bodies as
//!   cudarc streams that borrow them, `wrap_borrowed_stream`), and the partition check
//!   (`cuStreamGetGreenCtx`).
//! * `libs.rs`, `blas.rs` and `blaslt.rs`: the only files with cuBLAS, cuBLASLt and cuSOLVER
//!   handles and calls (`cudarc::cublas`, `cudarc::cublaslt`, `cudarc::cusolver`; library
//!   handles, not driver handles, kept there by design: cudarc's `CudaBlas` and `DnHandle` and
//!   a raw `cublasLtHandle_t`, made and dropped on their worker). `libs.rs`, each worker's
//!   handles and workspaces: setting the cuSOLVER handle's stream (`DnHandle::set_stream`,
//!   unsafe in cudarc), handing a cuSOLVER workspace's allocation to a `CudaSlice`
//!   (`upgrade_device_ptr`), destroying the cuBLASLt handle (and its `Send`: it never leaves its
//!   worker) and the library-presence checks; `blas.rs`, what nodes call: setting the cuBLAS
//!   handle's stream (`CudaBlas::set_stream`, unsafe in cudarc) and workspace;
//!   `blaslt.rs`, the cuBLASLt matmul and its tuning
//!   (unsafe fns): setting descriptor attributes from typed values, the heuristic query (into
//!   zeroed result structs), `cublasLtMatmul`, and the descriptors' destroys.
//! * `node/launch.rs`: [`Launch::launch`] (an unsafe fn: the kernel's signature is the
//!   caller's contract; it points one pointer at each argument's 8-byte slot for the launch in
//!   `driver.rs`). `node/mod.rs`: the host copies and memset it passes to `driver.rs`, a captured host-to-device
//!   copy's staging (a copy into a hoisted device buffer, then a captured device-to-device
//!   copy), and handing a new allocation to a `CudaSlice` (`upgrade_device_ptr`).
//! * `device.rs`: turning cudarc's event tracking off on the pool's context
//!   (`disable_event_tracking`), and freeing a dropped buffer's allocation, taken out of its
//!   `CudaSlice` (`DeviceAlloc::adopt`).
//! * `pinned.rs`: [`PinnedBuffer`]'s host access (`write`, `to_vec`: unsafe fns, the graph's
//!   order is the caller's contract) and the copies between it and device buffers (whole, or
//!   element ranges: `copy_to_pinned_at`, `copy_from_pinned_at`) it passes to `driver.rs`.
//! * `signal.rs`: [`HostSignal`]'s atomic load of its mapped word, its first write, and the
//!   `cuStreamWriteValue32` it passes to `driver.rs`.
//! * `peer.rs`: the copy between devices ([`GpuCtx::copy_peer`]) it passes to `driver.rs`.
//! * `nccl/comm.rs`, `nccl/ops.rs` (feature `nccl`): the NCCL library check, the
//!   communicator's init and abort (`DeviceComm`, an owner: not `Copy`, aborted by consuming
//!   it; its `Send`), and the operations' calls (cudarc's `nccl::result`, on device addresses
//!   of checked buffers).
//! * `worker.rs`: the lanes' completion words (mapped host words the device writes and the
//!   worker reads with atomic loads; the write enqueued through `driver.rs`).
//! * `buffer.rs`: [`DeviceBuffer`] as an argument of cudarc's `launch_builder` (`unsafe impl
//!   PushKernelArg`, calling cudarc's own impl for the buffer's slice).
//! * `module.rs`: asking cudarc whether libnvrtc is present (`is_culib_present`); `nvtx.rs`
//!   (feature `nvtx`), whether libnvToolsExt is.
//!
//! No other file has `unsafe`.
//!
//! [cudarc]: https://docs.rs/cudarc

mod blas;
mod blaslt;
mod buffer;
mod capture;
mod cuda_graph;
mod detect;
mod device;
mod diag;
mod driver;
mod error;
mod gate;
mod libs;
mod lt_algos;
mod metrics;
mod module;
#[cfg(feature = "nccl")]
mod nccl;
mod node;
#[cfg(feature = "nvtx")]
mod nvtx;
mod partition;
mod peer;
mod pinned;
mod pool;
mod replay;
mod signal;
mod state;
mod timing;
mod worker;

pub use blas::{CublasRef, SolverRef};
pub use blaslt::{CublasLt, LtElement, LtTuning, TUNE_CANDIDATES};
pub use buffer::{DeviceBuffer, DeviceCopy};
pub use cuda_graph::{CaptureExt, CudaGraphTemplate};
pub use detect::{device_count, device_info, driver_version, gpu_unavailable_reason};
pub use device::{DeviceInfo, GpuDevice, NcclInfo};
pub use diag::{context_check, MemoryProbe};
pub use driver::CudaGraphNode;
pub use error::{GpuError, GpuErrorKind, GpuResult};
pub use libs::LT_WORKSPACE_BYTES;
pub use metrics::GPU_METRICS;
pub use module::{builtin, Kernel, Module};
#[cfg(feature = "nccl")]
pub use nccl::{nccl_library_check, NcclElement, NcclId, ReduceOp};
pub use node::{
    run_gpu_body, GpuCtx, GpuGraphExt, KernelArg, Launch, LaunchConfig, StreamPriorityRange,
    MAX_KERNEL_ARGS,
};
pub use partition::{PartitionInfo, SmPartition};
pub use peer::OnDevice;
pub use pinned::PinnedBuffer;
pub use pool::{call_on, download_on, Devices, GpuGraph, GpuGraphBuilder, GpuPool, GpuPoolBuilder};
pub use replay::{
    LaunchRecord, RNode, ReplayBuilder, ReplayCtx, ReplayHandle, ReplayOutput, ReplayStats,
    Replayable, RunInputs,
};
pub use signal::HostSignal;
pub use state::WorkerSetup;
pub use worker::GpuWorker;

/// The cudarc that boundpool links, so that code written against cudarc names the same
/// version (see the crate docs: "cudarc inside a node").
pub use cudarc;
/// The `half` crate of cudarc's `f16` / `bf16` types.
pub use half;

/// Re-exports of the scheduler types GPU graphs use.
pub use boundpool_scheduler::{
    BoxError, Cores, DomainId, GraphHandle, GroupId, NodeRef, Placement, Priority, ShutdownMode,
};
