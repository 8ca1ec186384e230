//! How a dispatch follows the live token count: a plan made for a maximum token count runs at
//! a live count t set per forward, and each of its dispatches says which words of its uniform
//! parameters are functions of t, how many workgroups it runs at t, and for which counts it
//! runs at all ([`Sizing`]). The sizing kernel ([`crate::kernels::sizing`]) carries these rules
//! out on the device; the host evaluates the same values here.
//!
//! Every value is `min(ceil(max(per_token · t + base - floor, 0) / divisor), cap)`
//! ([`LiveValue`]), which covers the kernels' counts (tokens, entries `t · k`, blocks of
//! entries, padded rows and tiles of the dispatch layout, workgroups of any of these, and of
//! the part of them in one x window).

use std::ops::RangeInclusive;

/// A count that follows the live token count t exactly: `per_token · t + base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveCount {
    per_token: u64,
    base: u64,
}

impl LiveCount {
    /// `per_token · t + base`.
    pub(crate) const fn new(per_token: u32, base: u32) -> Self {
        LiveCount { per_token: per_token as u64, base: base as u64 }
    }

    /// t itself.
    pub(crate) const fn tokens() -> Self {
        LiveCount::new(1, 0)
    }

    /// The same count whatever t.
    pub(crate) const fn constant(count: u32) -> Self {
        LiveCount::new(0, count)
    }

    /// `m` times the count.
    pub(crate) const fn times(self, m: u32) -> Self {
        LiveCount { per_token: self.per_token * m as u64, base: self.base * m as u64 }
    }

    /// The count plus `n`.
    pub(crate) const fn plus(self, n: u32) -> Self {
        LiveCount { base: self.base + n as u64, ..self }
    }

    /// The count as a [`LiveValue`].
    pub(crate) const fn value(self) -> LiveValue {
        self.div_ceil(1)
    }

    /// `ceil(count / divisor)` (a zero divisor is taken as 1).
    pub(crate) const fn div_ceil(self, divisor: u32) -> LiveValue {
        self.beyond(0, divisor)
    }

    /// `ceil(max(count - floor, 0) / divisor)`: the part of the count past `floor`, in units of
    /// `divisor` (a zero divisor is taken as 1).
    pub(crate) const fn beyond(self, floor: u32, divisor: u32) -> LiveValue {
        LiveValue {
            count: self,
            floor: floor as u64,
            divisor: if divisor == 0 { 1 } else { divisor as u64 },
            cap: u32::MAX as u64,
        }
    }

    /// The count at t = `tokens`.
    pub(crate) fn at(self, tokens: u32) -> u64 {
        self.per_token * u64::from(tokens) + self.base
    }

    /// The first t at which the count passes `floor`, if any.
    pub(crate) fn first_above(self, floor: u32) -> Option<u32> {
        let floor = u64::from(floor);
        if self.base > floor {
            return Some(0);
        }
        if self.per_token == 0 {
            return None;
        }
        u32::try_from((floor - self.base) / self.per_token + 1).ok()
    }
}

/// A u32 that follows the live token count t: the part of a [`LiveCount`] past `floor`,
/// divided by `divisor` and rounded up, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveValue {
    count: LiveCount,
    floor: u64,
    divisor: u64,
    cap: u64,
}

impl LiveValue {
    /// The same value whatever t.
    pub(crate) const fn constant(value: u32) -> Self {
        LiveCount::constant(value).value()
    }

    /// The value, at most `cap`.
    pub(crate) fn at_most(self, cap: u32) -> Self {
        LiveValue { cap: self.cap.min(u64::from(cap)), ..self }
    }

    /// The value at t = `tokens`.
    pub(crate) fn at(self, tokens: u32) -> u64 {
        self.count.at(tokens).saturating_sub(self.floor).div_ceil(self.divisor).min(self.cap)
    }

    /// The count the value follows.
    pub(crate) fn count(self) -> LiveCount {
        self.count
    }

    /// `[per_token, base, floor, divisor, cap]`, the terms the sizing kernel's rules carry.
    pub(crate) fn terms(self) -> [u64; 5] {
        [self.count.per_token, self.count.base, self.floor, self.divisor, self.cap]
    }
}

/// How a dispatch's grid follows the live count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LiveGrid {
    /// The planned grid, whatever the count.
    Fixed,
    /// `value` workgroups in one dimension, spilled into y past the per-dimension limit as
    /// [`Context::grid`] spills them.
    Spilled(LiveValue),
    /// `value` workgroups in x; the planned y and z.
    X(LiveValue),
}

/// How a dispatch follows the live token count: its grid, the words of its parameters
/// (binding 0, bound whole) that are functions of the count, and the counts at which it runs
/// at all (none at other counts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sizing {
    grid: LiveGrid,
    words: Vec<(u32, LiveValue)>,
    runs_for: RangeInclusive<u32>,
}

impl Sizing {
    /// The grid `grid`, parameters that do not depend on the count, at every count.
    pub(crate) fn new(grid: LiveGrid) -> Self {
        Sizing { grid, words: Vec::new(), runs_for: 0..=u32::MAX }
    }

    /// The u32 field at byte `offset` of the parameters (`std::mem::offset_of!`) is `value`.
    pub(crate) fn field(mut self, offset: usize, value: LiveValue) -> Self {
        // Parameters are a few dozen bytes: the word index fits in u32.
        self.words.push(((offset / 4) as u32, value));
        self
    }

    /// Runs only from the count at which `count` passes `floor` on (at no count if it never
    /// does): a dispatch over the rows from `floor` on runs once there are such rows.
    pub(crate) fn once_above(self, count: LiveCount, floor: u32) -> Self {
        match count.first_above(floor) {
            Some(first) => self.only_for(first..=u32::MAX),
            // An empty range: no count.
            None => self.only_for(RangeInclusive::new(1, 0)),
        }
    }

    /// Runs only at counts in `counts`.
    pub(crate) fn only_for(mut self, counts: RangeInclusive<u32>) -> Self {
        let (from, to) = (*self.runs_for.start().max(counts.start()), *self.runs_for.end().min(counts.end()));
        self.runs_for = from..=to;
        self
    }

    /// Whether the dispatch runs at `tokens`.
    pub(crate) fn runs_at(&self, tokens: u32) -> bool {
        self.runs_for.contains(&tokens)
    }

    /// The grid at `tokens` of a dispatch planned with `planned` at the maximum, spilled past
    /// `max_groups` as `size_plan` spills it; None where it does not run at `tokens`.
    pub(crate) fn grid_at(&self, tokens: u32, planned: [u32; 3], max_groups: u32) -> Option<[u32; 3]> {
        if !self.runs_at(tokens) {
            return None;
        }
        // Values at counts up to the maximum fit in u32, and their spilled grids in the
        // device's limits (plan_sizing checked the maximum).
        match self.grid {
            LiveGrid::Fixed => Some(planned),
            LiveGrid::X(v) => Some([u32::try_from(v.at(tokens)).unwrap_or(u32::MAX), planned[1], planned[2]]),
            LiveGrid::Spilled(v) => spill(v.at(tokens), max_groups),
        }
    }

    /// How the grid follows the count.
    pub(crate) fn grid(&self) -> LiveGrid {
        self.grid
    }

    /// The words of the parameters that are functions of the count: `(word index, value)`.
    pub(crate) fn words(&self) -> &[(u32, LiveValue)] {
        &self.words
    }

    /// The counts at which the dispatch runs.
    pub(crate) fn runs_for(&self) -> &RangeInclusive<u32> {
        &self.runs_for
    }

    /// Whether the dispatch runs its planned grid at every count (no indirect grid).
    pub(crate) fn grid_is_fixed(&self) -> bool {
        self.grid == LiveGrid::Fixed && self.runs_for == (0..=u32::MAX)
    }
}

/// `groups` workgroups as a grid spilled into y past `max` per dimension (x fastest), as
/// `size_plan` spills them on the device; (0, 1, 1) for none; None where y passes `max` too.
pub(crate) fn spill(groups: u64, max: u32) -> Option<[u32; 3]> {
    if groups == 0 {
        return Some([0, 1, 1]);
    }
    let x = groups.min(u64::from(max.max(1)));
    let y = u32::try_from(groups.div_ceil(x)).ok().filter(|&y| y <= max)?;
    // x <= max, a u32.
    Some([x as u32, y, 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values `size_plan` computes, on the host: affine counts, floors, caps, rounding up.
    #[test]
    fn live_values_follow_the_count() {
        let entries = LiveCount::tokens().times(4);
        assert_eq!(entries.at(7), 28);
        assert_eq!(entries.div_ceil(256).at(64), 1);
        assert_eq!(entries.div_ceil(256).at(65), 2);
        // Padded rows of a layout (E = 8, tile 16) in tiles.
        assert_eq!(entries.plus(8 * 15).div_ceil(16).at(3), (12 + 120u64).div_ceil(16));
        // The part of the rows in a window of 64 rows from row 128, in blocks of 16.
        let window = entries.beyond(128, 16).at_most(4);
        assert_eq!([1, 32, 33, 36, 40, 48, 100].map(|t| window.at(t)), [0, 0, 1, 1, 2, 4, 4]);
        assert_eq!(LiveValue::constant(9).at(1000), 9);
    }

    #[test]
    fn a_window_runs_once_the_count_reaches_it() {
        let rows = LiveCount::tokens().times(4);
        assert_eq!(rows.first_above(128), Some(33));
        assert_eq!(rows.first_above(0), Some(1));
        assert_eq!(LiveCount::constant(5).first_above(4), Some(0));
        assert_eq!(LiveCount::constant(5).first_above(5), None);
        let s = Sizing::new(LiveGrid::Fixed).once_above(rows, 128);
        assert!(!s.runs_at(32) && s.runs_at(33) && s.runs_at(u32::MAX));
        let never = Sizing::new(LiveGrid::Fixed).once_above(LiveCount::constant(5), 5);
        assert!(!never.runs_at(0) && !never.runs_at(5) && !never.runs_at(u32::MAX));
        let narrowed = Sizing::new(LiveGrid::Fixed).only_for(0..=3).only_for(2..=9);
        assert_eq!((1..=5).filter(|&t| narrowed.runs_at(t)).collect::<Vec<_>>(), [2, 3]);
    }

    /// Grids on the host as `size_plan` writes them on the device: a 1-D grid spills into y past
    /// the per-dimension limit, none is (0, 1, 1), and a dispatch that does not run has none.
    #[test]
    fn host_grids_spill_as_the_device_grids_do() {
        let spilled = Sizing::new(LiveGrid::Spilled(LiveCount::tokens().times(3).value()));
        assert_eq!(spilled.grid_at(10, [0; 3], 65535), Some([30, 1, 1]));
        assert_eq!(spilled.grid_at(30000, [0; 3], 65535), Some([65535, 2, 1]));
        assert_eq!(spilled.grid_at(0, [0; 3], 65535), Some([0, 1, 1]));
        let x = Sizing::new(LiveGrid::X(LiveCount::tokens().div_ceil(16))).only_for(1..=100);
        assert_eq!(x.grid_at(17, [7, 5, 1], 65535), Some([2, 5, 1]));
        assert_eq!(x.grid_at(101, [7, 5, 1], 65535), None);
        assert_eq!(Sizing::new(LiveGrid::Fixed).grid_at(3, [7, 5, 1], 65535), Some([7, 5, 1]));
    }
}
