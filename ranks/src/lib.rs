//! # boundpool-ranks
//!
//! One boundpool graph over many processes (ranks), StarPU-MPI's model on boundpool's terms:
//! every rank builds the same graph; a node runs on the rank it names, or on the rank that
//! owns the datum it writes (owner computes); `build` lowers each edge that crosses ranks into
//! a send node on the producer's rank and a receive node on the consumer's, a value going to
//! each consuming rank once per run; one communication thread per rank owns the transport
//! (MPI, or an in-process network) and never blocks; no worker waits on the network.
//!
//! ```
//! use boundpool_ranks::{LocalNetwork, RankGraphBuilder, RanksBuilder};
//!
//! // Two ranks as threads of this process (under mpirun: `RanksBuilder::build_mpi`).
//! let net = LocalNetwork::new(2);
//! let ranks: Vec<_> = (0..2)
//!     .map(|r| RanksBuilder::new().workers(1).build_local(&net, r))
//!     .collect::<Result<_, _>>()?;
//! let outs = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks
//!         .iter()
//!         .map(|ranks| {
//!             s.spawn(move || {
//!                 // Every rank builds the same graph.
//!                 let mut g = RankGraphBuilder::new("hello");
//!                 let a = g.plain_node(0, "a", |_| Ok(vec![1u64, 2, 3]));
//!                 let b = g.plain_node(1, "b", move |ctx| Ok(ctx.input(a)?.iter().sum::<u64>()));
//!                 g.edge(a, b);
//!                 let graph = g.build(ranks)?;
//!                 let out = ranks.run(&graph)?;
//!                 Ok::<_, boundpool_ranks::Error>(out.get(b).copied())
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
//! });
//! assert_eq!(outs[0].as_ref().unwrap(), &None); // b ran on rank 1
//! assert_eq!(outs[1].as_ref().unwrap(), &Some(6));
//! # Ok::<(), boundpool_ranks::Error>(())
//! ```
//!
//! # Layers, lowest first
//!
//! * **Placement and lowering** ([`plan`]): pure functions from a rank-annotated
//!   [`GraphDesc`] to every rank's [`LocalPlan`], and the structure [`Digest`] ranks compare.
//!   No MPI, threads or clock: the simulator calls exactly this code.
//! * **Values** ([`PlainValue`], serde): plain data crosses as its own bytes (sent from the
//!   value's memory, received into the memory of the value the consumer reads: no staging
//!   copy; a `Vec`'s memory is recycled for the same transfer's next value once its run's
//!   outputs are dropped, so that it lands in pages already mapped); anything else `serde`
//!   can encode crosses as postcard, a compact format with a
//!   stable, documented wire format and no schema. A node made with [`RankGraphBuilder::node`]
//!   cannot cross: an edge from it to another rank is an error at `build` naming the edge.
//!   Values of 4 MiB or more (settable) go as a header and chunks: no message passes MPI's
//!   `int` count, and none is long enough to be slow.
//! * **Transports** ([`Transport`]): [`LocalNetwork`] (ranks as threads, for tests and the
//!   simulator) and, with the `mpi` feature, `MpiTransport` (rsmpi; `MPI_Isend`,
//!   `MPI_Irecv`, `MPI_Improbe`, `MPI_Imrecv`, `MPI_Test`, `MPI_Testsome` only). A transport that allows
//!   calls from several threads gives a [`DirectSend`] for workers' small sends. A transport sends and receives raw
//!   bytes at an address, so a pinned host buffer (a GPU buffer's staging area) goes as it is.
//!   Values of at most 4 KiB less a 16-byte trailer travel on a **posted lane**
//!   ([`RanksBuilder::posted_receives`], on by default): MPI's second communicator with a ring
//!   of receives posted ahead, so a small value is in memory when first seen, as a blocking
//!   `MPI_Recv`'s is, without a probe and a matched receive of its own.
//! * **The communication thread** (internal): one per rank, counted in the rank's threads
//!   ([`Ranks`]: the pool's workers + 1). It owns the transport (only workers' small sends
//!   bypass it, where the transport allows: [`RanksBuilder::worker_sends`]), never blocks
//!   (with work in flight it spins where the rank's threads have cores of their own, yields,
//!   then parks for 100 µs at most), and completes receive nodes, and send nodes that wait
//!   for the transport, through their `Completer`s (`backend::NodeCtxExt::complete_later`): a
//!   worker takes each completion from the pool's queue, woken for it. A worker that ran dry
//!   and spins before parking looks at the network itself instead, under a lock it only tries
//!   ([`RanksBuilder::worker_polls`], where the transport allows calls from any thread): an
//!   arrival then completes its receive node on that worker, which runs the consumer next,
//!   with no hand-off and no wake-up; no worker waits on the network or on the lock. At
//!   most [`RanksBuilder::send_window`] sends are in flight; more wait, the critical path's
//!   first. Where the threads run and how they wait: [`Placement`]; where an edge's time
//!   goes: [`RanksBuilder::stamp_edges`].
//! * **One copy a host** ([`RanksBuilder::relay_per_host`], on by default;
//!   [`plan::relay`]): a host value read on several ranks of another host is sent there once,
//!   to the first consuming rank of that host, whose forwarding send node sends the bytes as
//!   they arrived (no decoding, no copy past 4 KiB) to the others of its host. Each rank's host
//!   comes from the transport at start-up (MPI: the processor names, gathered) or from
//!   [`RanksBuilder::hosts`]; ranks on one host lower flat. Device values are not relayed.
//! * **Faults**: a node that fails on one rank cancels the run on every rank, and every
//!   rank's [`RunHandle::wait`] returns that failure naming its rank and node; a rank that
//!   dies (killed: silent past the peer timeout; or panicking outside a node: it says so as it
//!   goes down) ends every other rank's runs with [`ErrorKind::PeerDied`] naming it; a graph
//!   that differs between ranks is an error naming the first node that differs, found at its
//!   first submission (digests compared by rank 0), never a hang.
//!
//! The protocol (tags, the order of messages, completion, the check, faults) is described in
//! the crate's README.
//!
//! # GPU work across ranks
//!
//! A [`GpuRanks`] ([`GpuRanksBuilder`]) runs a rank over a `boundpool-gpu` pool (its workers
//! bound to the rank's devices; [`GpuRanksBuilder::device_by_local_rank`] picks one by the
//! launcher's local rank). [`RankGraphBuilder::gpu_node`] adds a GPU node whose body gets a
//! [`RankGpuCtx`] (inputs from any rank, and the node's `GpuCtx`);
//! [`RankGraphBuilder::device_node`] one whose `DeviceBuffer` output crosses ranks:
//!
//! * **staged** through page-locked host memory (the device machine's MPI is not CUDA-aware): a
//!   GPU node on the producer's device copies it out in chunks, each copy followed by a write of
//!   a `HostSignal`; the communication thread sends each chunk once the signal passed it (a
//!   staged payload: it only reads host memory), so the device's copy of the next chunk
//!   overlaps the transfer; the value lands in page-locked memory, and a GPU node on the
//!   consumer's rank uploads it (to the device its program names for the producer there). The
//!   staging and landing memory comes from one pool per device value's node (its graph owns
//!   it), each buffer given back as soon as the transport or the upload's copy is done with it,
//!   so a graph's steady state allocates nothing; the first arrival of a size lands in ordinary
//!   memory and leaves a page-locked buffer of its size for the next.
//! * **over NCCL** (feature `nccl`, `GpuRanksBuilder::nccl`: a communicator per rank, made at
//!   build on a bound worker, its id sent from rank 0 over the transport): the length as a host
//!   message, then `ncclSend`/`ncclRecv` GPU nodes.
//!
//! NCCL collectives are GPU nodes too (`RankGraphBuilder::all_reduce`, `broadcast`,
//! `reduce_scatter`, `all_gather`: one member per rank, a `Collective`). NCCL has no tags: the
//! lowering puts every NCCL operation (collectives, NCCL transfers) in one order that agrees with
//! the graph ([`Lowering::nccl_order`]), and each rank chains its part with edges
//! ([`LocalPlan::nccl`]). No driver call is made off a bound worker.
//!
//! # The simulator
//!
//! The simulator lowers a [`GraphDesc`] with [`lower`], and can run the real communication
//! protocol over [`LocalNetwork`] or a virtual [`Transport`] of its own.
//!
//! # Where the unsafe code is
//!
//! * `value.rs`: a plain value's and a serde value's landing (`Vec::set_len` after its bytes
//!   arrived; `Pod` makes any bytes valid).
//! * `transport/mod.rs`, `transport/local.rs`: the transport's `send` and `receive` take raw
//!   pointers (unsafe trait methods); the in-process one copies through them.
//! * `transport/mpi.rs`: the MPI calls (rsmpi's `ffi`; the posted lane's receives into the
//!   transport's own memory), and the communicator and request handles that workers' sends use
//!   and hand over (`Send`, `Sync`).
//! * `comm/engine/mod.rs`: pointers into a run's outputs (or, for a relay's send, into the
//!   value its rank received, kept by the run's state) and the engine's send buffers handed to
//!   the transport, and `Payload` is `Send`.
//! * `comm/engine/arrive.rs`: landings and control buffers handed to the transport to receive
//!   into, a lane message's bytes copied into its landing, and a landing finished once its
//!   bytes arrived.
//! * `comm/engine/staged.rs`: a staged payload's pieces handed to the transport (pointers into
//!   staging memory the run keeps).
//! * `gpu/staged.rs`: a staged device value's landing (`Vec::set_len` after its bytes arrived;
//!   `Pod` makes any bytes valid).
//! * `comm/stamps.rs`: `clock_gettime(CLOCK_MONOTONIC)` (libc) for the edge stamps.
//! * `comm/shared.rs`: the engine (the transport's handles with it) is `Send` and `Sync`
//!   behind its lock, shared with the pool's spinning workers only where the transport says
//!   any thread may call it.
//! * `ranks.rs`: the pool taken out of its `ManuallyDrop` once, in `Drop`.
//!
//! No other file has `unsafe`.

mod comm;
mod error;
mod gpu;
mod graph;
mod launch;
mod placement;
pub mod plan;
mod ranks;
mod transport;
mod value;

pub use crate::comm::stamps::{monotonic_ns, EdgeStamps, RecvStamps, SendStamps};
pub use crate::error::{Error, ErrorKind};
#[cfg(feature = "nccl")]
pub use crate::gpu::Collective;
pub use crate::gpu::{GpuRanks, GpuRanksBuilder, RankGpuCtx};
pub use crate::graph::{NodeRef, RankCtx, RankGraph, RankGraphBuilder, RankNodeId};
pub use crate::launch::{LaunchInfo, Launcher};
pub use crate::placement::Placement;
pub use crate::plan::{DataId, Digest, GraphDesc, LocalPlan, Lowering, On, Wire};
pub use crate::ranks::{RankOutput, Ranks, RanksBuilder, RunHandle};
#[cfg(feature = "mpi")]
pub use crate::transport::MpiTransport;
pub use crate::transport::{
    DirectSend, InFlight, LocalNetwork, LocalTransport, OpId, Probed, Transport,
};
pub use crate::value::PlainValue;
pub use bytemuck;
pub use plan::lower;
