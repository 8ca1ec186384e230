//! The planner: cuts a graph into passes (stages run back to back by one workgroup per
//! tile, halo rows recomputed where a stage reads a neighbour's rows of a stage in the same
//! pass), and the task list of a plan for the persistent queue.

use serde::Serialize;

use super::graph::{Graph, Reach, Source};

/// How far the planner fuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Fusion {
    /// One stage per pass.
    None,
    /// Merge consecutive stages while halo rows are recomputed only from rows that earlier
    /// passes wrote (one level of recomputation).
    Neighbours,
    /// Merge as much as possible, recomputing halos through any depth; a chain without
    /// whole-stage reads becomes one pass.
    Full,
}

/// One stage inside a pass: rows of the tile plus `extra` rows on each side are computed
/// (the extra rows go to scratch, for later steps of the same pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Stage index.
    pub stage: usize,
    /// Rows computed on each side of the tile for later steps.
    pub extra: u32,
}

/// Stages run back to back per tile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pass {
    /// Steps in order.
    pub steps: Vec<Step>,
}

/// A graph cut into passes, with the reason for every cut.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Fusion policy used.
    pub fusion: Fusion,
    /// Passes in order.
    pub passes: Vec<Pass>,
    /// Why each pass after the first starts where it does.
    pub cuts: Vec<String>,
}

/// One task of the queue: one pass over one tile, and the tasks it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// Pass index in the plan.
    pub pass: usize,
    /// Tile.
    pub tile: u32,
    /// Tasks (all with lower indices) that must be done first.
    pub deps: Vec<usize>,
}

fn halo(reach: Reach) -> u32 {
    match reach {
        Reach::Halo(h) => h,
        Reach::RowLocal | Reach::Whole => 0,
    }
}

/// Extra rows per step of a candidate pass, or why the pass cannot be formed.
fn extras<K>(graph: &Graph<K>, stages: &[usize], fusion: Fusion) -> Result<Vec<u32>, String> {
    let st = graph.stages();
    let mut extra = vec![0u32; stages.len()];
    for j in (0..stages.len()).rev() {
        for read in &st[stages[j]].reads {
            let Source::Stage(q) = read.source else { continue };
            let Some(i) = stages.iter().position(|&s| s == q) else { continue };
            if read.reach == Reach::Whole {
                return Err(format!("`{}` reads all rows of `{}`", st[stages[j]].name, st[q].name));
            }
            extra[i] = extra[i].max(extra[j] + halo(read.reach));
        }
    }
    if fusion == Fusion::Neighbours {
        for (j, &s) in stages.iter().enumerate() {
            let inside = st[s].reads.iter().find_map(|r| match r.source {
                Source::Stage(q) if stages.contains(&q) => Some(q),
                _ => None,
            });
            if let (true, Some(q)) = (extra[j] > 0, inside) {
                return Err(format!(
                    "`{}` would recompute halo rows from `{}` rows this pass recomputes too",
                    st[s].name, st[q].name
                ));
            }
        }
    }
    Ok(extra)
}

fn pass_of(stages: &[usize], extra: Vec<u32>) -> Pass {
    Pass { steps: stages.iter().zip(extra).map(|(&stage, extra)| Step { stage, extra }).collect() }
}

/// Cuts `graph` into passes greedily: each stage joins the current pass unless the pass
/// would break the policy (or a stage reads a stage of the pass whole).
pub fn plan<K>(graph: &Graph<K>, fusion: Fusion) -> Plan {
    let mut passes = Vec::new();
    let mut cuts = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for s in 0..graph.stages().len() {
        let mut candidate = current.clone();
        candidate.push(s);
        let verdict = match fusion {
            Fusion::None if !current.is_empty() => Err("one stage per pass".to_string()),
            _ => extras(graph, &candidate, fusion),
        };
        match verdict {
            Ok(_) => current = candidate,
            Err(reason) => {
                let extra = extras(graph, &current, fusion).unwrap_or_else(|_| vec![0; current.len()]);
                passes.push(pass_of(&current, extra));
                cuts.push(format!("before `{}`: {reason}", graph.stages()[s].name));
                current = vec![s];
            }
        }
    }
    if !current.is_empty() {
        let extra = extras(graph, &current, fusion).unwrap_or_else(|_| vec![0; current.len()]);
        passes.push(pass_of(&current, extra));
    }
    Plan { fusion, passes, cuts }
}

impl Plan {
    /// Largest step count of any pass.
    pub(crate) fn max_steps(&self) -> usize {
        self.passes.iter().map(|p| p.steps.len()).max().unwrap_or(0)
    }

    /// Largest extra row count of any step.
    pub(crate) fn max_extra(&self) -> u32 {
        self.passes.iter().flat_map(|p| p.steps.iter().map(|s| s.extra)).max().unwrap_or(0)
    }

    /// Pass index of every stage.
    fn pass_of_stage(&self, stages: usize) -> Vec<usize> {
        let mut of = vec![0; stages];
        for (p, pass) in self.passes.iter().enumerate() {
            for step in &pass.steps {
                of[step.stage] = p;
            }
        }
        of
    }

    /// The plan's tasks for the queue, pass-major then tile: task `p * tiles + t` runs pass
    /// `p` on tile `t`. Every dependency has a lower index, so this is a topological order.
    pub fn tasks<K>(&self, graph: &Graph<K>) -> Vec<Task> {
        let tiles = graph.tiles();
        let of = self.pass_of_stage(graph.stages().len());
        let mut tasks = Vec::with_capacity(self.passes.len() * tiles as usize);
        for (p, pass) in self.passes.iter().enumerate() {
            for t in 0..tiles {
                let (lo, hi) = graph.tile_span(t);
                let mut deps = Vec::new();
                for step in &pass.steps {
                    let rows = (lo.saturating_sub(step.extra), (hi + step.extra).min(graph.rows()));
                    for read in &graph.stages()[step.stage].reads {
                        let Source::Stage(q) = read.source else { continue };
                        if of[q] == p {
                            continue;
                        }
                        let (first, last) = graph.tiles_of(graph.reach_rows(rows, read.reach));
                        deps.extend((first..=last).map(|u| of[q] * tiles as usize + u as usize));
                    }
                }
                deps.sort_unstable();
                deps.dedup();
                tasks.push(Task { pass: p, tile: t, deps });
            }
        }
        tasks
    }
}
