//! What a captured CUDA graph may not hold, checked once its members' bodies are captured and
//! before it is instantiated. boundpool's own calls are made safe for a capture where they are
//! made (`node/mod.rs`: allocations hoisted, host copies staged, downloads and frees refused);
//! cudarc calls a body makes on the capturing stream are not, so the graph itself is read:
//!
//! * an allocation the graph makes (a stream-ordered allocation captured: cudarc's `alloc`,
//!   `alloc_zeros`, `clone_htod`, `clone_dtod` on [`GpuCtx::stream`](crate::GpuCtx::stream), or
//!   a library's) and does not free is refused, naming the node whose body made it: kept past
//!   the capture (an output), the graph would own memory it never frees, and a CUDA graph with
//!   an allocation still live cannot be launched again. One freed in the graph (a slice made
//!   and dropped inside the body) is a graph memory node pair and replays as it was captured.
//!
//! * a copy between the device and pageable host memory (cudarc's `memcpy_htod`, `clone_htod`,
//!   `memcpy_dtoh` with a `Vec` or slice) is refused where the driver records one: a replay
//!   would copy from or to that address whatever it then holds (page-locked memory, a
//!   [`PinnedBuffer`](crate::PinnedBuffer), is what a graph may copy from).
//!
//! A node is attributed to the member whose body added it: the first member tail (the
//! capture's dependency set after each member's body) its dependents lead to, breadth first.
//! A member's operations follow one another on the capturing stream up to its tail, and later
//! members depend on that tail, so the first tail reached is its own. Calls the driver or a library
//! refuses outright under a capture fail the body; [`refused_call`] says which cudarc calls
//! make such an error and what to use instead.

use std::collections::{HashMap, HashSet, VecDeque};
use std::error::Error;

use cudarc::cublas::result::CublasError;
use cudarc::cublaslt::result::CublasError as LtError;
use cudarc::curand::result::CurandError;

use crate::driver::{self, CudaGraph, CudaGraphNode, DResult, NodeKind};
use crate::node::GpuCtx;

/// Which member's body added which nodes: each member's tail nodes (the capture's dependency
/// set after its body), the first member to have a node as its tail owning it.
#[derive(Debug, Default)]
pub(super) struct NodeOwners {
    tails: HashMap<CudaGraphNode, u32>,
}

impl NodeOwners {
    /// Member `m`'s body has been captured; the capture's tail is now `tail`.
    pub(super) fn member_done(&mut self, m: u32, tail: &[CudaGraphNode]) {
        for &n in tail {
            self.tails.entry(n).or_insert(m);
        }
    }

    /// The member whose body added `node`: the owner of the first tail reached from it,
    /// breadth first along `edges` (the graph's `(from, to)` pairs).
    fn owner(&self, node: CudaGraphNode, edges: &[(CudaGraphNode, CudaGraphNode)]) -> Option<u32> {
        let mut next: HashMap<CudaGraphNode, Vec<CudaGraphNode>> = HashMap::new();
        for &(a, b) in edges {
            next.entry(a).or_default().push(b);
        }
        let mut seen = HashSet::from([node]);
        let mut queue = VecDeque::from([node]);
        while let Some(n) = queue.pop_front() {
            if let Some(&m) = self.tails.get(&n) {
                return Some(m);
            }
            for &d in next.get(&n).into_iter().flatten() {
                if seen.insert(d) {
                    queue.push_back(d);
                }
            }
        }
        None
    }
}

/// Something a captured graph holds that a replay cannot: what, and the member whose body
/// added it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) member: Option<u32>,
    pub(super) what: Held,
}

/// What [`Refused`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Held {
    /// An allocation the graph makes and never frees, of this many bytes.
    Unfreed(usize),
    /// A copy of `bytes` bytes to (`to_host`) or from pageable host memory.
    PageableCopy { to_host: bool, bytes: usize },
}

impl Refused {
    /// Why the capture is refused, and what to do instead.
    pub(super) fn why(&self) -> String {
        match self.what {
            Held::Unfreed(bytes) => format!(
                "a stream-ordered allocation of {bytes} bytes made on the capturing stream \
                 (cudarc's alloc / alloc_zeros / clone_htod / clone_dtod on GpuCtx::stream(), \
                 or a library's) is not freed inside the capture: kept past the body, the CUDA \
                 graph would own the memory and could not be launched again. Allocate with \
                 GpuCtx::alloc, alloc_zeros or upload (made outside the graph, kept with the \
                 output), or drop the slice inside the body (the graph then frees it)"
            ),
            Held::PageableCopy { to_host, bytes } => {
                let (dir, calls) = if to_host {
                    ("to", "memcpy_dtoh / clone_dtoh")
                } else {
                    ("from", "memcpy_htod / clone_htod")
                };
                format!(
                    "a copy of {bytes} bytes {dir} pageable host memory (cudarc's {calls} with \
                     a Vec or slice) was captured: every replay would copy {dir} that address \
                     whatever it then holds. Copy with GpuCtx::upload / copy_to_device (staged) \
                     or through a PinnedBuffer (copy_from_pinned, copy_to_pinned)"
                )
            }
        }
    }
}

/// The first thing `graph` holds that a replay cannot (in the driver's order of its nodes).
pub(super) fn refused_node(
    gctx: &GpuCtx<'_, '_>,
    graph: &CudaGraph,
    owners: &NodeOwners,
) -> DResult<Option<Refused>> {
    let ctx = gctx.b.ctx;
    let nodes = driver::graph_nodes(ctx, graph)?;
    let mut live: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut copy: Option<(usize, Held)> = None;
    for (i, &n) in nodes.iter().enumerate() {
        match driver::node_kind(ctx, n)? {
            NodeKind::MemAlloc { ptr, bytes } => {
                live.insert(ptr, (i, bytes));
            }
            NodeKind::MemFree { ptr } => {
                live.remove(&ptr);
            }
            NodeKind::PageableCopy { to_host, bytes } => {
                copy.get_or_insert((i, Held::PageableCopy { to_host, bytes }));
            }
            NodeKind::Other => {}
        }
    }
    let unfreed = live
        .into_values()
        .min_by_key(|&(i, _)| i)
        .map(|(i, bytes)| (i, Held::Unfreed(bytes)));
    let first = match (copy, unfreed) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    };
    let Some((i, what)) = first else {
        return Ok(None);
    };
    let edges = driver::graph_edges(ctx, graph)?;
    Ok(Some(Refused {
        member: owners.owner(nodes[i], &edges),
        what,
    }))
}

const DRIVER_HINT: &str = "the driver refuses this call under a capture (cudarc's load_module \
     or load_function; a copy between the device and pageable host memory: clone_htod, \
     memcpy_htod or memcpy_dtoh with a Vec or slice; a synchronize or an event query): load \
     modules once per worker (GpuPoolBuilder::worker_state), copy with GpuCtx::upload / \
     copy_to_device (staged) or through a PinnedBuffer";
const BLAS_HINT: &str = "a CudaBlas made or dropped in a captured body: its handle and default \
     workspace are made and freed with calls a capture refuses; use GpuCtx::cublas() (the \
     worker's handle, with a workspace made outside the capture)";
const LT_HINT: &str = "a CudaBlasLT made or dropped in a captured body: its handle and workspace \
     are made and freed with calls a capture refuses; use GpuCtx::cublaslt() (the worker's \
     handle, with a workspace made outside the capture)";
const LIB_PANIC_HINT: &str = "a CudaBlas or CudaBlasLT made or dropped in a captured body: its \
     handle and workspace are made and freed with calls a capture refuses (cudarc unwraps those \
     calls' statuses); use GpuCtx::cublas() or GpuCtx::cublaslt() (the worker's handles, with \
     workspaces made outside the capture)";
const RAND_HINT: &str = "a CudaRng made or dropped in a captured body: a generator makes and \
     frees its state with calls a capture refuses; draw in an eager GPU node \
     (ReplayBuilder::eager_gpu_node) with a CudaRng on GpuCtx::stream() there";

/// What a body's error says about a call a capture refused: the cudarc calls that make such an
/// error, and what to use instead (None: not such an error).
pub(super) fn refused_call(e: &(dyn Error + 'static)) -> Option<String> {
    // Bounded: a chain is short, and a cyclic one must not hang a worker.
    for x in std::iter::successors(Some(e), |&x| x.source()).take(32) {
        if let Some(&d) = x.downcast_ref::<driver::DriverError>() {
            if driver::is_capture_refusal(d) {
                return Some(format!("{}: {DRIVER_HINT}", driver::error_name(d)));
            }
        } else if let Some(b) = x.downcast_ref::<CublasError>() {
            // What `cublasCreate` returns under a capture (a routine's own failure says
            // nothing about the handle).
            use cudarc::cublas::sys::cublasStatus_t::*;
            return matches!(
                b.0,
                CUBLAS_STATUS_NOT_INITIALIZED | CUBLAS_STATUS_ALLOC_FAILED
            )
            .then(|| format!("cuBLAS {:?}: {BLAS_HINT}", b.0));
        } else if let Some(b) = x.downcast_ref::<LtError>() {
            return Some(format!("cuBLASLt {:?}: {LT_HINT}", b.0));
        } else if let Some(r) = x.downcast_ref::<CurandError>() {
            return Some(format!("cuRAND {:?}: {RAND_HINT}", r.0));
        }
    }
    None
}

/// Whether a capture failed in cuRAND (a `CurandError` underneath, or named by a panic's text).
pub(super) fn curand_refused(e: &crate::GpuError) -> bool {
    let typed = std::iter::successors(Some(e as &(dyn Error + 'static)), |&x| x.source())
        .take(32)
        .any(|x| x.is::<CurandError>());
    typed || e.message().contains("CurandError(")
}

/// [`refused_call`] for a body's panic (cudarc's library handles unwrap their destroy calls in
/// `Drop`, and `CudaBlasLT::new` its workspace's allocation): read from the panic's text.
pub(super) fn refused_call_in_panic(text: &str) -> Option<&'static str> {
    if text.contains("CublasError(") {
        Some(LIB_PANIC_HINT)
    } else if text.contains("CurandError(") {
        Some(RAND_HINT)
    } else if text.contains("DriverError(CUDA_ERROR_STREAM_CAPTURE")
        || text.contains("DriverError(CUDA_ERROR_CAPTURED_EVENT")
    {
        Some(DRIVER_HINT)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_belong_to_the_member_whose_tail_they_reach_first() {
        let n = |i: usize| CudaGraphNode::fake(i);
        // Member 4: 0 -> 1 (tail 1). Member 7: nothing (its tail is still 1). Member 2, after
        // member 4: 1 -> 2 -> 3 (tail 3). Member 5, independent: 4 -> 5 (tail 5). Member 9,
        // after 2 and 5: 3 -> 6, 5 -> 6 (tail 6).
        let edges = [(0, 1), (1, 2), (2, 3), (4, 5), (3, 6), (5, 6)].map(|(a, b)| (n(a), n(b)));
        let mut o = NodeOwners::default();
        o.member_done(4, &[n(1)]);
        o.member_done(7, &[n(1)]);
        o.member_done(2, &[n(3)]);
        o.member_done(5, &[n(5)]);
        o.member_done(9, &[n(6)]);
        let owner = |i| o.owner(n(i), &edges);
        assert_eq!((owner(0), owner(1)), (Some(4), Some(4)));
        assert_eq!((owner(2), owner(3)), (Some(2), Some(2)));
        assert_eq!((owner(4), owner(5)), (Some(5), Some(5)));
        assert_eq!(owner(6), Some(9));
        assert_eq!(o.owner(n(7), &edges), None, "a node no tail follows");
    }

    #[test]
    fn the_refusals_say_what_and_how_to_fix_it() {
        let why = Refused {
            member: Some(3),
            what: Held::Unfreed(4096),
        }
        .why();
        assert!(
            why.contains("4096 bytes") && why.contains("alloc_zeros"),
            "{why}"
        );
        assert!(
            why.contains("GpuCtx::alloc") && why.contains("drop the slice"),
            "{why}"
        );
        let why = Refused {
            member: None,
            what: Held::PageableCopy {
                to_host: false,
                bytes: 64,
            },
        }
        .why();
        assert!(
            why.contains("from pageable") && why.contains("clone_htod"),
            "{why}"
        );
        assert!(why.contains("PinnedBuffer"), "{why}");
    }

    #[test]
    fn refused_calls_are_named_from_the_error_chain() {
        use cudarc::driver::sys::CUresult;
        let d = driver::DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        let wrapped = crate::GpuError::new(crate::GpuErrorKind::Driver, "x").with_source(d);
        let hint = refused_call(&wrapped).expect("a refusal underneath");
        assert!(
            hint.contains("load_module") && hint.contains("clone_htod"),
            "{hint}"
        );
        let other = driver::DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(refused_call(&other), None, "not a capture refusal");
        let b = CublasError(cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED);
        assert!(refused_call(&b).is_some_and(|h| h.contains("CudaBlas")));
        let b = CublasError(cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED);
        assert_eq!(
            refused_call(&b),
            None,
            "a routine's failure, not the handle's"
        );
        let r = CurandError(cudarc::curand::sys::curandStatus_t::CURAND_STATUS_LAUNCH_FAILURE);
        assert!(refused_call(&r).is_some_and(|h| h.contains("CudaRng")));
        let text = "called `Result::unwrap()` on an `Err` value: CublasError(CUBLAS_STATUS_INTERNAL_ERROR)";
        assert!(refused_call_in_panic(text).is_some_and(|h| h.contains("CudaBlasLT")));
        assert_eq!(refused_call_in_panic("index out of bounds"), None);
    }

    #[test]
    fn a_curand_refusal_is_found_typed_or_in_a_panics_text() {
        use crate::{GpuError, GpuErrorKind};
        let r =
            CurandError(cudarc::curand::sys::curandStatus_t::CURAND_STATUS_INITIALIZATION_FAILED);
        let typed = GpuError::new(GpuErrorKind::Capture, "its body failed").with_source(r);
        assert!(curand_refused(&typed));
        let panicked = GpuError::new(
            GpuErrorKind::Capture,
            "its body panicked: called `Result::unwrap()` on an `Err` value: CurandError(CURAND_STATUS_LAUNCH_FAILURE)",
        );
        assert!(curand_refused(&panicked));
        let other = GpuError::new(GpuErrorKind::Capture, "a download");
        assert!(!curand_refused(&other));
    }
}
