//! The A/B verdict rules: ABBA blocks, per-block ratio and spread, verdicts, geomean.
//!
//! A block is four samples taken in the order A, B, B, A. Its ratio is
//! `(b1 + b2) / (a1 + a2)` (below 1: B is faster) and its spread is the larger relative
//! disagreement between the two samples of the same variant:
//! `max(|a1 - a2| / mean(a), |b1 - b2| / mean(b))`.
//!
//! A comparison at one size summarises its recorded blocks by the median ratio and the
//! median spread. Verdict: spread above `max_spread` (5%) is **inconclusive**; otherwise
//! **pass** when the ratio is at most `1 + max(min_tolerance, spread_factor * spread)`
//! (B no more than max(2%, 2 x spread) slower), else **fail**. B is reported as **faster**
//! when the verdict is pass and the ratio is below `1 - max(min_tolerance, spread_factor *
//! spread)`.

use serde::{Deserialize, Serialize};

/// Thresholds of the verdict. The defaults are the project's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rules {
    /// Spread above which a block or comparison is inconclusive (0.05).
    pub max_spread: f64,
    /// Smallest allowed slowdown of B (0.02).
    pub min_tolerance: f64,
    /// Allowed slowdown as a multiple of the spread (2.0).
    pub spread_factor: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { max_spread: 0.05, min_tolerance: 0.02, spread_factor: 2.0 }
    }
}

/// Outcome of one block or one comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// B is no slower than the tolerance allows.
    Pass,
    /// B is slower than the tolerance allows.
    Fail,
    /// The samples disagree too much to say.
    Inconclusive,
}

/// Four samples in ABBA order (seconds, or any one unit).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// First and last sample (A).
    pub a: [f64; 2],
    /// Middle samples (B).
    pub b: [f64; 2],
}

impl Block {
    /// `(b1 + b2) / (a1 + a2)`.
    pub fn ratio(&self) -> f64 {
        (self.b[0] + self.b[1]) / (self.a[0] + self.a[1])
    }

    /// `max(|a1 - a2| / mean(a), |b1 - b2| / mean(b))`.
    pub(crate) fn spread(&self) -> f64 {
        let rel = |p: [f64; 2]| (p[0] - p[1]).abs() / ((p[0] + p[1]) / 2.0);
        rel(self.a).max(rel(self.b))
    }
}

impl Rules {
    /// The slowdown B may show at this spread: `max(min_tolerance, spread_factor * spread)`.
    pub(crate) fn tolerance(&self, spread: f64) -> f64 {
        self.min_tolerance.max(self.spread_factor * spread)
    }

    /// Verdict for a ratio measured with a spread.
    pub(crate) fn judge(&self, ratio: f64, spread: f64) -> Verdict {
        if spread.is_nan() || spread > self.max_spread || !ratio.is_finite() {
            Verdict::Inconclusive
        } else if ratio <= 1.0 + self.tolerance(spread) {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }
}

/// How many blocks or comparisons got each verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Passes.
    pub pass: u32,
    /// Failures.
    pub fail: u32,
    /// Inconclusive results.
    pub inconclusive: u32,
}

impl Counts {
    /// Adds one verdict.
    pub fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Pass => self.pass += 1,
            Verdict::Fail => self.fail += 1,
            Verdict::Inconclusive => self.inconclusive += 1,
        }
    }
}

/// A comparison at one size, on one clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Median block ratio B/A.
    pub ratio: f64,
    /// Median block spread.
    pub spread: f64,
    /// Verdict from `ratio` and `spread`.
    pub verdict: Verdict,
    /// True when the verdict is pass and B is faster by more than the tolerance.
    pub faster: bool,
    /// Verdicts of the individual blocks.
    pub blocks: Counts,
}

/// Median of `values` (sorted in place; NaN when empty).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Summarises recorded blocks (no blocks: an inconclusive summary with NaN ratio).
pub(crate) fn summarize(blocks: &[Block], rules: &Rules) -> Summary {
    let mut counts = Counts::default();
    for b in blocks {
        counts.add(rules.judge(b.ratio(), b.spread()));
    }
    let ratio = median(&mut blocks.iter().map(Block::ratio).collect::<Vec<_>>());
    let spread = median(&mut blocks.iter().map(Block::spread).collect::<Vec<_>>());
    let verdict = rules.judge(ratio, spread);
    Summary {
        ratio,
        spread,
        verdict,
        faster: verdict == Verdict::Pass && ratio < 1.0 - rules.tolerance(spread),
        blocks: counts,
    }
}

/// Geometric-mean change across sizes: `exp(mean(ln ratio)) - 1` (-0.4 is 40% less time).
pub(crate) fn geomean_change(ratios: &[f64]) -> f64 {
    if ratios.is_empty() {
        return f64::NAN;
    }
    (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp() - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(a: [f64; 2], b: [f64; 2]) -> Block {
        Block { a, b }
    }

    #[test]
    fn block_ratio_and_spread() {
        let b = block([10.0, 10.0], [8.0, 8.0]);
        assert_eq!(b.ratio(), 0.8);
        assert_eq!(b.spread(), 0.0);
        let b = block([9.0, 11.0], [10.0, 10.0]);
        assert!((b.spread() - 0.2).abs() < 1e-12);
        let b = block([10.0, 10.0], [9.7, 10.3]);
        assert!((b.spread() - 0.06).abs() < 1e-12);
    }

    #[test]
    fn spread_above_five_percent_is_inconclusive() {
        let r = Rules::default();
        assert_eq!(r.judge(1.0, 0.0501), Verdict::Inconclusive);
        assert_eq!(r.judge(0.5, 0.06), Verdict::Inconclusive, "even a large win is inconclusive when noisy");
        assert_eq!(r.judge(1.0, 0.05), Verdict::Pass);
        assert_eq!(r.judge(1.0, f64::NAN), Verdict::Inconclusive);
    }

    #[test]
    fn pass_allows_max_of_two_percent_and_twice_the_spread() {
        let r = Rules::default();
        // Quiet: 2% allowed.
        assert_eq!(r.judge(1.019, 0.001), Verdict::Pass);
        assert_eq!(r.judge(1.021, 0.001), Verdict::Fail);
        // Spread 3%: 6% allowed.
        assert_eq!(r.judge(1.059, 0.03), Verdict::Pass);
        assert_eq!(r.judge(1.061, 0.03), Verdict::Fail);
    }

    #[test]
    fn summary_uses_medians_and_counts_blocks() {
        let r = Rules::default();
        let blocks = [
            block([10.0, 10.0], [8.0, 8.0]),
            block([10.0, 10.0], [8.2, 8.2]),
            block([10.0, 10.0], [8.1, 8.1]),
            block([10.0, 12.0], [8.0, 8.0]), // spread 18%: inconclusive block
        ];
        let s = summarize(&blocks, &r);
        // Ratios 0.80, 0.82, 0.81, 0.80: median 0.805. Spreads 0, 0, 0, 0.18: median 0.
        assert!((s.ratio - 0.805).abs() < 1e-12, "{}", s.ratio);
        assert_eq!(s.spread, 0.0);
        assert_eq!(s.blocks, Counts { pass: 3, fail: 0, inconclusive: 1 });
        assert_eq!(s.verdict, Verdict::Pass);
        assert!(s.faster);
        let slow = [block([10.0, 10.0], [11.0, 11.0]); 3];
        let s = summarize(&slow, &r);
        assert_eq!(s.verdict, Verdict::Fail);
        assert!(!s.faster);
        assert_eq!(s.blocks.fail, 3);
        let s = summarize(&[], &r);
        assert_eq!(s.verdict, Verdict::Inconclusive);
    }

    #[test]
    fn a_small_win_within_tolerance_is_a_pass_but_not_faster() {
        let s = summarize(&[block([10.0, 10.0], [9.9, 9.9]); 3], &Rules::default());
        assert_eq!(s.verdict, Verdict::Pass);
        assert!(!s.faster);
    }

    #[test]
    fn geomean_change_of_ratios() {
        assert!((geomean_change(&[0.5, 2.0])).abs() < 1e-12);
        assert!((geomean_change(&[0.6, 0.6, 0.6]) + 0.4).abs() < 1e-12);
        assert!((geomean_change(&[0.25, 1.0]) + 0.5).abs() < 1e-12);
        assert!(geomean_change(&[]).is_nan());
    }
}
