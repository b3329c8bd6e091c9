//! A duration distribution: empirical quantiles, sampled by inverse transform with the
//! simulation's seeded generator (a leaf module).

use rand_core::RngCore;
use serde::{Deserialize, Serialize};

use crate::error::{SimError, SimErrorKind, SimResult};

/// How many quantiles a distribution built from samples keeps (0%, 2.5%, …, 100%).
pub const QUANTILES: usize = 41;

/// A duration distribution in seconds: the quantiles at evenly spaced probabilities
/// (`q[k]` at `k / (len - 1)`), linear between them; one value is a constant.
///
/// Built from recorded durations ([`Dist::from_samples`]), it keeps the spread of the real
/// runs (a tail of slow calls included) in [`QUANTILES`] numbers, whatever the sample count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Quantiles in seconds, ascending.
    pub quantiles_s: Vec<f64>,
}

impl Dist {
    /// Always `seconds`.
    pub fn constant(seconds: f64) -> Self {
        Dist {
            quantiles_s: vec![seconds],
        }
    }

    /// The empirical distribution of `samples` (seconds), as [`QUANTILES`] quantiles (all of
    /// them when there are fewer). `None` for no samples.
    ///
    /// The two end quantiles are set so that the first and last of the 40 slices between
    /// them keep the mean of the samples they stand for: with the minimum and maximum there,
    /// one stray sample (a preempted thread) would stretch a fortieth of the distribution to
    /// its value and move the mean by a fortieth of it.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        if s.len() <= QUANTILES {
            return Some(Dist { quantiles_s: s });
        }
        let last = (s.len() - 1) as f64;
        let at = |k: usize| last * k as f64 / (QUANTILES - 1) as f64;
        let mut quantiles_s: Vec<f64> = (0..QUANTILES)
            .map(|k| {
                let x = at(k);
                let (lo, frac) = (x.floor() as usize, x - x.floor());
                let hi = (lo + 1).min(s.len() - 1);
                s[lo] + (s[hi] - s[lo]) * frac
            })
            .collect();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let (q1, qn) = (quantiles_s[1], quantiles_s[QUANTILES - 2]);
        let low = mean(&s[..=at(1).floor() as usize]);
        let high = mean(&s[at(QUANTILES - 2).ceil() as usize..]);
        quantiles_s[0] = (2.0 * low - q1).clamp(0.0, q1);
        quantiles_s[QUANTILES - 1] = (2.0 * high - qn).max(qn);
        Some(Dist { quantiles_s })
    }

    /// Checks the quantiles: at least one, finite, non-negative, ascending.
    pub(crate) fn check(&self, what: &str) -> SimResult<()> {
        let q = &self.quantiles_s;
        if q.is_empty()
            || q.iter().any(|v| !v.is_finite() || *v < 0.0)
            || q.windows(2).any(|w| w[1] < w[0])
        {
            return Err(SimError::new(
                SimErrorKind::MissingCost,
                format!("{what}: quantiles must be finite, non-negative and ascending, got {q:?}"),
            ));
        }
        Ok(())
    }

    /// The value at probability `u` in `[0, 1]`.
    pub fn at(&self, u: f64) -> f64 {
        let q = &self.quantiles_s;
        if q.len() == 1 {
            return q[0];
        }
        let x = u.clamp(0.0, 1.0) * (q.len() - 1) as f64;
        let lo = (x.floor() as usize).min(q.len() - 2);
        q[lo] + (q[lo + 1] - q[lo]) * (x - lo as f64)
    }

    /// One sample (inverse transform of a uniform draw from `rng`).
    pub fn sample(&self, rng: &mut impl RngCore) -> f64 {
        if self.quantiles_s.len() == 1 {
            return self.quantiles_s[0];
        }
        // 53 random bits as a uniform in [0, 1).
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        self.at(u)
    }

    /// The mean of the piecewise-linear distribution.
    pub fn mean(&self) -> f64 {
        let q = &self.quantiles_s;
        if q.len() == 1 {
            return q[0];
        }
        q.windows(2).map(|w| (w[0] + w[1]) / 2.0).sum::<f64>() / (q.len() - 1) as f64
    }

    /// The median.
    pub fn median(&self) -> f64 {
        self.at(0.5)
    }

    /// Every quantile times `factor`.
    pub fn scaled(&self, factor: f64) -> Self {
        Dist {
            quantiles_s: self.quantiles_s.iter().map(|v| v * factor).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;
    use rand_xoshiro::Xoshiro256PlusPlus;

    #[test]
    fn quantiles_of_a_uniform_ramp() {
        let samples: Vec<f64> = (0..=1000).map(|i| i as f64).collect();
        let d = Dist::from_samples(&samples).unwrap();
        assert_eq!(d.quantiles_s.len(), QUANTILES);
        assert_eq!(d.at(0.0), 0.0);
        assert_eq!(d.at(1.0), 1000.0);
        assert!((d.median() - 500.0).abs() < 1e-9);
        assert!((d.mean() - 500.0).abs() < 1e-9);
    }

    #[test]
    fn a_stray_sample_moves_the_mean_by_its_share_only() {
        // 999 samples near 30 us and one of 500 us (a thread preempted once): mean 30.5.
        let mut samples: Vec<f64> = (0..999).map(|i| 25.0 + (i % 11) as f64).collect();
        samples.push(500.0);
        let want = samples.iter().sum::<f64>() / samples.len() as f64;
        let d = Dist::from_samples(&samples).unwrap();
        assert!((d.mean() - want).abs() < 0.1, "{} vs {want}", d.mean());
        assert!(d.check("x").is_ok());
        // The largest quantile keeps the top fortieth's mean (about 54 here), not the stray
        // sample's value.
        assert!(d.at(1.0) < 100.0, "{}", d.at(1.0));
    }

    #[test]
    fn sampling_follows_the_quantiles_and_the_seed() {
        let d = Dist::from_samples(&[1.0, 2.0, 3.0, 10.0]).unwrap();
        let draw = |seed| {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            (0..2000).map(|_| d.sample(&mut rng)).collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        assert!(a.iter().all(|&v| (1.0..=10.0).contains(&v)));
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        assert!((mean - d.mean()).abs() < 0.2, "{mean} vs {}", d.mean());
    }

    #[test]
    fn bad_quantiles_are_refused() {
        assert!(Dist {
            quantiles_s: vec![]
        }
        .check("x")
        .is_err());
        assert!(Dist::constant(-1.0).check("x").is_err());
        let e = Dist {
            quantiles_s: vec![2.0, 1.0],
        }
        .check("kind 'gemm'")
        .unwrap_err();
        assert!(e.to_string().contains("kind 'gemm'"), "{e}");
    }
}
