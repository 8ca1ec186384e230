//! Planning the sizing dispatches of a plan: each dispatch's rules gathered per parameter
//! buffer and grid, checked at the maximum count, and grouped into `size_plan` dispatches.

use super::specs::{GRIDS, KIND_SPILL, KIND_VALUE, MAX_RULES, Rule, Rules, SIZE_PLAN, TARGETS};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::live::{LiveGrid, LiveValue, Sizing};
use crate::pipeline::{Access, Binding, Dispatch, Indirect};
use crate::tensor::word_bytes;

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
        let (from, to) = (*sizing.runs_for().start(), *sizing.runs_for().end());
        let rule = |word: u32, kind: u32, v: LiveValue| -> Result<Rule> {
            // Past u32 at the maximum: the values' factors are past u32 too, as max_tokens >= 1.
            let top = v.count().at(max_tokens.max(1));
            if top > u64::from(u32::MAX) {
                return Err(Error::limit(
                    format!("a count of `{entry}` at {max_tokens} tokens"),
                    top,
                    u32::MAX.into(),
                    "u32 parameters",
                ));
            }
            let [per_token, base, floor, divisor, cap] = v.terms();
            Ok(Rule {
                target: 0,
                word,
                kind,
                per_token: per_token as u32,
                base: base as u32,
                // Floors and caps come from u32 values, divisors too.
                floor: floor as u32,
                divisor: divisor as u32,
                cap: cap as u32,
                from_tokens: from,
                to_tokens: to,
                pad: [0; 2],
            })
        };
        // The unit of the dispatch's parameters, where it sizes some of them.
        let mut unit = None;
        if !sizing.words().is_empty() {
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
            for &(word, v) in sizing.words() {
                if word_bytes(u64::from(word)) >= params.size {
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
        let (kind, v) = match sizing.grid() {
            // Its planned x at the counts it runs at.
            LiveGrid::Fixed => (KIND_VALUE, LiveValue::constant(planned[0])),
            LiveGrid::X(v) => (KIND_VALUE, v),
            LiveGrid::Spilled(v) => (KIND_SPILL, v),
        };
        let at_max = match kind {
            KIND_SPILL => ctx.grid(v.at(max_tokens), entry)?,
            _ => [u32::try_from(v.at(max_tokens)).unwrap_or(u32::MAX), planned[1], planned[2]],
        };
        if sizing.runs_for().contains(&max_tokens) && at_max != planned {
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
        indirect.push((index, word_bytes(u64::from(word))));
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
