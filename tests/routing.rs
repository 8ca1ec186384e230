//! Routing on every adapter: GPU vs the CPU reference, fused vs unfused bit identity on
//! adversarial inputs, the tie-break contract with hand-written expectations, and bad input.

mod common;

use common::{assert_close, bits, contexts, rng, side_by_side, uniform};
use moeflow::kernels::routing::{
    Gating, GroupLimit, RouteBuffers, RouteConfig, RouteMode, plan_route, route_host, topk_host,
};
use moeflow::reference::routing as reference;
use moeflow::{Context, Error};
use rand::Rng;

const FUSED: RouteMode = RouteMode::Fused { write_logits: true };

/// The three scoring variants every size runs with.
fn variants(hidden: u32, experts: u32, k: u32) -> Vec<(&'static str, RouteConfig)> {
    let plain = RouteConfig::new(hidden, experts, k);
    let deepseek =
        RouteConfig { gating: Gating::Sigmoid, bias: true, renormalize: true, scale: 2.5, ..plain };
    let n_group = (1..=8).rev().find(|n| experts.is_multiple_of(*n) && experts / n >= 2).unwrap_or(1);
    let gs = experts / n_group;
    let grouped = RouteConfig {
        groups: Some(GroupLimit { n_group, topk_group: k.div_ceil(gs).max(n_group / 2) }),
        ..deepseek
    };
    vec![("softmax", plain), ("sigmoid+bias+renorm", deepseek), ("sigmoid+bias+groups", grouped)]
}

#[test]
fn gpu_matches_reference_on_random_inputs() {
    for ctx in contexts() {
        let mut r = rng(7);
        let (mut bit_equal, mut total) = (0, 0);
        for (tokens, experts, k, hidden) in
            [(1, 8, 1, 37), (7, 60, 2, 64), (130, 256, 8, 96), (33, 384, 8, 21)]
        {
            for (name, cfg) in variants(hidden, experts, k) {
                let what = format!("{} {name} M={tokens} E={experts} k={k} H={hidden}", ctx.adapter().slug());
                let x = uniform(&mut r, (tokens * hidden) as usize, 1.0);
                let gate = uniform(&mut r, (experts * hidden) as usize, 0.5);
                let bias = cfg.bias.then(|| uniform(&mut r, experts as usize, 0.05));
                let got = route_host(&ctx, &cfg, &x, &gate, bias.as_deref(), RouteMode::Unfused).unwrap();
                let logits = reference::gate_logits(&x, &gate, hidden as usize);
                let gpu_logits = got.logits.as_ref().unwrap();
                bit_equal += assert_close(&format!("{what} logits"), gpu_logits, &logits);
                // Top-k judged on the GPU's own logits, so the matvec's rounding cannot move
                // a near-tie; and on the reference logits, which random data keeps far from ties.
                let (ref_idx, ref_w) = reference::topk(&cfg, gpu_logits, bias.as_deref());
                assert_eq!(got.indices, ref_idx, "{what}: indices");
                bit_equal += assert_close(&format!("{what} weights"), &got.weights, &ref_w);
                let (ref_idx2, _) = reference::topk(&cfg, &logits, bias.as_deref());
                assert_eq!(got.indices, ref_idx2, "{what}: indices vs reference logits");
                let alone = topk_host(&ctx, &cfg, gpu_logits, bias.as_deref()).unwrap();
                assert_eq!(alone.indices, got.indices, "{what}: top-k kernel alone");
                total += gpu_logits.len() + got.weights.len();
            }
        }
        eprintln!(
            "{}: {bit_equal}/{total} logits and weights bit-equal to the reference",
            ctx.adapter().slug()
        );
    }
}

/// Inputs built to stress selection: duplicate gate rows (exact ties), rows one ULP apart
/// (near-ties), zero and negative-zero rows, a NaN row, an infinite row, tokens that are all
/// zero (every logit equal), and one token holding an infinity.
fn adversarial(r: &mut impl Rng, tokens: u32, experts: u32, hidden: u32) -> (Vec<f32>, Vec<f32>) {
    let h = hidden as usize;
    let mut gate = uniform(r, (experts * hidden) as usize, 0.5);
    let e = experts as usize;
    for row in 0..e {
        let src = r.random_range(0..e);
        match row % 7 {
            0 | 1 if src != row => {
                let copy: Vec<f32> = gate[src * h..(src + 1) * h].to_vec();
                gate[row * h..(row + 1) * h].copy_from_slice(&copy);
            }
            2 if src != row => {
                let mut copy: Vec<f32> = gate[src * h..(src + 1) * h].to_vec();
                copy[0] = f32::from_bits(copy[0].to_bits() + 1);
                gate[row * h..(row + 1) * h].copy_from_slice(&copy);
            }
            3 => gate[row * h..(row + 1) * h].fill(if row % 2 == 0 { 0.0 } else { -0.0 }),
            _ => {}
        }
    }
    if e > 4 {
        gate[(e - 1) * h] = f32::NAN;
        gate[(e - 2) * h] = f32::INFINITY;
    }
    let mut x = uniform(r, (tokens * hidden) as usize, 1.0);
    for t in 0..tokens as usize {
        match t % 5 {
            1 => x[t * h..(t + 1) * h].fill(0.0),
            3 => x[t * h] = f32::NEG_INFINITY,
            _ => {}
        }
    }
    (x, gate)
}

fn adversarial_bias(r: &mut impl Rng, experts: u32) -> Vec<f32> {
    (0..experts)
        .map(|e| match e % 4 {
            0 => 0.0,
            1 => -0.0,
            2 => 0.25,
            _ => r.random_range(-0.1..0.1),
        })
        .collect()
}

/// Over `common::sweep`'s (adapter, E, k, tokens, routing variant) cases: every pair of those
/// settings meets on the adapters other than GL (every combination with
/// `MOEFLOW_FULL_SWEEPS=1`), and GL runs the first (the tie rule and the kernels' other
/// contracts run there in the tests that follow).
#[test]
fn fused_and_unfused_are_bit_identical_on_adversarial_inputs() {
    let ctxs = contexts();
    let sweep = common::sweep(&common::on_gl(&ctxs), &[4, 3, 4, 3]);
    side_by_side(&ctxs, |at, ctx| {
        let mut r = rng(11);
        let mut cases = 0;
        for case in sweep.iter().filter(|c| c[0] == at) {
            let experts = [8u32, 64, 256, 384][case[1]];
            let k = [1u32, 2, 8][case[2]];
            let tokens = [1u32, 2, 8, 1031][case[3]];
            let (name, cfg) = variants(16, experts, k).swap_remove(case[4]);
            let what = format!("{} {name} M={tokens} E={experts} k={k}", ctx.adapter().slug());
            let (x, gate) = adversarial(&mut r, tokens, experts, 16);
            let bias = cfg.bias.then(|| adversarial_bias(&mut r, experts));
            let a = route_host(ctx, &cfg, &x, &gate, bias.as_deref(), RouteMode::Unfused).unwrap();
            let b = route_host(ctx, &cfg, &x, &gate, bias.as_deref(), FUSED).unwrap();
            assert_eq!(a.indices, b.indices, "{what}: indices");
            assert_eq!(bits(&a.weights), bits(&b.weights), "{what}: weights");
            assert_eq!(bits(a.logits.as_ref().unwrap()), bits(b.logits.as_ref().unwrap()), "{what}: logits");
            let quiet =
                route_host(ctx, &cfg, &x, &gate, bias.as_deref(), RouteMode::Fused { write_logits: false })
                    .unwrap();
            assert_eq!(quiet.logits, None);
            assert_eq!(bits(&quiet.weights), bits(&b.weights), "{what}: fused without logits");
            for row in a.indices.chunks_exact(k as usize) {
                let mut seen = row.to_vec();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), k as usize, "{what}: an expert repeated in {row:?}");
                assert!(row.iter().all(|&e| e < experts), "{what}: index out of range in {row:?}");
            }
            cases += 1;
        }
        eprintln!("{}: {cases} adversarial cases bit-identical", ctx.adapter().slug());
    });
}

/// Routes single rows of given logits through both the top-k kernel and the fused kernel
/// (H = 1, x = 1, so each logit is exact; -0.0 arrives as +0.0, which the contract equates).
fn route_rows(
    ctx: &Context,
    cfg: &RouteConfig,
    logits: &[f32],
    bias: Option<&[f32]>,
) -> (Vec<u32>, Vec<f32>) {
    let alone = topk_host(ctx, cfg, logits, bias).unwrap();
    let cfg1 = RouteConfig { hidden: 1, ..*cfg };
    let fused = route_host(ctx, &cfg1, &[1.0], logits, bias, FUSED).unwrap();
    assert_eq!(alone.indices, fused.indices, "top-k kernel vs fused on {logits:?}");
    assert_eq!(bits(&alone.weights), bits(&fused.weights), "weights, top-k kernel vs fused on {logits:?}");
    let (ref_idx, _) = reference::topk(cfg, logits, bias);
    assert_eq!(alone.indices, ref_idx, "GPU vs reference on {logits:?}");
    (alone.indices, alone.weights)
}

#[test]
fn tie_break_contract_holds_as_documented() {
    let inf = f32::INFINITY;
    let cases: &[(&str, Vec<f32>, u32, Vec<u32>)] = &[
        ("all equal", vec![0.5; 10], 4, vec![0, 1, 2, 3]),
        ("exact tie straddling the k-th place", vec![1.0, 3.0, 2.0, 2.0, 2.0, 0.0], 3, vec![1, 2, 3]),
        ("-0.0 equals +0.0", vec![-1.0, 0.0, -0.0, -0.0], 2, vec![1, 2]),
        ("NaN ranks below -inf", vec![f32::NAN, -inf, -5.0, f32::NAN], 4, vec![2, 1, 0, 3]),
        ("+inf first", vec![3.0, inf, 2.0], 2, vec![1, 0]),
        ("all -inf: every expert once", vec![-inf; 5], 5, vec![0, 1, 2, 3, 4]),
    ];
    side_by_side(&contexts(), |_, ctx| {
        for (name, logits, k, want) in cases {
            for gating in [Gating::Softmax, Gating::Sigmoid] {
                let cfg = RouteConfig { gating, ..RouteConfig::new(1, logits.len() as u32, *k) };
                let (got, weights) = route_rows(ctx, &cfg, logits, None);
                assert_eq!(&got, want, "{}: {name} ({gating:?})", ctx.adapter().slug());
                let nan_chosen = got.iter().any(|&e| logits[e as usize].is_nan());
                if !nan_chosen {
                    assert!(weights.iter().all(|w| !w.is_nan()), "{name}: NaN weight {weights:?}");
                }
            }
        }
        // Softmax limits: one +inf takes all the weight; an all -inf row is uniform.
        let (_, w) = route_rows(ctx, &RouteConfig::new(1, 3, 1), &[3.0, inf, 2.0], None);
        assert_eq!(w, vec![1.0]);
        let (_, w) = route_rows(ctx, &RouteConfig::new(1, 4, 2), &[-inf; 4], None);
        assert_eq!(w, vec![0.25, 0.25]);
        // Bias selects, the unbiased score weighs; equal biased values go to the lower index.
        let cfg = RouteConfig { gating: Gating::Sigmoid, bias: true, ..RouteConfig::new(1, 4, 2) };
        let (idx, w) = route_rows(ctx, &cfg, &[0.0; 4], Some(&[0.0, 0.1, 0.1, -0.1]));
        assert_eq!(idx, vec![1, 2]);
        assert_eq!(w, vec![0.5, 0.5]);
        // A 1-ULP near-tie in the selection value (0.5 + one ULP of 0.5 is exact): the larger
        // value wins even though it has the higher index, and the exact tie behind it goes
        // to the lower index.
        let ulp = f32::from_bits(0.5f32.to_bits() + 1) - 0.5;
        let (idx, _) = route_rows(ctx, &cfg, &[0.0; 4], Some(&[0.0, 0.0, ulp, 0.0]));
        assert_eq!(idx, vec![2, 0]);
        // Groups: expert 0 scores highest alone, but group 1 (experts 2, 3) has the larger
        // top-2 sum, so with one kept group nothing outside experts 2 and 3 is chosen.
        let cfg = RouteConfig {
            gating: Gating::Sigmoid,
            groups: Some(GroupLimit { n_group: 4, topk_group: 1 }),
            ..RouteConfig::new(1, 8, 2)
        };
        let (idx, _) = route_rows(ctx, &cfg, &[5.0, -5.0, 3.0, 2.5, 0.0, 0.0, -1.0, 1.0], None);
        assert_eq!(idx, vec![2, 3]);
    });
}

/// Renormalisation flushes subnormal scores and partial sums to +0.0 explicitly, so adapters
/// that flush subnormals (SwiftShader) and adapters that keep them (Mesa) give the same
/// weights: all-subnormal chosen scores are 0/0 = NaN everywhere, and a subnormal next to a
/// normal score weighs exactly 0. (Subnormal logits go through the top-k kernel alone: the
/// fused kernel's matvec may itself flush them, which changes the selection, not the rule.)
#[test]
fn renormalisation_flushes_subnormals_on_every_adapter() {
    let tiny = f32::from_bits(1);
    let raw = |k| RouteConfig { gating: Gating::Raw, renormalize: true, ..RouteConfig::new(1, 3, k) };
    // 2^-125 - 1.5 * 2^-126 = 2^-127: two normal scores whose sum is subnormal, so it is +0.0
    // and the weights are ±inf.
    let (a, b) = (f32::from_bits(0x0100_0000), -f32::from_bits(0x00c0_0000));
    side_by_side(&contexts(), |_, ctx| {
        let slug = ctx.adapter().slug();
        let cfg = raw(2);
        let got = topk_host(ctx, &cfg, &[tiny, 0.0, f32::from_bits(3)], None).unwrap();
        assert_eq!(got.indices, vec![2, 0], "{slug}");
        assert!(got.weights.iter().all(|w| w.is_nan()), "{slug}: all-subnormal weights {:?}", got.weights);
        let got = topk_host(ctx, &cfg, &[tiny, 0.75, -0.0], None).unwrap();
        assert_eq!(got.indices, vec![1, 0], "{slug}");
        assert_eq!(bits(&got.weights), bits(&[1.0, 0.0]), "{slug}: normal next to subnormal");
        let (idx, w) = route_rows(ctx, &cfg, &[a, -1.0, b], None);
        assert_eq!(idx, vec![0, 2], "{slug}");
        assert_eq!(w, vec![f32::INFINITY, f32::NEG_INFINITY], "{slug}: cancelling sum");
        for row in [[tiny, 0.0, f32::from_bits(3)], [tiny, 0.75, -0.0], [a, -1.0, b]] {
            let (_, want) = reference::topk(&cfg, &row, None);
            let got = topk_host(ctx, &cfg, &row, None).unwrap();
            assert_eq!(bits(&got.weights), bits(&want), "{slug}: kernel vs reference on {row:?}");
        }
    });
}

fn expect_err(result: moeflow::Result<impl std::fmt::Debug>, needle: &str) {
    match result {
        Ok(v) => panic!("expected an error mentioning `{needle}`, got Ok({v:?})"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(needle), "error `{msg}` does not mention `{needle}`");
        }
    }
}

#[test]
fn bad_input_is_an_error_that_names_the_problem() {
    let base = RouteConfig::new(4, 8, 2);
    let with = |f: &dyn Fn(&mut RouteConfig)| {
        let mut c = base;
        f(&mut c);
        c.validate()
    };
    expect_err(with(&|c| c.k = 0), "k must be at least 1");
    expect_err(with(&|c| c.k = 9), "larger than the number of experts");
    expect_err(with(&|c| c.experts = 0), "experts must be at least 1");
    expect_err(with(&|c| c.hidden = 0), "hidden size");
    expect_err(with(&|c| c.experts = 2048), "experts is 2048, past the limit of 1024");
    expect_err(
        with(&|c| {
            c.experts = 64;
            c.k = 33
        }),
        "k is 33, past the limit of 32",
    );
    expect_err(with(&|c| c.scale = f32::NAN), "scale must be finite");
    expect_err(with(&|c| c.groups = Some(GroupLimit { n_group: 3, topk_group: 1 })), "does not divide");
    expect_err(with(&|c| c.groups = Some(GroupLimit { n_group: 8, topk_group: 1 })), "at least 2");
    expect_err(with(&|c| c.groups = Some(GroupLimit { n_group: 4, topk_group: 5 })), "topk_group = 5");
    expect_err(
        with(&|c| {
            c.k = 4;
            c.groups = Some(GroupLimit { n_group: 4, topk_group: 1 })
        }),
        "only 2 experts are in the 1 kept groups",
    );
    for ctx in contexts() {
        expect_err(route_host(&ctx, &base, &[0.0; 7], &[0.0; 32], None, FUSED), "`x`");
        expect_err(route_host(&ctx, &base, &[0.0; 8], &[0.0; 31], None, FUSED), "`gate`");
        expect_err(route_host(&ctx, &base, &[0.0; 8], &[0.0; 32], Some(&[0.0; 8]), FUSED), "bias = false");
        let biased = RouteConfig { bias: true, ..base };
        expect_err(route_host(&ctx, &biased, &[0.0; 8], &[0.0; 32], None, FUSED), "no bias buffer");
        expect_err(route_host(&ctx, &biased, &[0.0; 8], &[0.0; 32], Some(&[0.0; 3]), FUSED), "`bias`");
        expect_err(topk_host(&ctx, &base, &[0.0; 12], None), "`logits`");
        // A plan whose buffers are smaller than its shapes.
        let small = ctx.zeroed("small", 16).unwrap();
        let bufs = RouteBuffers {
            x: (&small).into(),
            gate: &small,
            bias: None,
            logits: None,
            indices: (&small).into(),
            weights: (&small).into(),
        };
        expect_err(plan_route(&ctx, &base, 3, &bufs, RouteMode::Unfused), "at least 48 bytes");
        expect_err(
            plan_route(
                &ctx,
                &base,
                1,
                &RouteBuffers { gate: &ctx.zeroed("g", 128).unwrap(), ..bufs },
                RouteMode::Unfused,
            ),
            "no logits buffer",
        );
        expect_err(plan_route(&ctx, &base, u32::MAX, &bufs, RouteMode::Unfused), "tokens * experts");
    }
}

#[test]
fn limits_of_an_app_owned_device_are_respected() {
    for adapter in common::wgpu_adapters() {
        let limits = wgpu::Limits {
            max_storage_buffer_binding_size: 1024,
            max_storage_buffers_per_shader_stage: 8,
            ..wgpu::Limits::downlevel_defaults()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("app device"),
            required_limits: limits,
            ..Default::default()
        }))
        .expect("device with small limits");
        let ctx = Context::from_wgpu(device, queue);
        assert_eq!(ctx.limits().max_storage_buffer_binding_size, 1024);
        assert!(!ctx.capabilities().timestamps, "an app device without TIMESTAMP_QUERY has no timestamps");
        let cfg = RouteConfig::new(64, 2, 1);
        // 8 tokens x 64 hidden x 4 bytes = 2048 bytes: past this device's binding limit.
        let err = route_host(&ctx, &cfg, &[0.5; 512], &[0.5; 128], None, FUSED).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
        assert!(err.to_string().contains("max_storage_buffer_binding_size"), "{err}");
        // Within the limits the same device routes normally.
        let ok = route_host(&ctx, &cfg, &[0.5; 128], &[0.5; 128], None, FUSED).unwrap();
        assert_eq!(ok.indices, vec![0, 0]);
    }
}
