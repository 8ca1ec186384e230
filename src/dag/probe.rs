//! The per-adapter probe that gates the persistent queue: a cross-workgroup
//! message-passing litmus test under stress, and progress runs of the real queue at growing
//! worker counts. The verdict is cached per adapter and driver for the life of the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytemuck::{Pod, Zeroable};
use serde::{Deserialize, Serialize};

use super::chain::RowGraph;
use super::executor::Executor;
use super::program::RowInputs;
use super::queue::{Granularity, QueueOptions};
use super::run::RowRun;
use crate::bits::bit_identical;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::{Access, Binding, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};
use crate::sync::lock;
use crate::synth::Synth;
use crate::tensor::word_bytes;

static MP_SHADER: ShaderSource = ShaderSource {
    name: "probe/message_passing",
    parts: &[wgsl!("probe/message_passing.wgsl")],
    entry_points: &["message_passing"],
    indexing: Indexing::Checked,
};

/// The probe's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&MP_SHADER];

static MESSAGE_PASSING: KernelSpec = KernelSpec {
    shader: &MP_SHADER,
    entry: "message_passing",
    bindings: &[(0, Access::Uniform), (1, Access::ReadWrite), (2, Access::ReadWrite), (3, Access::ReadWrite)],
    params_bytes: std::mem::size_of::<MpParams>() as u64,
    workgroup: Workgroup::Fixed(64),
};

/// The probe's kernel (for the contract test, `src/contract.rs`).
#[cfg(test)]
pub(crate) static SPECS: &[&KernelSpec] = &[&MESSAGE_PASSING];

/// Worker counts the progress test tries, in order; the bound is the last that passes.
pub(crate) const WORKER_LADDER: &[u32] = &[1, 4, 8, 20, 32, 64, 128, 256];

const MP_PAIRS: u32 = 128;
const MP_STRESSORS: u32 = 64;
/// Words per message: coprime with the shader's stride 37.
const MP_WORDS: u32 = 1000;
const MP_ROUNDS: u32 = 12;
const PROBE_SPIN_LIMIT: u32 = 1 << 22;
/// Tries per worker count before an incomplete progress run ends the ladder.
const PROGRESS_TRIES: usize = 3;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MpParams {
    pairs: u32,
    words: u32,
    round: u32,
    spin_limit: u32,
}

/// The message-passing litmus test's counts over all rounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MessagePassing {
    /// Rounds run.
    pub rounds: u32,
    /// Writer/reader pairs per round.
    pub pairs: u32,
    /// Workgroups per round that only load and store other memory, as stress.
    pub stressors: u32,
    /// Words per message.
    pub words: u32,
    /// Messages whose flag the reader saw.
    pub observed: u32,
    /// Words read stale after the flag was seen (must be 0).
    pub violations: u32,
    /// Readers whose bounded wait ended without the flag.
    pub timeouts: u32,
}

/// One progress run of the queue at `workers` workers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Worker workgroups.
    pub workers: u32,
    /// Tasks in the run.
    pub tasks: u32,
    /// Whether every task completed without a timeout.
    pub complete: bool,
    /// Whether the outputs matched the staged executor bit for bit.
    pub bitwise: bool,
    /// Most polls one wait took.
    pub max_spins: u32,
}

/// Whether the queue may run on an adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeVerdict {
    /// Allowed with at most this many workers.
    Allowed {
        /// Largest worker count that passed.
        max_workers: u32,
    },
    /// Not allowed; static executors only.
    Refused {
        /// What failed.
        reason: String,
    },
}

/// The probe's results for one adapter and driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeReport {
    /// Adapter name.
    pub adapter: String,
    /// Backend.
    pub backend: String,
    /// Driver and version.
    pub driver: String,
    /// Litmus test counts.
    pub message_passing: MessagePassing,
    /// Progress runs, in ladder order (a retried count appears twice), up to the first failure.
    pub progress: Vec<Progress>,
    /// The verdict.
    pub verdict: ProbeVerdict,
}

impl ProbeReport {
    /// The worker bound, or why the queue is refused.
    ///
    /// # Errors
    /// The probe's reason for refusing the queue on this adapter.
    pub fn max_workers(&self) -> std::result::Result<u32, String> {
        match &self.verdict {
            ProbeVerdict::Allowed { max_workers } => Ok(*max_workers),
            ProbeVerdict::Refused { reason } => Err(reason.clone()),
        }
    }

    /// The gate a queue of `workers` workers passes on this adapter: `Ok(None)` to run it,
    /// `Ok(Some(why))` to run static passes instead (the probe refused the queue).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for more workers than the probe's bound.
    pub(crate) fn gate(&self, workers: u32) -> Result<Option<String>> {
        match self.max_workers() {
            Err(reason) => Ok(Some(format!("the adapter's probe refused the queue: {reason}"))),
            Ok(max) if workers > max => Err(Error::limit(
                "queue workers",
                workers.into(),
                max.into(),
                "the adapter probe's worker bound",
            )),
            Ok(_) => Ok(None),
        }
    }
}

/// What a probe verdict holds for: one adapter and driver.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ProbeKey {
    backend: String,
    name: String,
    driver: String,
    driver_info: String,
    vendor: u32,
    device: u32,
}

impl ProbeKey {
    fn of(ctx: &Context) -> Self {
        let a = ctx.adapter();
        ProbeKey {
            backend: a.backend.clone(),
            name: a.name.clone(),
            driver: a.driver.clone(),
            driver_info: a.driver_info.clone(),
            vendor: a.vendor,
            device: a.device,
        }
    }
}

fn cache() -> &'static Mutex<HashMap<ProbeKey, Arc<ProbeReport>>> {
    static CACHE: OnceLock<Mutex<HashMap<ProbeKey, Arc<ProbeReport>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The probe verdict for `ctx`'s adapter: run once per adapter and driver in this process,
/// then served from the cache.
///
/// # Errors
/// As [`run_probe`].
pub fn probe(ctx: &Context) -> Result<Arc<ProbeReport>> {
    let key = ProbeKey::of(ctx);
    if let Some(r) = lock(cache()).get(&key) {
        return Ok(r.clone());
    }
    let report = Arc::new(run_probe(ctx)?);
    lock(cache()).insert(key, report.clone());
    Ok(report)
}

/// Runs the probe now, bypassing the cache.
///
/// # Errors
/// A device error while the probe's kernels run or are read back.
pub fn run_probe(ctx: &Context) -> Result<ProbeReport> {
    let a = ctx.adapter();
    let mp = message_passing(ctx)?;
    let mut progress = Vec::new();
    let mut verdict = if mp.violations > 0 {
        Some(format!("message passing: {} stale words after the flag", mp.violations))
    } else if mp.timeouts > 0 {
        Some(format!("message passing: {} readers never saw a started writer's flag", mp.timeouts))
    } else if mp.observed == 0 {
        Some("message passing: no message observed".to_string())
    } else {
        None
    };
    let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
    let mut max_workers = 0;
    if verdict.is_none() {
        'ladder: for &w in WORKER_LADDER.iter().filter(|&&w| w <= max_groups) {
            // An incomplete run (a bounded wait gave up, or the driver cut a loop short) is
            // caught at run time and depends on load, so it gets two more tries; a complete run
            // with wrong bits is silent corruption and refuses the queue outright.
            for _ in 0..PROGRESS_TRIES {
                let p = progress_run(ctx, w)?;
                let (complete, bitwise) = (p.complete, p.bitwise);
                progress.push(p);
                if complete && !bitwise {
                    verdict = Some(format!("progress: {w} workers completed with wrong results"));
                    break 'ladder;
                }
                if complete {
                    max_workers = w;
                    continue 'ladder;
                }
            }
            break;
        }
        if verdict.is_none() && max_workers == 0 {
            verdict = Some("progress: the queue did not complete with one worker".to_string());
        }
    }
    Ok(ProbeReport {
        adapter: a.name.clone(),
        backend: a.backend.clone(),
        driver: format!("{} {}", a.driver, a.driver_info),
        message_passing: mp,
        progress,
        verdict: match verdict {
            None => ProbeVerdict::Allowed { max_workers },
            Some(reason) => ProbeVerdict::Refused { reason },
        },
    })
}

fn message_passing(ctx: &Context) -> Result<MessagePassing> {
    let kernel = ctx.kernel(&MESSAGE_PASSING, &[])?;
    let data = ctx.zeroed("litmus data", word_bytes(u64::from((MP_PAIRS + MP_STRESSORS) * MP_WORDS)))?;
    let flags = ctx.zeroed("litmus flags", word_bytes(u64::from(MP_PAIRS)))?;
    let results = ctx.zeroed("litmus results", 16)?;
    let mut out = MessagePassing {
        rounds: MP_ROUNDS,
        pairs: MP_PAIRS,
        stressors: MP_STRESSORS,
        words: MP_WORDS,
        observed: 0,
        violations: 0,
        timeouts: 0,
    };
    for round in 0..MP_ROUNDS {
        let u = ctx.uniform(
            "litmus params",
            &MpParams { pairs: MP_PAIRS, words: MP_WORDS, round, spin_limit: PROBE_SPIN_LIMIT },
        )?;
        let d = ctx.dispatch(
            &kernel,
            &[
                Binding::new(0, &u, MESSAGE_PASSING.params_bytes),
                Binding::new(1, &data, data.size()),
                Binding::new(2, &flags, flags.size()),
                Binding::new(3, &results, 16),
            ],
            [2 * MP_PAIRS + MP_STRESSORS, 1, 1],
        )?;
        let mut encoder = ctx.encoder("litmus");
        encoder.clear_buffer(&results, 0, None);
        crate::gpu::record(&mut encoder, &[&d]);
        ctx.submit_and_wait(encoder)?;
        let r: Vec<u32> = ctx.read_back(&results, 4)?;
        out.observed += r[0];
        out.violations += r[1];
        out.timeouts += r[2];
    }
    Ok(out)
}

/// The seed chain over `2 * workers` one-row tiles of 64 columns on the fine queue with
/// `workers` workers, against the staged executor.
fn progress_run(ctx: &Context, workers: u32) -> Result<Progress> {
    let graph = RowGraph::seed_chain(2 * workers, 64, u64::from(workers))?;
    let x = Synth::new(1).uniform(2 * workers as usize * 64, 1.0);
    let inputs = RowInputs::upload(ctx, &graph, &x)?;
    let staged = RowRun::prepare_unprobed(ctx, &graph, &inputs, Executor::Staged)?;
    staged.run(ctx)?;
    let opts = QueueOptions { spin_limit: PROBE_SPIN_LIMIT, ..QueueOptions::new(workers) };
    let queue = RowRun::prepare_unprobed(ctx, &graph, &inputs, Executor::Queue(Granularity::Fine, opts))?;
    ctx.run(&queue.dispatches().iter().collect::<Vec<_>>())?;
    let status = queue.queue_status(ctx)?;
    let (want, got) = (staged.read_all(ctx)?, queue.read_all(ctx)?);
    let bitwise = want.len() == got.len() && want.iter().zip(&got).all(|(a, b)| bit_identical(a, b));
    if status.tasks == 0 {
        return Err(Error::invalid("progress run prepared no tasks"));
    }
    Ok(Progress {
        workers,
        tasks: status.tasks,
        complete: status.complete(),
        bitwise,
        max_spins: status.max_spins,
    })
}
