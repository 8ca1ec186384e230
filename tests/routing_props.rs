//! Property test of routing against the CPU reference: random shapes, k, E, gating, bias,
//! groups, renormalisation and scale, over logits drawn from an adversarial palette (exact
//! ties, 1-ULP neighbours, ±0, subnormals, NaN, ±inf, the largest finites). Every case runs
//! the top-k kernel on every adapter: indices exactly, weights within `2e-5 + 2e-5·|ref|`.
//!
//! Without bias and groups the experts are chosen on the logits (integer keys), so ids are
//! exact on every input. With a bias or groups they are chosen on computed scores, which an
//! adapter may round one ULP differently from the CPU; those cases draw logits and biases
//! from coarse grids (exact ties stay, accidental near-ties are rare) and a case whose
//! reference decision hinges on a gap under 1e-5 is discarded rather than judged.
//!
//! 3,000 cases in all (split evenly over the adapters found; 10,000 with
//! `MOEFLOW_FULL_SWEEPS=1`), with a fixed seed so CI runs the same cases every time. Gating,
//! renormalisation, bias and groups are pipeline constants (24 pipelines per adapter): each
//! adapter draws from its part of a covering set of them (every pair of settings, adapter
//! included, meets; all 24 on every adapter with `MOEFLOW_FULL_SWEEPS=1`).

mod common;

use moeflow::Context;
use moeflow::kernels::routing::{Gating, GroupLimit, RouteConfig, topk_host};
use moeflow::reference::routing::{self as reference, order_key};
use moeflow::reference::within;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

/// Cases in all: a quick run's, and the full sweep's (`MOEFLOW_FULL_SWEEPS=1`).
const TOTAL_CASES: [u32; 2] = [3_000, 10_000];

#[derive(Clone, Debug)]
struct Case {
    cfg: RouteConfig,
    logits: Vec<f32>,
    bias: Option<Vec<f32>>,
}

fn special(i: u8) -> f32 {
    let one = 1.0f32;
    match i % 16 {
        0 => f32::NEG_INFINITY,
        1 => f32::INFINITY,
        2 => f32::NAN,
        3 => -0.0,
        4 => 0.0,
        5 => one,
        6 => f32::from_bits(one.to_bits() + 1),
        7 => f32::from_bits(one.to_bits() - 1),
        8 => f32::from_bits(1),
        9 => f32::from_bits(2),
        10 => -f32::from_bits(1),
        11 => f32::MAX,
        12 => -f32::MAX,
        13 => 3.5,
        14 => -3.5,
        _ => 1e-30,
    }
}

/// A logit for unbiased cases: mostly specials and their neighbours, some plain values.
fn free_logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => any::<u8>().prop_map(special),
        2 => -8.0f32..8.0,
        1 => (0u32..4).prop_map(|d| f32::from_bits(0x3f80_0000 + d)),
    ]
}

/// A logit for biased or grouped cases: quarter steps, ±0, ±inf, NaN.
fn grid_logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => (-24i32..=24).prop_map(|q| q as f32 * 0.25),
        1 => Just(-0.0f32),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::NAN),
    ]
}

/// The kernel's specialisations a case may draw, as (gating, renormalise, bias, groups)
/// indices: each is a pipeline of its own, compiled anew (most of a cold run's time).
type Specialisation = [usize; 4];

fn case(specialisations: Vec<Specialisation>) -> impl Strategy<Value = Case> {
    let shape = prop_oneof![6 => 1u32..=40, 1 => 41u32..=300];
    (shape, 1u32..=4, prop::sample::select(specialisations), prop::sample::select(vec![1.0f32, 2.5, -0.5]))
        .prop_flat_map(|(experts, tokens, [gating, renormalize, with_bias, grouped], scale)| {
            let gating = [Gating::Softmax, Gating::Sigmoid, Gating::Raw][gating];
            let (renormalize, with_bias, grouped) = (renormalize == 1, with_bias == 1, grouped == 1);
            // Group counts that divide E into groups of at least two.
            let divisors: Vec<u32> =
                (2..=experts.min(64)).filter(|n| experts % n == 0 && experts / n >= 2).collect();
            let groups = if grouped && !divisors.is_empty() {
                prop::sample::select(divisors).prop_flat_map(|n| (Just(n), 1..=n)).prop_map(Some).boxed()
            } else {
                Just(None).boxed()
            };
            (Just((experts, tokens, gating, renormalize, with_bias, scale)), groups)
        })
        .prop_flat_map(|((experts, tokens, gating, renormalize, with_bias, scale), groups)| {
            let groups = groups.map(|(n_group, topk_group)| GroupLimit { n_group, topk_group });
            let reachable = groups.map_or(experts, |g| g.topk_group * (experts / g.n_group));
            let k = 1..=reachable.min(10);
            let n = (experts * tokens) as usize;
            let coarse = with_bias || groups.is_some();
            let logits = if coarse {
                prop::collection::vec(grid_logit(), n).boxed()
            } else {
                prop::collection::vec(free_logit(), n).boxed()
            };
            let bias = if with_bias {
                prop::collection::vec((-8i32..=8).prop_map(|q| q as f32 / 32.0), experts as usize)
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            (k, logits, bias).prop_map(move |(k, logits, bias)| Case {
                cfg: RouteConfig {
                    hidden: 1,
                    experts,
                    k,
                    gating,
                    renormalize,
                    scale,
                    bias: bias.is_some(),
                    groups,
                    router_bias: false,
                },
                logits,
                bias,
            })
        })
}

/// Whether the reference's choice for a row rests on a gap under 1e-5 between two different
/// computed values (selection values, or group sums), which one ULP of rounding could flip.
fn hinges_on_a_near_tie(cfg: &RouteConfig, row: &[f32], bias: Option<&[f32]>) -> bool {
    if bias.is_none() && cfg.groups.is_none() {
        return false;
    }
    let scores = reference::scores(cfg.gating, row);
    let sel: Vec<f32> = match bias {
        Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => scores,
    };
    let near = |values: &[f32]| {
        let mut v: Vec<f32> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v.windows(2).any(|w| w[0] != w[1] && (w[1] - w[0]) <= 1e-5 * w[1].abs().max(w[0].abs()).max(1e-30))
    };
    if near(&sel) {
        return true;
    }
    if let Some(g) = cfg.groups {
        let gs = (cfg.experts / g.n_group) as usize;
        let sums: Vec<f32> = sel
            .chunks(gs)
            .map(|grp| {
                let mut v: Vec<(u32, usize)> =
                    grp.iter().enumerate().map(|(i, &x)| (order_key(x), i)).collect();
                v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                grp[v[0].1] + grp[v[1].1]
            })
            .collect();
        return near(&sums);
    }
    false
}

fn check(ctx: &Context, case: &Case) -> Result<(), TestCaseError> {
    let cfg = &case.cfg;
    let e = cfg.experts as usize;
    let bias = case.bias.as_deref();
    prop_assume!(!case.logits.chunks(e).any(|row| hinges_on_a_near_tie(cfg, row, bias)));
    let got = topk_host(ctx, cfg, &case.logits, bias).map_err(|err| TestCaseError::fail(err.to_string()))?;
    let (want_idx, want_w) = reference::topk(cfg, &case.logits, bias);
    prop_assert_eq!(&got.indices, &want_idx, "indices on {}", ctx.adapter().slug());
    for (i, (g, w)) in got.weights.iter().zip(&want_w).enumerate() {
        prop_assert!(
            within(*g, *w),
            "weight {} on {}: {:e} vs reference {:e}",
            i,
            ctx.adapter().slug(),
            g,
            w
        );
    }
    Ok(())
}

#[test]
fn routing_matches_the_reference_on_random_adversarial_cases() {
    let ctxs = common::contexts();
    if ctxs.is_empty() {
        return;
    }
    let per_adapter = TOTAL_CASES[usize::from(common::full_sweeps())].div_ceil(ctxs.len() as u32);
    // (adapter, gating, renormalise, bias, groups): a covering set (every combination under
    // MOEFLOW_FULL_SWEEPS=1), so each specialisation runs on each adapter and every pair of
    // settings meets.
    let cases = common::covering(&[ctxs.len(), 3, 2, 2, 2]);
    common::side_by_side(&ctxs, |i, ctx| {
        let here: Vec<Specialisation> =
            cases.iter().filter(|c| c[0] == i).map(|c| [c[1], c[2], c[3], c[4]]).collect();
        let config = Config {
            cases: per_adapter,
            rng_seed: RngSeed::Fixed(2026 + i as u64),
            failure_persistence: None,
            max_global_rejects: per_adapter,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        let started = std::time::Instant::now();
        runner
            .run(&case(here.clone()), |c| check(ctx, &c))
            .unwrap_or_else(|e| panic!("{}: {e}", ctx.adapter().slug()));
        eprintln!(
            "{}: {per_adapter} routing cases over {} specialisations in {:.1} s",
            ctx.adapter().slug(),
            here.len(),
            started.elapsed().as_secs_f64()
        );
    });
}
