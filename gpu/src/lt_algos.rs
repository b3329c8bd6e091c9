//! Each device's cuBLASLt algorithm per matmul problem: the heuristic's first, kept after the
//! first call so that later calls skip the heuristic, or the fastest of a timed set
//! ([`CublasLt::tune`](crate::CublasLt::tune)), which later calls of the problem then run on
//! every worker of the device, eager or captured. A leaf: plain data, no driver calls.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::cublaslt::sys::cublasLtMatmulAlgo_t;

/// A matmul as cuBLASLt's heuristic sees it (the scalars aside, which it does not read): the
/// cache's key. Integers are the CUDA enums' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LtProblem {
    /// Data type and compute type.
    pub(crate) types: (i32, i32),
    /// A, B, C transposed.
    pub(crate) trans: [bool; 3],
    pub(crate) mnk: [u64; 3],
    /// Leading dimensions of A, B, C.
    pub(crate) ld: [i64; 3],
    /// Batch count (1 without a batch) and the strides of A, B, C and the bias (0 unless given).
    pub(crate) batch: i64,
    pub(crate) strides: [i64; 4],
    pub(crate) epilogue: i32,
}

/// One device's algorithms, by problem.
#[derive(Default)]
pub(crate) struct LtAlgoCache {
    map: Mutex<HashMap<LtProblem, cublasLtMatmulAlgo_t>>,
}

impl LtAlgoCache {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<LtProblem, cublasLtMatmulAlgo_t>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The algorithm kept for `p`, if any.
    pub(crate) fn get(&self, p: &LtProblem) -> Option<cublasLtMatmulAlgo_t> {
        self.map().get(p).copied()
    }

    /// Keeps the heuristic's first for `p`, unless a tuned one is kept already.
    pub(crate) fn keep_heuristic(&self, p: LtProblem, algo: cublasLtMatmulAlgo_t) {
        self.map().entry(p).or_insert(algo);
    }

    /// Keeps the fastest of a timed set for `p`, replacing what was kept.
    pub(crate) fn keep_tuned(&self, p: LtProblem, algo: cublasLtMatmulAlgo_t) {
        self.map().insert(p, algo);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(m: u64) -> LtProblem {
        LtProblem {
            types: (0, 68),
            trans: [true, false, false],
            mnk: [m, 8, 1024],
            ld: [1024, 1024, m as i64],
            batch: 1,
            strides: [0; 4],
            epilogue: 4,
        }
    }

    fn algo(tag: u64) -> cublasLtMatmulAlgo_t {
        cublasLtMatmulAlgo_t { data: [tag; 8] }
    }

    #[test]
    fn a_tuned_algorithm_replaces_the_heuristics_and_is_not_replaced_by_it() {
        let c = LtAlgoCache::default();
        assert!(c.get(&problem(1024)).is_none());
        c.keep_heuristic(problem(1024), algo(1));
        assert_eq!(c.get(&problem(1024)), Some(algo(1)));
        c.keep_heuristic(problem(1024), algo(2));
        assert_eq!(
            c.get(&problem(1024)),
            Some(algo(1)),
            "the first heuristic stays"
        );
        c.keep_tuned(problem(1024), algo(3));
        c.keep_heuristic(problem(1024), algo(4));
        assert_eq!(c.get(&problem(1024)), Some(algo(3)), "tuned wins");
        assert!(
            c.get(&problem(2048)).is_none(),
            "another shape is another problem"
        );
    }
}
