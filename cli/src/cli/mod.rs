//! The subcommands of the `boundpool` binary.

pub(crate) mod bench;
pub(crate) mod gpu_replay;
pub(crate) mod graph_file;
pub(crate) mod latency;
pub(crate) mod observe;
pub(crate) mod partitions;
pub(crate) mod progress;
#[cfg(feature = "mpi")]
pub(crate) mod ranks_run;
pub(crate) mod run;
pub(crate) mod soak;
pub(crate) mod timeline;
pub(crate) mod trace;
pub(crate) mod verify;
