//! Sizing: a plan made for a maximum token count runs at a live count set per forward.
//!
//! Every dispatch of such a plan says how it follows the live count t ([`Sizing`]): which
//! words of its uniform parameters are functions of t, how many workgroups it runs at t, and
//! for which counts it runs at all. [`plan_sizing`] turns those rules into the plan's first
//! dispatches: one `size_plan` kernel per five parameter buffers (`wgsl/sizing/sizing.wgsl`)
//! reads t from the plan's live-count word and rewrites those words and the indirect grids of
//! the dispatches after it. The kernels themselves are unchanged: at live count t they read the
//! parameters and run the grids a plan made for exactly t would have, so their outputs are that
//! plan's bits (the layer tests prove it on every path).
//!
//! Every value is `min(ceil(max(per_token · t + base - floor, 0) / divisor), cap)`
//! ([`LiveValue`]), which covers the kernels' counts (tokens, entries `t · k`, blocks of
//! entries, padded rows and tiles of the dispatch layout, workgroups of any of these, and of
//! the part of them in one x window). The host checks at plan time that each value
//! at the maximum fits in u32; values grow with t, so none wraps below it.

use std::ops::RangeInclusive;

use bytemuck::{Pod, Zeroable};

use crate::context::Context;
use crate::context::spill;
use crate::error::{Error, Result};
use crate::pipeline::{Access, Binding, Dispatch, Indirect, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};

static SIZING_SHADER: ShaderSource = ShaderSource {
    name: "sizing/sizing",
    parts: &[wgsl!("sizing/sizing.wgsl")],
    entry_points: &["size_plan"],
    indexing: Indexing::Checked,
};

/// The sizing family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&SIZING_SHADER];

/// Parameter buffers one sizing dispatch rewrites (`TARGETS` in the WGSL).
const TARGETS: usize = 5;
/// Rules one sizing dispatch carries (`MAX_RULES` in the WGSL).
const MAX_RULES: usize = 64;
/// `Rule.kind`: one word.
const KIND_VALUE: u32 = 0;
/// `Rule.kind`: a 1-D grid spilled into y, two words.
const KIND_SPILL: u32 = 1;

use Access::{Read, ReadWrite, Uniform};
static SIZE_PLAN: KernelSpec = KernelSpec {
    shader: &SIZING_SHADER,
    entry: "size_plan",
    bindings: &[
        (0, Uniform),
        (1, Read),
        (2, ReadWrite),
        (3, ReadWrite),
        (4, ReadWrite),
        (5, ReadWrite),
        (6, ReadWrite),
        (7, ReadWrite),
    ],
    params_bytes: std::mem::size_of::<Rules>() as u64,
    workgroup: Workgroup::Fixed(64),
};
/// Every sizing kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] = &[&SIZE_PLAN];

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

    /// Whether the dispatch runs its planned grid at every count (no indirect grid).
    fn grid_is_fixed(&self) -> bool {
        self.grid == LiveGrid::Fixed && self.runs_for == (0..=u32::MAX)
    }
}

/// One rule of `size_plan` (`Rule` in the WGSL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
struct Rule {
    target: u32,
    word: u32,
    kind: u32,
    per_token: u32,
    base: u32,
    floor: u32,
    divisor: u32,
    cap: u32,
    from_tokens: u32,
    to_tokens: u32,
    pad: [u32; 2],
}

/// The uniform rules of one `size_plan` dispatch (`Rules` in the WGSL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct Rules {
    count: u32,
    max_groups: u32,
    max_tokens: u32,
    pad: u32,
    list: [Rule; MAX_RULES],
}

/// Target of the grid rules (`TARGETS` in the WGSL: past the parameter buffers).
const GRIDS: u32 = TARGETS as u32;

/// The sizing dispatches of a plan for up to `max_tokens` tokens whose live count is word 0 of
/// `live`, to run before `dispatches`; each of `dispatches` with a count-dependent grid is
/// switched to its indirect grid, which they write. Empty where nothing depends on the count.
///
/// # Errors
/// [`Error::InvalidArgument`] for a dispatch without [`Sizing`], a rule past its parameters,
/// two rules for one word that disagree, or a grid rule that disagrees at `max_tokens` with the
/// grid planned there (moeflow bugs, which the layer tests would catch); [`Error::LimitExceeded`]
/// for a value past u32 at `max_tokens`; device errors.
pub(crate) fn plan_sizing(
    ctx: &Context,
    live: &wgpu::Buffer,
    max_tokens: u32,
    dispatches: &mut [&mut Dispatch],
) -> Result<Vec<Dispatch>> {
    let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
    let mut units: Vec<Unit> = Vec::new();
    let mut grids: Vec<u32> = Vec::new();
    let mut indirect: Vec<(usize, u64)> = Vec::new();
    for (index, d) in dispatches.iter().enumerate() {
        let entry = d.entry();
        let sizing = d.sizing.as_ref().ok_or_else(|| {
            Error::invalid(format!("`{entry}` says nothing of how it follows the live count"))
        })?;
        let (from, to) = (*sizing.runs_for.start(), *sizing.runs_for.end());
        let rule = |word: u32, kind: u32, v: LiveValue| -> Result<Rule> {
            // Past u32 at the maximum: the values' factors are past u32 too, as max_tokens >= 1.
            let top = v.count.at(max_tokens.max(1));
            if top > u64::from(u32::MAX) {
                return Err(Error::limit(
                    format!("a count of `{entry}` at {max_tokens} tokens"),
                    top,
                    u32::MAX.into(),
                    "u32 parameters",
                ));
            }
            Ok(Rule {
                target: 0,
                word,
                kind,
                per_token: v.count.per_token as u32,
                base: v.count.base as u32,
                // Floors and caps come from u32 values, divisors too.
                floor: v.floor as u32,
                divisor: v.divisor as u32,
                cap: v.cap as u32,
                from_tokens: from,
                to_tokens: to,
                pad: [0; 2],
            })
        };
        // The unit of the dispatch's parameters, where it sizes some of them.
        let mut unit = None;
        if !sizing.words.is_empty() {
            let params = d
                .bindings
                .iter()
                .find(|b| b.binding == 0 && b.access == Access::Uniform && b.offset == 0)
                .ok_or_else(|| Error::invalid(format!("`{entry}` has no whole parameter buffer to size")))?;
            let at = match units.iter().position(|u| u.buffer.as_ref() == Some(&params.buffer)) {
                Some(at) => at,
                None => {
                    units.push(Unit { buffer: Some(params.buffer.clone()), rules: Vec::new(), from, to });
                    units.len() - 1
                }
            };
            let u = &mut units[at];
            (u.from, u.to) = (u.from.min(from), u.to.max(to));
            for &(word, v) in &sizing.words {
                if u64::from(word) * 4 >= params.size {
                    return Err(Error::invalid(format!(
                        "`{entry}` sizes word {word} of {} bytes of parameters",
                        params.size
                    )));
                }
                // Parameters are the same at every count the dispatch runs at.
                let r = Rule { from_tokens: 0, to_tokens: u32::MAX, ..rule(word, KIND_VALUE, v)? };
                match u.rules.iter().find(|o| o.target != GRIDS && o.word == word) {
                    Some(o) if *o == r => {}
                    Some(_) => {
                        return Err(Error::invalid(format!(
                            "two dispatches size word {word} of `{entry}`'s parameters differently"
                        )));
                    }
                    None => u.rules.push(r),
                }
            }
            unit = Some(at);
        }
        if sizing.grid_is_fixed() {
            continue;
        }
        let word = u32::try_from(grids.len())
            .map_err(|_| Error::limit("sized grids", grids.len() as u64, u32::MAX.into(), "u32 words"))?;
        let planned = d.workgroups;
        let (kind, v) = match sizing.grid {
            // Its planned x at the counts it runs at.
            LiveGrid::Fixed => (KIND_VALUE, LiveValue::constant(planned[0])),
            LiveGrid::X(v) => (KIND_VALUE, v),
            LiveGrid::Spilled(v) => (KIND_SPILL, v),
        };
        let at_max = match kind {
            KIND_SPILL => ctx.grid(v.at(max_tokens), entry)?,
            _ => [u32::try_from(v.at(max_tokens)).unwrap_or(u32::MAX), planned[1], planned[2]],
        };
        if sizing.runs_for.contains(&max_tokens) && at_max != planned {
            return Err(Error::invalid(format!(
                "`{entry}` is sized to {at_max:?} workgroups at {max_tokens} tokens but planned with {planned:?}"
            )));
        }
        let r = Rule { target: GRIDS, ..rule(word, kind, v)? };
        match unit {
            Some(at) => units[at].rules.push(r),
            None => units.push(Unit { buffer: None, rules: vec![r], from, to }),
        }
        grids.extend(planned);
        indirect.push((index, u64::from(word) * 4));
    }
    if units.is_empty() {
        return Ok(Vec::new());
    }
    let grid_buffer = ctx.indirect_args("sized grids", &grids)?;
    for (index, offset) in indirect {
        dispatches[index].indirect = Some(Indirect { buffer: grid_buffer.clone(), offset, max_groups });
    }
    // Units in the order of the counts they serve, packed into sizing dispatches of up to
    // TARGETS parameter buffers and MAX_RULES rules: a forward recorded for a count on the host
    // runs only the sizing dispatches of the units that run at it (and those they share a
    // dispatch with), the decode path's apart from the grouped path's.
    units.sort_by_key(|u| (u.from, u.to));
    let mut groups: Vec<Group> = Vec::new();
    for u in units {
        if u.rules.len() > MAX_RULES {
            return Err(Error::invalid(format!("{} sizing rules for one parameter buffer", u.rules.len())));
        }
        let fits = groups.last().is_some_and(|g| {
            g.rules.len() + u.rules.len() <= MAX_RULES && (u.buffer.is_none() || g.buffers.len() < TARGETS)
        });
        if !fits {
            groups.push(Group { buffers: Vec::new(), rules: Vec::new(), from: u.from, to: u.to });
        }
        let last = groups.len() - 1;
        let g = &mut groups[last];
        (g.from, g.to) = (g.from.min(u.from), g.to.max(u.to));
        let target = g.buffers.len() as u32;
        g.rules.extend(u.rules.into_iter().map(|r| if r.target == GRIDS { r } else { Rule { target, ..r } }));
        g.buffers.extend(u.buffer);
    }
    let kernel = ctx.kernel(&SIZE_PLAN, &[])?;
    groups
        .into_iter()
        .map(|Group { buffers, rules: list, from, to }| {
            let mut rules = Rules {
                count: list.len() as u32,
                max_groups,
                max_tokens,
                pad: 0,
                list: [Rule::default(); MAX_RULES],
            };
            rules.list[..list.len()].copy_from_slice(&list);
            let rules = ctx.uniform("sizing rules", &rules)?;
            let unused: Vec<wgpu::Buffer> = (buffers.len()..TARGETS)
                .map(|_| ctx.storage_scratch("no sizing target", 4))
                .collect::<Result<_>>()?;
            let mut bindings = vec![
                Binding::new(0, &rules, SIZE_PLAN.params_bytes),
                Binding::new(1, live, 4),
                Binding::new(2, &grid_buffer, grid_buffer.size()),
            ];
            for (slot, b) in buffers.iter().chain(&unused).enumerate() {
                bindings.push(Binding::new(3 + slot as u32, b, b.size()));
            }
            let d = ctx.dispatch(&kernel, &bindings, [1, 1, 1])?;
            Ok(d.sized(Sizing::new(LiveGrid::Fixed).only_for(from..=to)))
        })
        .collect()
}

/// The sizing rules of some dispatches of a plan: those of one parameter buffer and of the
/// grids of the dispatches that bind it, or (no buffer) one grid's, with the counts at which
/// those dispatches run (from .. to: the hull of theirs).
struct Unit {
    buffer: Option<wgpu::Buffer>,
    rules: Vec<Rule>,
    from: u32,
    to: u32,
}

/// The units one sizing dispatch serves: their parameter buffers (bound in order), their rules
/// and the hull of their counts.
struct Group {
    buffers: Vec<wgpu::Buffer>,
    rules: Vec<Rule>,
    from: u32,
    to: u32,
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
