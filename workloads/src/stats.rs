//! The one percentile helper every figure is read with: medians of runs, latency percentiles.

use std::borrow::Borrow;

/// Values sorted once, to read several percentiles of.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sorted(Vec<f64>);

impl Sorted {
    /// Sorts `values` (ascending; a NaN sorts last).
    pub fn new<T: Borrow<f64>>(values: impl IntoIterator<Item = T>) -> Self {
        let mut v: Vec<f64> = values.into_iter().map(|x| *x.borrow()).collect();
        v.sort_by(f64::total_cmp);
        Sorted(v)
    }

    /// The `q`-quantile (`q` in 0..=1), interpolated linearly between the two nearest ranks
    /// (NumPy's default): 0.5 gives the middle value, or the mean of the two middle ones; 1.0
    /// the largest. NaN when there are no values.
    pub fn percentile(&self, q: f64) -> f64 {
        let Some(last) = self.0.len().checked_sub(1) else {
            return f64::NAN;
        };
        let at = q.clamp(0.0, 1.0) * last as f64;
        let (lo, frac) = (at.floor() as usize, at.fract());
        match self.0.get(lo + 1) {
            Some(&hi) if frac > 0.0 => self.0[lo] + (hi - self.0[lo]) * frac,
            _ => self.0[lo],
        }
    }

    /// How many values there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The `q`-quantile of `values` ([`Sorted::percentile`]); NaN for no values.
pub fn percentile<T: Borrow<f64>>(values: impl IntoIterator<Item = T>, q: f64) -> f64 {
    Sorted::new(values).percentile(q)
}

/// The median of `values`: the middle one, or the mean of the two middle ones; NaN for none.
pub fn median<T: Borrow<f64>>(values: impl IntoIterator<Item = T>) -> f64 {
    percentile(values, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts_and_of_nothing() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        let even = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(median(&even), 2.5, "by reference");
        assert_eq!(median([7.0]), 7.0);
        assert!(median(Vec::<f64>::new()).is_nan());
    }

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let s = Sorted::new((0..=100).rev().map(f64::from));
        assert_eq!(s.percentile(0.99), 99.0);
        assert_eq!(s.percentile(0.0), 0.0);
        assert_eq!(s.percentile(1.0), 100.0);
        assert_eq!(s.percentile(7.0), 100.0, "q is clamped to 0..=1");
        assert!((percentile([20.0, 10.0], 0.99) - 19.9).abs() < 1e-12);
        assert_eq!(percentile([5.0], 0.99), 5.0);
    }
}
