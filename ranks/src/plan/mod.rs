//! Layer (a): placement and lowering, pure. From a rank-annotated graph description to each
//! rank's local plan, and the structure digest ranks compare. No MPI, no threads, no clock:
//! deterministic functions that the runtime and the simulator call alike.

mod desc;
mod digest;
mod lower;
mod order;
mod relay;
mod transfer;

pub use desc::{CollectiveDesc, DataId, DatumDesc, GraphDesc, NodeDesc, On, Wire};
pub use digest::{digest, first_difference, relay_digest, Digest};
pub use lower::{lower, place, LocalNode, LocalPlan, Lowering};
pub use order::NcclOp;
pub use relay::{crossing_hosts, k_ary, per_host, relay, relayable, Parents};
pub use transfer::Transfer;
