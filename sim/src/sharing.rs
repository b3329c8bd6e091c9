//! How kernels of several streams share one GPU (a leaf module): a kernel kind's occupancy,
//! the share of the SMs it holds while it runs, from its throughput alone on the GPU.
//!
//! A kernel's time alone splits into the part its arithmetic explains at the rate the GPU
//! reaches (blocks computing on every SM) and the rest (blocks resident but waiting on
//! memory, on a dependency between their own small launches, on a tail wave). The first part
//! fills the GPU; of the rest the kernel still holds the share `held` of the SMs, and leaves
//! the others to kernels of other streams. So
//!
//! ```text
//! occupancy = busy + (1 - busy) × held,   busy = rate alone / peak, at most 1
//! ```
//!
//! The peak is the fastest rate a kind of the workload reaches alone (the GEMM's), not the
//! datasheet's: a GEMM at 85% of the datasheet's rate is as fast as the GPU's GEMMs go, and
//! two of them side by side do not get through more work than one after the other. `held`
//! is not a datasheet figure either: it is calibrated once on a recorded run of one size and
//! then used for every other (see [`SmShare::H100_HELD`]).

use serde::{Deserialize, Serialize};

/// The occupancy model: a peak rate and the held share of the time beyond it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmShare {
    /// The rate at which a kernel fills the GPU, TFLOP/s: the fastest kind's rate alone.
    pub peak_tflops: f64,
    /// The share of the SMs a kernel holds for the part of its time that its arithmetic at
    /// the peak rate does not explain: 0 lets that part overlap other streams' kernels
    /// freely, 1 makes every kernel fill the GPU.
    pub held: f64,
}

impl SmShare {
    /// `held` calibrated on the H100's tiled Cholesky at N = 8192, tile 2048, 8 workers (the
    /// recording of `benches/device/sim_call.sh`, `boundpool sim check-cholesky`, which
    /// predicts N = 16384 and 32768 with it; docs/benchmarks.md, "A cluster on paper").
    pub const H100_HELD: f64 = 0.54;

    /// `held`, with the peak at the fastest of `rates` (each kind's TFLOP/s alone).
    pub fn fastest(rates: impl IntoIterator<Item = f64>, held: f64) -> Self {
        SmShare {
            peak_tflops: rates
                .into_iter()
                .filter(|r| r.is_finite())
                .fold(0.0, f64::max),
            held,
        }
    }

    /// The share of the peak rate a kernel running at `tflops` alone computes at: 0 to 1.
    pub fn busy(&self, tflops: f64) -> f64 {
        if self.peak_tflops > 0.0 && tflops.is_finite() {
            (tflops / self.peak_tflops).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The occupancy of a kernel running at `tflops` alone: in (0, 1].
    pub fn occupancy(&self, tflops: f64) -> f64 {
        let busy = self.busy(tflops);
        (busy + (1.0 - busy) * self.held.clamp(0.0, 1.0)).clamp(0.01, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_at_peak_fills_the_gpu_and_a_slow_one_holds_its_share() {
        let s = SmShare {
            peak_tflops: 50.0,
            held: 0.5,
        };
        assert_eq!(s.occupancy(50.0), 1.0);
        assert_eq!(s.occupancy(80.0), 1.0);
        // A quarter of its time computing, half the rest held: 0.25 + 0.75 × 0.5.
        assert!((s.occupancy(12.5) - 0.625).abs() < 1e-12);
        // Nothing computed: the held share; never zero.
        assert_eq!(s.occupancy(0.0), 0.5);
        let free = SmShare { held: 0.0, ..s };
        assert_eq!(free.occupancy(0.0), 0.01);
        assert!((free.occupancy(25.0) - 0.5).abs() < 1e-12);
        let full = SmShare { held: 1.0, ..s };
        assert_eq!(full.occupancy(1.0), 1.0);
    }

    #[test]
    fn the_fastest_kind_sets_the_peak() {
        let s = SmShare::fastest([3.0, 54.5, f64::NAN, 21.0], 0.5);
        assert_eq!(s.peak_tflops, 54.5);
        assert_eq!(s.occupancy(54.5), 1.0);
    }
}
