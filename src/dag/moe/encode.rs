//! The program words: the header, then every task's entry and needs, as
//! `wgsl/dag/moe.wgsl` reads them.

use super::super::program::to_u32;
use super::header::{HEADER_WORDS, Header};
use super::tasks::{MoeTasks, RUN_TIME_NEED, TaskEntry, TaskKind, TaskSize};
use crate::error::{Error, Result};

/// The program words: `header`, the selection bias and the shared gate's values (`bias`, `gate`:
/// f32 bits, each may be empty), then the task table (kind, index, dependencies, first consumer
/// word, consumer count) in ticket order, then the consumer lists.
pub(super) fn encode(
    header: &mut Header,
    t: &MoeTasks,
    bias: &[u32],
    gate: &[u32],
    stall: Option<u32>,
) -> Result<Vec<u32>> {
    let (up_tiles, down_tiles, shared_tiles) = (header.up_tiles, header.down_tiles, header.shared_up_tiles);
    // A routed expert task's listed consumers, and what a combine tile waits for from the
    // `n` routed expert tasks: all of them by the list (rule 0), or RUN_TIME_NEED (rule 1:
    // signal_more in wgsl/dag/moe.wgsl).
    let own_entries = header.combine_rule == 1;
    let combiners =
        |combine0: u32| if own_entries { Vec::new() } else { (combine0..combine0 + t.combine).collect() };
    let routed_need = |n: u32| if own_entries { RUN_TIME_NEED } else { n };
    let mut table: Vec<TaskEntry> = Vec::new();
    let mut push = |kind, index, need, consumers| table.push(TaskEntry::new(kind, index, need, consumers));
    let layout0 = t.route;
    for r in 0..t.route {
        push(TaskKind::Route, r, 0, vec![layout0]);
    }
    match t.size {
        // Ticket order: route, layout, shared gate/up, gate/up, shared down, down, combine.
        TaskSize::Fine => {
            let shared_up0 = layout0 + t.layout;
            let up0 = shared_up0 + t.shared_up;
            let shared_down0 = up0 + t.up;
            let down0 = shared_down0 + t.shared_down;
            let combine0 = down0 + t.down;
            push(TaskKind::Layout, 0, t.route, (up0..up0 + t.up).collect());
            for i in 0..t.shared_up {
                let first = shared_down0 + i / shared_tiles * down_tiles;
                push(TaskKind::SharedUp, i, 0, (first..first + down_tiles).collect());
            }
            for i in 0..t.up {
                let first = down0 + i / up_tiles * down_tiles;
                push(TaskKind::Up, i, 1, (first..first + down_tiles).collect());
            }
            for i in 0..t.shared_down {
                push(TaskKind::SharedDown, i, shared_tiles, vec![combine0 + i / down_tiles]);
            }
            for i in 0..t.down {
                push(TaskKind::Down, i, up_tiles, combiners(combine0));
            }
            header.combine_first = combine0;
            let shared_need = if t.shared_down > 0 { down_tiles } else { 0 };
            for c in 0..t.combine {
                push(TaskKind::Combine, c, routed_need(t.down) + shared_need, Vec::new());
            }
        }
        // Ticket order: route, layout, shared tiles, expert tiles, combine.
        TaskSize::Coarse => {
            let shared0 = layout0 + t.layout;
            let expert0 = shared0 + t.shared;
            let combine0 = expert0 + t.expert;
            push(TaskKind::Layout, 0, t.route, (expert0..expert0 + t.expert).collect());
            for i in 0..t.shared {
                push(TaskKind::Shared, i, 0, vec![combine0 + i]);
            }
            for s in 0..t.expert {
                push(TaskKind::Expert, s, 1, combiners(combine0));
            }
            header.combine_first = combine0;
            for c in 0..t.combine {
                push(TaskKind::Combine, c, routed_need(t.expert) + u32::from(t.shared > 0), Vec::new());
            }
        }
    }
    // Every task waits for exactly the tasks that name it as a consumer.
    // (Rule 1's combine tiles: the listed signals are their shared tasks', past RUN_TIME_NEED.)
    let mut producers = vec![0u32; table.len()];
    for task in &table {
        for &c in &task.consumers {
            producers[c as usize] += 1;
        }
    }
    let listed = |task: &TaskEntry| match task.kind {
        TaskKind::Combine if own_entries => task.need - RUN_TIME_NEED,
        _ => task.need,
    };
    if let Some(i) = (0..table.len()).find(|&i| producers[i] != listed(&table[i])) {
        return Err(Error::invalid(format!(
            "MoE program task {i} waits for {} listed tasks but {} signal it (a moeflow bug)",
            listed(&table[i]),
            producers[i]
        )));
    }
    header.tasks = to_u32("tasks", table.len())?;
    let bias_len = to_u32("bias values", bias.len())?;
    if !bias.is_empty() {
        header.bias = HEADER_WORDS;
    }
    if !gate.is_empty() {
        header.shared_gate = HEADER_WORDS + bias_len;
    }
    header.task_off = HEADER_WORDS + bias_len + to_u32("shared gate values", gate.len())?;
    let mut words: Vec<u32> = bytemuck::cast_slice(&[*header]).to_vec();
    words.extend(bias);
    words.extend(gate);
    let cons_start = u64::from(header.task_off) + 5 * table.len() as u64;
    let mut cons: Vec<u32> = Vec::new();
    for (i, task) in table.iter().enumerate() {
        let stalled = stall.is_some_and(|s| s as usize == i);
        let first = cons_start + cons.len() as u64;
        words.extend([
            task.kind as u32,
            task.index,
            task.need + u32::from(stalled),
            to_u32("program words", usize::try_from(first).unwrap_or(usize::MAX))?,
            to_u32("consumers", task.consumers.len())?,
        ]);
        cons.extend(&task.consumers);
    }
    words.extend(cons);
    Ok(words)
}
