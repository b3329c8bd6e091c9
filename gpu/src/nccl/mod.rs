//! NCCL (feature `nccl`): a communicator per device, made on a bound worker of the device, and
//! its operations as GPU node work. Two layers: `comm.rs` (the library check, the id, the
//! communicator owner, below the device table that holds it) and `ops.rs` (what a node calls:
//! [`GpuCtx::nccl_init`](crate::GpuCtx::nccl_init) and the collectives, above the node).
//!
//! Hand-written over cudarc's `nccl::result` calls rather than its `Comm`: a `Comm` fixes its
//! stream when made and issues every operation there, is not `Send` (the device's workers
//! share one communicator, under a lock), and aborts itself in its `Drop` on the dropping
//! thread; here the communicator is an owner of the device's table, aborted by the device's
//! last worker at teardown, and each operation waits for the node's stream before it runs on
//! the communicator's own stream (see `ops.rs` for why a stream of its own).

pub(crate) mod comm;
mod ops;

pub use comm::{nccl_library_check, NcclId};
/// NCCL's reduction operators (cudarc's type).
pub use cudarc::nccl::ReduceOp;
pub use ops::NcclElement;
