//! The whole layer on every adapter: against the CPU reference layer, bit-identical across
//! fused/unfused routing and one-launch/sequential combine, in float and quantised weight
//! dtypes, and bad weights.

mod common;

use common::{assert_rows_close, bits, contexts, side_by_side};
use moeflow::host_experts::{HostBias, HostExperts, HostProjection};
use moeflow::kernels::combine::CombineMode;
use moeflow::kernels::dispatch::OverflowPolicy;
use moeflow::kernels::gemm::{
    Activation, ExpertBias, ExpertFfn, ExpertPlacement, ExpertWeights, GemmOrder, GemmVariant, TileBlock,
    WeightDtype,
};
use moeflow::kernels::routing::{Gating, GroupLimit, RouteConfig, RouteMode};
use moeflow::layer::{Capacity, KernelChoice, MoeConfig, MoeLayer, RouterWeights};
use moeflow::reference::layer as reference;
use moeflow::synth::{StoredExperts, Synth};

fn configs() -> Vec<(&'static str, MoeConfig)> {
    let mixtral = MoeConfig::new(48, 40, 8, 2);
    let deepseek = MoeConfig {
        route: RouteConfig {
            gating: Gating::Sigmoid,
            bias: true,
            scale: 2.5,
            groups: Some(GroupLimit { n_group: 4, topk_group: 2 }),
            ..MoeConfig::new(40, 20, 16, 4).route
        },
        shared_ffn: Some(24),
        weight_dtype: WeightDtype::Bf16,
        ..MoeConfig::new(40, 20, 16, 4)
    };
    let qwen = MoeConfig {
        route: RouteConfig { renormalize: false, ..MoeConfig::new(36, 28, 12, 4).route },
        shared_ffn: Some(36),
        shared_gate: true,
        weight_dtype: WeightDtype::F16,
        ..MoeConfig::new(36, 28, 12, 4)
    };
    let gpt_oss = MoeConfig {
        route: RouteConfig { router_bias: true, ..MoeConfig::new(40, 24, 8, 4).route },
        activation: Activation::GPT_OSS,
        expert_bias: true,
        weight_dtype: WeightDtype::Mxfp4,
        ..MoeConfig::new(40, 24, 8, 4)
    };
    let overflow =
        MoeConfig { capacity: Capacity::Bounded { bound: 3, policy: OverflowPolicy::Overflow }, ..mixtral };
    let drop = MoeConfig { capacity: Capacity::Bounded { bound: 3, policy: OverflowPolicy::Drop }, ..qwen };
    vec![
        ("mixtral", mixtral),
        ("deepseek", deepseek),
        ("qwen2", qwen),
        ("bounded-overflow", overflow),
        ("bounded-drop", drop),
        // Quantised experts (shared experts too), on the dropless and bounded paths.
        ("mixtral-q4_0", MoeConfig { weight_dtype: WeightDtype::Q4_0, ..mixtral }),
        ("deepseek-mxfp4", MoeConfig { weight_dtype: WeightDtype::Mxfp4, ..deepseek }),
        ("qwen2-fp8", MoeConfig { weight_dtype: WeightDtype::Fp8, ..qwen }),
        ("bounded-overflow-q8_0", MoeConfig { weight_dtype: WeightDtype::Q8_0, ..overflow }),
        // gpt-oss: router bias, softmax over the top-k logits (softmax then renormalise),
        // clamped SwiGLU, expert biases, MXFP4 experts; K = 40 ends mid-block.
        ("gpt-oss-mxfp4", gpt_oss),
    ]
}

#[test]
fn layer_matches_the_reference_layer() {
    side_by_side(&contexts(), |_, ctx| {
        for (name, cfg) in configs() {
            let w = Synth::new(1).moe_weights(&cfg);
            let layer = MoeLayer::new(ctx, cfg, &w).unwrap();
            for tokens in [1usize, 5, 100] {
                let x = Synth::new(tokens as u64).uniform(tokens * cfg.route.hidden as usize, 1.0);
                let got = layer.forward_host(ctx, &x).unwrap();
                let (y, idx, wts) = reference::forward(&cfg, &w, &x).unwrap();
                let what = format!("{} {name} M={tokens}", ctx.adapter().slug());
                assert_eq!(got.indices, idx, "{what}: indices");
                common::assert_close(&format!("{what} weights"), &got.weights, &wts);
                let n = assert_rows_close(&what, &got.y, &y, cfg.route.hidden as usize);
                eprintln!("{what}: {n}/{} outputs bit-equal to the reference", y.len());
            }
        }
    });
}

/// A layer with f16-staged tiles (a precision mode the caller chooses): routing exact, the
/// grouped path (100 tokens, 128-row tiles, shared expert too) within 1% of the row scale of
/// the exact reference and not its bits; the routed experts' decode path stays
/// exact f32 (one token), the bits of the layer with the default kernels.
#[test]
fn f16_staged_tiles_run_a_layer_within_their_precision() {
    for ctx in contexts() {
        let exact = MoeConfig { shared_ffn: Some(24), ..MoeConfig::new(48, 40, 8, 2) };
        let cfg = MoeConfig {
            kernels: KernelChoice::Fixed {
                up: GemmVariant::TileF16(TileBlock::new(128, 64, 8, 8, 1)),
                down: GemmVariant::TileF16(TileBlock::new(64, 32, 4, 4, 2)),
            },
            ..exact
        };
        let w = Synth::new(4).moe_weights(&cfg);
        let layer = MoeLayer::new(&ctx, cfg, &w).unwrap();
        let h = cfg.route.hidden as usize;
        let x = Synth::new(5).uniform(100 * h, 1.0);
        let got = layer.forward_host(&ctx, &x).unwrap();
        let (y, idx, _) = reference::forward(&exact, &w, &x).unwrap();
        let what = ctx.adapter().slug();
        assert_eq!(got.indices, idx, "{what}: indices");
        for (t, (g, r)) in got.y.chunks(h).zip(y.chunks(h)).enumerate() {
            let scale = r.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (c, (g, r)) in g.iter().zip(r).enumerate() {
                assert!((g - r).abs() <= 1e-2 * scale, "{what}: token {t} column {c}: {g} vs {r}");
            }
        }
        assert_ne!(bits(&got.y), bits(&y), "{what}: f16-staged outputs are the exact bits");
        // Without the shared expert (which runs the block kernels at every token count).
        let (exact, cfg) = (MoeConfig { shared_ffn: None, ..exact }, MoeConfig { shared_ffn: None, ..cfg });
        let w = Synth::new(4).moe_weights(&cfg);
        let x1 = &x[..h];
        let decode = MoeLayer::new(&ctx, cfg, &w).unwrap().forward_host(&ctx, x1).unwrap();
        let default = MoeLayer::new(&ctx, exact, &w).unwrap().forward_host(&ctx, x1).unwrap();
        assert_eq!(bits(&decode.y), bits(&default.y), "{what}: decode is not exact");
    }
}

/// Over `common::sweep`'s (adapter, layer, variant) cases: each variant of each layer on each
/// adapter other than GL (every combination with `MOEFLOW_FULL_SWEEPS=1`), the first on GL.
#[test]
fn routing_and_combine_variants_are_bit_identical() {
    let ctxs = contexts();
    let cases = common::sweep(&common::on_gl(&ctxs), &[configs().len(), 3]);
    side_by_side(&ctxs, |a, ctx| {
        for (l, (name, cfg)) in configs().into_iter().enumerate() {
            let chosen: Vec<usize> = cases.iter().filter(|c| c[..2] == [a, l]).map(|c| c[2]).collect();
            if chosen.is_empty() {
                continue;
            }
            let w = Synth::new(2).moe_weights(&cfg);
            let x = Synth::new(3).uniform(37 * cfg.route.hidden as usize, 1.0);
            let base = MoeLayer::new(ctx, cfg, &w).unwrap().forward_host(ctx, &x).unwrap();
            let variants = [
                ("fused routing", MoeConfig { route_mode: RouteMode::Fused { write_logits: false }, ..cfg }),
                (
                    "fused routing with logits",
                    MoeConfig { route_mode: RouteMode::Fused { write_logits: true }, ..cfg },
                ),
                ("sequential combine", MoeConfig { combine: CombineMode::Sequential, ..cfg }),
            ];
            for (variant, c) in chosen.into_iter().map(|v| variants[v]) {
                let other = MoeLayer::new(ctx, c, &w).unwrap().forward_host(ctx, &x).unwrap();
                let what = format!("{} {name}: {variant}", ctx.adapter().slug());
                assert_eq!(other.indices, base.indices, "{what}");
                assert_eq!(bits(&other.weights), bits(&base.weights), "{what}");
                assert_eq!(bits(&other.y), bits(&base.y), "{what}");
            }
        }
    });
}

#[test]
fn mismatched_weights_are_an_error_naming_the_tensor() {
    for ctx in contexts() {
        let cfg = MoeConfig { shared_ffn: Some(8), ..MoeConfig::new(16, 12, 4, 2) };
        let good = Synth::new(4).moe_weights(&cfg);
        let mut w = good.clone();
        w.down.pop();
        let err = MoeLayer::new(&ctx, cfg, &w).unwrap_err().to_string();
        assert!(err.contains("`experts down`") && err.contains("[4, 16, 12]"), "{err}");
        let mut w = good.clone();
        w.shared = None;
        let err = MoeLayer::new(&ctx, cfg, &w).unwrap_err().to_string();
        assert!(err.contains("shared"), "{err}");
        let err =
            MoeLayer::new(&ctx, MoeConfig { route: RouteConfig { bias: true, ..cfg.route }, ..cfg }, &good)
                .unwrap_err()
                .to_string();
        assert!(err.contains("bias"), "{err}");
        let err = MoeLayer::new(&ctx, MoeConfig { route: RouteConfig { k: 5, ..cfg.route }, ..cfg }, &good)
            .unwrap_err()
            .to_string();
        assert!(err.contains("k = 5"), "{err}");
        let layer = MoeLayer::new(&ctx, cfg, &good).unwrap();
        let err = layer.forward_host(&ctx, &[0.0; 15]).unwrap_err().to_string();
        assert!(err.contains("`x`"), "{err}");
    }
}

/// A layer whose projections (routed and shared) are past the device's storage-binding limit
/// runs split, and gives the unsplit layer's bits on the same adapter, at decode and prefill
/// token counts.
#[test]
fn a_layer_past_the_binding_limit_gives_the_unsplit_bits() {
    side_by_side(&common::wgpu_adapters(), |_, adapter| {
        let whole = moeflow::Context::from_adapter(adapter).unwrap();
        for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
            let cfg = MoeConfig {
                shared_ffn: Some(300),
                shared_gate: true,
                weight_dtype: dtype,
                ..MoeConfig::new(64, 96, 8, 2)
            };
            let w = Synth::new(71).moe_weights(&cfg);
            // Two f32 experts (24 KiB each) per chunk; the f32 shared expert (75 KiB) in column runs.
            let limit = 64 << 10;
            let limits = wgpu::Limits { max_storage_buffer_binding_size: limit, ..adapter.limits() };
            let (device, queue) =
                pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                    required_limits: limits,
                    ..Default::default()
                }))
                .unwrap();
            let split = moeflow::Context::from_wgpu(device, queue);
            let (a, b) = (MoeLayer::new(&whole, cfg, &w).unwrap(), MoeLayer::new(&split, cfg, &w).unwrap());
            for tokens in [3usize, 21] {
                let x = Synth::new(72).uniform(tokens * 64, 1.0);
                let (ya, yb) = (a.forward_host(&whole, &x).unwrap(), b.forward_host(&split, &x).unwrap());
                assert_eq!(ya.indices, yb.indices);
                assert_eq!(bits(&ya.y), bits(&yb.y), "{dtype:?}, {tokens} tokens");
            }
        }
    });
}

/// x and y as views of one activation arena, swapping roles between two layers recorded into
/// one encoder, give the bits of separate buffers; views at offsets the device cannot bind or
/// past their buffer are errors.
#[test]
fn views_of_one_arena_give_the_bits_of_separate_buffers() {
    use moeflow::BufferView;
    let (tokens, h) = (5usize, 48usize);
    let first = MoeConfig::new(h as u32, 40, 8, 2);
    let second = MoeConfig { shared_ffn: Some(24), ..MoeConfig::new(h as u32, 32, 6, 3) };
    let x = Synth::new(21).uniform(tokens * h, 1.0);
    for ctx in contexts() {
        let one = MoeLayer::new(&ctx, first, &Synth::new(22).moe_weights(&first)).unwrap();
        let two = MoeLayer::new(&ctx, second, &Synth::new(23).moe_weights(&second)).unwrap();
        let mid = one.forward_host(&ctx, &x).unwrap().y;
        let want = two.forward_host(&ctx, &mid).unwrap().y;

        let align = u64::from(ctx.device().limits().min_storage_buffer_offset_alignment);
        let bytes = (tokens * h * 4) as u64;
        let region = bytes.div_ceil(align) * align;
        let arena = ctx.zeroed("arena", align + 2 * region).unwrap();
        ctx.queue().write_buffer(&arena, align, bytemuck::cast_slice(&x));
        let a = BufferView::new(&arena, align, bytes);
        let b = BufferView::new(&arena, align + region, bytes);
        let p1 = one.plan(&ctx, one.io(a, b, tokens as u32).unwrap()).unwrap();
        let p2 = two.plan(&ctx, two.io(b, a, tokens as u32).unwrap()).unwrap();
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        p1.record(&mut encoder, tokens as u32).unwrap();
        p2.record(&mut encoder, tokens as u32).unwrap();
        ctx.submit_and_wait(encoder).unwrap();
        let all: Vec<f32> = ctx.read_back(&arena, ((align + 2 * region) / 4) as usize).unwrap();
        let at = |offset: u64| &all[(offset / 4) as usize..(offset / 4) as usize + tokens * h];
        let slug = ctx.adapter().slug();
        assert_eq!(bits(at(align + region)), bits(&mid), "{slug}: the first layer's y in the arena");
        assert_eq!(bits(at(align)), bits(&want), "{slug}: the second layer's y in the arena");
        assert!(all[..(align / 4) as usize].iter().all(|&v| v == 0.0), "{slug}: bytes before the views");

        if align > 4 {
            let io = one.io(BufferView::new(&arena, 4, bytes), b, tokens as u32).unwrap();
            let err = one.plan(&ctx, io).unwrap_err();
            assert!(err.to_string().contains("offset alignment"), "{slug}: {err}");
        }
        let err = one.io(a, BufferView::new(&arena, align + region, 2 * region), tokens as u32).unwrap_err();
        assert!(err.to_string().contains("view of `y`"), "{slug}: {err}");
        let err = one.io(BufferView::new(&arena, align, bytes - 4), b, tokens as u32).unwrap_err();
        assert!(err.to_string().contains("`x`"), "{slug}: {err}");
    }
}

/// Routing results and logits written to the caller's tensors (views of one arena at offsets)
/// hold the bits the plan's own workspace gets, at the live count, rows past it untouched; the
/// layout of such a plan has no region for them.
#[test]
fn routing_outputs_in_the_callers_tensors_match_the_workspace() {
    use moeflow::workspace::ScratchKey;
    use moeflow::{BufferView, Tensor};
    let (max, live) = (9u32, 6u32);
    for ctx in contexts() {
        let slug = ctx.adapter().slug();
        for (name, cfg) in configs().into_iter().take(2) {
            let (h, k, e) = (cfg.route.hidden, cfg.route.k, cfg.route.experts);
            let layer = MoeLayer::new(&ctx, cfg, &Synth::new(41).moe_weights(&cfg)).unwrap();
            let x = ctx.upload("x", &Synth::new(42).uniform((max * h) as usize, 1.0)).unwrap();
            let rows = u64::from(max * h) * 4;
            let (ya, yb) = (ctx.zeroed("y a", rows).unwrap(), ctx.zeroed("y b", rows).unwrap());
            let own = layer.plan(&ctx, layer.io(&x, &ya, max).unwrap()).unwrap();

            // indices, weights and logits in one arena of 0xFF bytes, each at an aligned offset.
            let align = u64::from(ctx.device().limits().min_storage_buffer_offset_alignment);
            let sizes = [u64::from(max * k) * 4, u64::from(max * k) * 4, u64::from(max * e) * 4];
            let at: Vec<u64> = sizes
                .iter()
                .scan(align, |o, s| Some(std::mem::replace(o, *o + s.next_multiple_of(align))))
                .collect();
            let total = at[2] + sizes[2];
            let arena = ctx.upload("arena", &vec![u32::MAX; (total / 4) as usize]).unwrap();
            let view = |i: usize| BufferView::new(&arena, at[i], sizes[i]);
            let io = layer.io(&x, &yb, max).unwrap().with_routing(
                Tensor::u32(view(0), [max, k]).unwrap(),
                Tensor::f32(view(1), [max, k]).unwrap(),
            );
            let io = io.with_logits(Tensor::f32(view(2), [max, e]).unwrap());
            let keys: Vec<ScratchKey> =
                layer.workspace_for(&ctx, &io).unwrap().regions().map(|r| r.0).collect();
            for key in [ScratchKey::TOPK_INDICES, ScratchKey::TOPK_WEIGHTS, ScratchKey::ROUTER_LOGITS] {
                assert!(!keys.contains(&key), "{slug} {name}: {key:?} laid out for a caller's tensor");
            }
            let theirs = layer.plan(&ctx, io).unwrap();
            assert_eq!(theirs.indices().view().offset, at[0], "{slug} {name}");
            assert_eq!(theirs.logits().unwrap().shape(), [max, e], "{slug} {name}");

            let mut encoder = ctx.encoder("forwards");
            own.record(&mut encoder, live).unwrap();
            theirs.record(&mut encoder, live).unwrap();
            ctx.submit_and_wait(encoder).unwrap();
            let what = format!("{slug} {name}, {live} of {max} tokens");
            let n = |c: u32| (live * c) as usize;
            assert_eq!(
                bits(&ctx.read_back::<f32>(&yb, n(h)).unwrap()),
                bits(&ctx.read_back::<f32>(&ya, n(h)).unwrap()),
                "{what}: y"
            );
            let arena_words: Vec<u32> = ctx.read_back(&arena, (total / 4) as usize).unwrap();
            let word = |i: usize| (at[i] / 4) as usize;
            let own_logits = own.logits().expect("the unfused route writes logits");
            let outputs = [
                (theirs.indices(), own.indices(), k),
                (theirs.weights(), own.weights(), k),
                (theirs.logits().unwrap(), own_logits, e),
            ];
            for (i, (got, want, cols)) in outputs.into_iter().enumerate() {
                let (got, want) = (
                    ctx.read_back::<u32>(got, n(cols)).unwrap(),
                    ctx.read_back::<u32>(want, n(cols)).unwrap(),
                );
                assert_eq!(got, want, "{what}: output {i}");
                let past = &arena_words[word(i) + n(cols)..word(i) + (max * cols) as usize];
                assert!(past.iter().all(|&v| v == u32::MAX), "{what}: rows past the count of output {i}");
            }
            assert!(
                arena_words[..word(0)].iter().all(|&v| v == u32::MAX),
                "{what}: bytes before the tensors"
            );
        }
    }
}

/// One plan for 40 tokens runs live counts 1 to 40, up and down, set on the host and held on
/// the device in turn, with the bits of a plan made for exactly each count (routing, weights
/// and y), and leaves y's rows past the count as they were: the decode path at the counts that take it, the grouped path past them, windows past
/// the first (H = 256 puts 64 rows in a window), shared experts with and without their gate,
/// quantised and biased experts, bounded capacity with overflow and with drops, the fused
/// route and the sequential combine. A count of 0 or past the maximum is refused.
#[test]
fn one_plan_runs_every_live_count_with_the_bits_of_an_exact_plan() {
    let max = 40u32;
    let lives = [40u32, 1, 3, 4, 17, 2, 40, 5, 39];
    let mut cases = configs();
    let wide = MoeConfig::new(256, 64, 8, 2);
    cases.push(("wide", wide));
    cases.push((
        "fused-sequential",
        MoeConfig {
            route_mode: RouteMode::Fused { write_logits: true },
            combine: CombineMode::Sequential,
            ..configs()[2].1
        },
    ));
    for ctx in contexts() {
        let slug = ctx.adapter().slug();
        for (name, cfg) in &cases {
            let h = cfg.route.hidden as usize;
            let k = cfg.route.k as usize;
            let w = Synth::new(31).moe_weights(cfg);
            let layer = MoeLayer::new(&ctx, *cfg, &w).unwrap();
            let xb = ctx.zeroed("x", u64::from(max) * h as u64 * 4).unwrap();
            let yb = ctx.zeroed("y", u64::from(max) * h as u64 * 4).unwrap();
            let plan = layer.plan(&ctx, layer.io(&xb, &yb, max).unwrap()).unwrap();
            for (i, live) in lives.into_iter().enumerate() {
                let what = format!("{slug} {name} live {live} of {max}");
                // New inputs every forward: rows past the count would change y if they ran.
                let x = Synth::new(32 + i as u64).uniform(max as usize * h, 1.0);
                ctx.queue().write_buffer(&xb, 0, bytemuck::cast_slice(&x));
                let before: Vec<f32> = ctx.read_back(&yb, max as usize * h).unwrap();
                // Counts set by the host (the dispatches that run at the count, their grids set
                // on the host) and counts held on the device (every dispatch, grids read there),
                // in turn.
                if i % 2 == 0 {
                    let mut encoder = ctx.device().create_command_encoder(&Default::default());
                    plan.record(&mut encoder, live).unwrap();
                    ctx.submit_and_wait(encoder).unwrap();
                } else {
                    plan.set_live_tokens(&ctx, live).unwrap();
                    ctx.run(&plan.dispatches()).unwrap();
                }
                let n = live as usize;
                let y: Vec<f32> = ctx.read_back(&yb, max as usize * h).unwrap();
                let want = layer.forward_host(&ctx, &x[..n * h]).unwrap();
                assert_eq!(
                    ctx.read_back::<u32>(plan.indices(), n * k).unwrap(),
                    want.indices,
                    "{what}: indices"
                );
                assert_eq!(
                    bits(&ctx.read_back::<f32>(plan.weights(), n * k).unwrap()),
                    bits(&want.weights),
                    "{what}: weights"
                );
                let differs = |a: &[f32], b: &[f32]| bits(a).iter().zip(bits(b)).position(|(a, b)| *a != b);
                assert_eq!(differs(&y[..n * h], &want.y), None, "{what}: y differs from the exact plan's at");
                assert_eq!(
                    differs(&y[n * h..], &before[n * h..]),
                    None,
                    "{what}: y past the live rows changed at"
                );
                let load = plan.load(&ctx, cfg.route.experts).unwrap();
                assert_eq!(load.rows as usize, n * k, "{what}: the load counts the live entries");
            }
        }
        let h = u64::from(cases[0].1.route.hidden);
        let layer = MoeLayer::new(&ctx, cases[0].1, &Synth::new(33).moe_weights(&cases[0].1)).unwrap();
        let (xb, yb) = (ctx.zeroed("x", 8 * h * 4).unwrap(), ctx.zeroed("y", 8 * h * 4).unwrap());
        let plan = layer.plan(&ctx, layer.io(&xb, &yb, 8).unwrap()).unwrap();
        for bad in [0, 9] {
            let err = plan.set_live_tokens(&ctx, bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!("live token count {bad}")) && err.contains("1 to 8"),
                "{slug}: {err}"
            );
        }
        // An empty batch: recorded as nothing (y keeps its values), no stages, empty results
        // of a forward on host data; planning for a maximum of 0 stays an error.
        ctx.queue().write_buffer(&yb, 0, bytemuck::cast_slice(&vec![1.5f32; 8 * h as usize]));
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        plan.record(&mut encoder, 0).unwrap();
        ctx.submit_and_wait(encoder).unwrap();
        let y: Vec<f32> = ctx.read_back(&yb, 8 * h as usize).unwrap();
        assert!(y.iter().all(|&v| v == 1.5), "{slug}: a forward of 0 tokens wrote y");
        assert!(plan.stages_at(0).unwrap().is_empty() && plan.dispatches_at(0).unwrap().is_empty());
        assert!(plan.record(&mut ctx.device().create_command_encoder(&Default::default()), 9).is_err());
        let empty = layer.forward_host(&ctx, &[]).unwrap();
        assert!(empty.y.is_empty() && empty.indices.is_empty() && empty.weights.is_empty(), "{slug}");
        let err = layer.io(&xb, &yb, 0).and_then(|io| layer.plan(&ctx, io)).unwrap_err().to_string();
        assert!(err.contains("at least 1"), "{slug}: {err}");
    }
}

/// `cfg` with hidden size `h` and FFN size `f`.
trait WithSizes {
    fn with_sizes(self, h: u32, f: u32) -> Self;
}

impl WithSizes for MoeConfig {
    fn with_sizes(self, h: u32, f: u32) -> Self {
        MoeConfig { route: RouteConfig { hidden: h, ..self.route }, ffn: f, ..self }
    }
}

/// The experts `held` of `stored` in host memory.
fn host_projection<'a>(stored: &'a StoredExperts, held: &[u32]) -> HostProjection<'a> {
    let mut p = HostProjection::new(stored.shape()).unwrap();
    for &x in held {
        p.hold(x, stored.expert(x)).unwrap();
    }
    p
}

/// Routed experts on the host (all of them, as `--cpu-moe`, or a set, as `-ot`), the rest on
/// the device: the same routing bit for bit, and the outputs of the layer with every expert on
/// the device, at decode and grouped sizes, in each family's dtype, the device and host
/// experts made from the same stored values.
#[test]
fn host_experts_give_the_device_layers_outputs() {
    let all = configs();
    let pick = |name: &str| all.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap();
    let cases: [(&str, MoeConfig, Option<&[u32]>); 5] = [
        ("mixtral", pick("mixtral"), None),
        ("qwen2 f16, shared expert", pick("qwen2"), Some(&[1, 4, 7, 11])),
        ("deepseek bf16, grouped", pick("deepseek"), Some(&[0, 1, 2, 3, 4, 5, 6, 7])),
        // Stored blocks run whole along K: H and F multiples of 32 for the block formats.
        ("gpt-oss mxfp4", pick("gpt-oss-mxfp4").with_sizes(64, 32), None),
        ("mixtral q4_0", pick("mixtral-q4_0").with_sizes(64, 32), Some(&[0, 2, 3])),
    ];
    side_by_side(&contexts(), |_, ctx| {
        for (name, cfg, on_host) in cases {
            let (h, f, e) = (cfg.route.hidden, cfg.ffn, cfg.route.experts);
            let placement = match on_host {
                Some(experts) => ExpertPlacement::with_host(e, experts).unwrap(),
                None => ExpertPlacement::all_on_host(e),
            };
            let w = Synth::new(7).moe_weights(&cfg);
            let dt = cfg.weight_dtype;
            let (eu, fu, hu) = (e as usize, f as usize, h as usize);
            let stored = [
                StoredExperts::new(dt, &w.gate, [eu, fu, hu]).unwrap(),
                StoredExperts::new(dt, &w.up, [eu, fu, hu]).unwrap(),
                StoredExperts::new(dt, &w.down, [eu, hu, fu]).unwrap(),
            ];
            let device_ffn = |placement: Option<&ExpertPlacement>| {
                let weights = |s: &StoredExperts| match placement {
                    Some(p) => {
                        ExpertWeights::stream_placed(ctx, dt, s.shape(), p, |x| Ok(s.expert(x)), |_| {})
                    }
                    None => ExpertWeights::stream(ctx, dt, s.shape(), |x| Ok(s.expert(x)), |_| {}),
                };
                let mut ffn = ExpertFfn::new(
                    weights(&stored[0]).unwrap(),
                    weights(&stored[1]).unwrap(),
                    weights(&stored[2]).unwrap(),
                )
                .unwrap();
                if let Some(b) = &w.expert_bias {
                    ffn = ffn
                        .with_bias(ExpertBias::new(ctx, &b.gate, &b.up, &b.down, [e, f, h]).unwrap())
                        .unwrap();
                }
                ffn
            };
            let shared = || {
                w.shared.as_ref().zip(cfg.shared_ffn).map(|((g, u, d), fs)| {
                    let ew = |v: &[f32], n, k| ExpertWeights::from_f32(ctx, v, dt, 1, n, k).unwrap();
                    ExpertFfn::new(ew(g, fs, h), ew(u, fs, h), ew(d, h, fs)).unwrap()
                })
            };
            let router = RouterWeights {
                router: w.router.clone(),
                bias: w.bias.clone(),
                shared_gate: w.shared_gate.clone(),
                router_bias: w.router_bias.clone(),
            };
            let full = MoeLayer::with_experts(ctx, cfg, &router, device_ffn(None), shared()).unwrap();
            let split =
                MoeLayer::with_experts(ctx, cfg, &router, device_ffn(Some(&placement)), shared()).unwrap();
            for x in 0..e {
                assert_eq!(
                    split.experts().holds(x),
                    !placement.on_host(x),
                    "{name}: the device holds expert {x}"
                );
            }
            let held = placement.host_experts();
            let project = |s| host_projection(s, &held);
            let mut host = HostExperts::new(
                project(&stored[0]),
                project(&stored[1]),
                project(&stored[2]),
                cfg.gemm_order,
                cfg.activation,
            )
            .unwrap();
            if let Some(b) = &w.expert_bias {
                host = host.with_bias(HostBias { gate: &b.gate, up: &b.up, down: &b.down }).unwrap();
            }
            for tokens in [1usize, 37] {
                let x = Synth::new(tokens as u64 + 3).uniform(tokens * hu, 1.0);
                let want = full.forward_host(ctx, &x).unwrap();
                let got = split.forward_host_hybrid(ctx, &x, &host).unwrap();
                let what = format!("{} {name} M={tokens}", ctx.adapter().slug());
                assert_eq!(got.indices, want.indices, "{what}: indices");
                assert_eq!(bits(&got.weights), bits(&want.weights), "{what}: weights");
                let n = assert_rows_close(&what, &got.y, &want.y, hu);
                eprintln!("{what}: {n}/{} outputs bit-equal to the all-device layer", want.y.len());
                // The planned forward's times: the host's rows, and the device's own clock
                // wherever the adapter has timestamp queries.
                let (xb, yb) = (ctx.upload("x", &x).unwrap(), ctx.zeroed("y", x.len() as u64 * 4).unwrap());
                let forward =
                    split.plan_hybrid(ctx, split.io(&xb, &yb, tokens as u32).unwrap(), &host).unwrap();
                let times = forward.run(ctx, tokens as u32).unwrap();
                let on_host = want.indices.iter().filter(|&&x| placement.on_host(x)).count();
                assert_eq!(times.host_rows, on_host, "{what}: rows the host computed");
                assert_eq!(times.device.is_some(), ctx.capabilities().timestamps, "{what}: device clock");
                let device_experts = (0..e).any(|x| !placement.on_host(x));
                let ran = |t: f64| if device_experts { t > 0.0 } else { t >= 0.0 };
                assert!(times.device.is_none_or(ran), "{what}: device time {:?}", times.device);
            }
        }
    });
}

/// A hybrid plan refuses host experts that do not fit the layer, and an expert held by both
/// or neither of the device and the host.
#[test]
fn hybrid_plans_refuse_mismatched_host_experts() {
    for ctx in contexts() {
        let cfg = MoeConfig::new(32, 32, 4, 2);
        let w = Synth::new(9).moe_weights(&cfg);
        let stored = [
            StoredExperts::new(WeightDtype::F32, &w.gate, [4, 32, 32]).unwrap(),
            StoredExperts::new(WeightDtype::F32, &w.up, [4, 32, 32]).unwrap(),
            StoredExperts::new(WeightDtype::F32, &w.down, [4, 32, 32]).unwrap(),
        ];
        let host_of = |held: &[u32], order| {
            let project = |s| host_projection(s, held);
            HostExperts::new(
                project(&stored[0]),
                project(&stored[1]),
                project(&stored[2]),
                order,
                Activation::Swiglu,
            )
            .unwrap()
        };
        let placement = ExpertPlacement::with_host(4, &[1, 2]).unwrap();
        let device = |p: &ExpertPlacement| {
            let ew = |v: &[f32]| {
                ExpertWeights::from_f32_placed(&ctx, v, WeightDtype::F32, [4, 32, 32], p).unwrap()
            };
            ExpertFfn::new(ew(&w.gate), ew(&w.up), ew(&w.down)).unwrap()
        };
        let router = RouterWeights { router: w.router.clone(), ..RouterWeights::default() };
        let layer = MoeLayer::with_experts(&ctx, cfg, &router, device(&placement), None).unwrap();
        let x = Synth::new(1).uniform(3 * 32, 1.0);
        let err = |host: &HostExperts<'_>| layer.forward_host_hybrid(&ctx, &x, host).unwrap_err().to_string();
        let both = host_of(&[0, 1, 2], GemmOrder::Strict);
        assert!(err(&both).contains("expert 0 is on both the device and the host"), "{}", err(&both));
        let neither = host_of(&[1], GemmOrder::Strict);
        assert!(
            err(&neither).contains("expert 2 is on neither the device nor the host"),
            "{}",
            err(&neither)
        );
        let fast = host_of(&[1, 2], GemmOrder::Fast);
        assert!(err(&fast).contains("the host experts run Fast order"), "{}", err(&fast));
        let bounded =
            MoeConfig { capacity: Capacity::Bounded { bound: 2, policy: OverflowPolicy::Drop }, ..cfg };
        let bounded = MoeLayer::with_experts(&ctx, bounded, &router, device(&placement), None).unwrap();
        let host = host_of(&[1, 2], GemmOrder::Strict);
        let e = bounded.forward_host_hybrid(&ctx, &x, &host).unwrap_err().to_string();
        assert!(e.contains("dropless"), "{e}");
        // The good one runs; an empty batch is no work.
        assert_eq!(layer.forward_host_hybrid(&ctx, &x, &host).unwrap().y.len(), x.len());
        assert!(layer.forward_host_hybrid(&ctx, &[], &host).unwrap().y.is_empty());
    }
}

/// A GGUF layer (Q8_0 experts, f16 experts) with routed experts left in the file on the host
/// (every one, and a set): the layer the plain load uploads gives the same indices and its
/// outputs; the host holds exactly the placed experts, in the file's bytes; an MXFP4-typed
/// request or a placement of another size is an `Err`.
#[cfg(feature = "checkpoint")]
#[test]
fn gguf_experts_left_on_the_host_give_the_uploaded_layers_outputs() {
    use moeflow::weights::gguf::{GgmlType, Gguf};
    use moeflow::weights::{LoadOptions, upload_gguf_layer, upload_gguf_layer_placed};
    let (h, f, e) = (64u64, 32u64, 6u64);
    let router = Synth::new(60).uniform((h * e) as usize, 1.0);
    let experts = |seed: u64, ty: GgmlType| {
        let v = Synth::new(seed).uniform((h * f * e) as usize, 1.0);
        let bytes = match ty {
            GgmlType::Q8_0 => moeflow::quant::q8_0_quantize(&v).unwrap(),
            _ => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        };
        (ty, bytes)
    };
    for ty in [GgmlType::Q8_0, GgmlType::F16] {
        let file =
            common::qwen2moe_gguf([h, f, e, 2], &router, [experts(61, ty), experts(62, ty), experts(63, ty)]);
        let g = Gguf::parse(&file, "layer.gguf").unwrap();
        let opts = LoadOptions::default();
        for ctx in contexts() {
            let want = upload_gguf_layer(&ctx, &g, &opts, |c| c).unwrap().layer;
            let x = Synth::new(64).uniform(9 * h as usize, 1.0);
            let want = want.forward_host(&ctx, &x).unwrap();
            for placement in [
                ExpertPlacement::all_on_host(e as u32),
                ExpertPlacement::with_host(e as u32, &[1, 4]).unwrap(),
            ] {
                let placed =
                    upload_gguf_layer_placed(&ctx, &g, &opts, |_| Ok(placement.clone()), |c| c).unwrap();
                assert_eq!(placed.host.experts(), placement.host_experts());
                let per_expert = if ty == GgmlType::Q8_0 { h * f / 32 * 34 } else { h * f * 2 };
                assert_eq!(placed.host.bytes(), 3 * per_expert * placement.host_experts().len() as u64);
                let got = placed.uploaded.layer.forward_host_hybrid(&ctx, &x, &placed.host).unwrap();
                let what = format!("{} {ty:?} host {:?}", ctx.adapter().slug(), placement.host_experts());
                assert_eq!(got.indices, want.indices, "{what}: indices");
                assert_rows_close(&what, &got.y, &want.y, h as usize);
            }
            let err =
                upload_gguf_layer_placed(&ctx, &g, &opts, |_| Ok(ExpertPlacement::all_on_host(5)), |c| c)
                    .unwrap_err()
                    .to_string();
            assert!(err.contains("a placement of 5 experts for a layer of 6"), "{err}");
            let other = LoadOptions { dtype: Some(WeightDtype::F32), ..LoadOptions::default() };
            let err =
                upload_gguf_layer_placed(&ctx, &g, &other, |e| Ok(ExpertPlacement::all_on_host(e)), |c| c)
                    .unwrap_err()
                    .to_string();
            assert!(err.contains("the layer keeps the file's type"), "{err}");
        }
    }
}

/// A safetensors checkpoint (Qwen2-MoE, bf16 experts, a gated shared expert) with routed
/// experts left in the mapped file on the host, every one and a set: the plain upload's
/// indices and outputs; the host holds the placed experts' stored bytes.
#[cfg(feature = "checkpoint")]
#[test]
fn checkpoint_experts_left_on_the_host_give_the_uploaded_layers_outputs() {
    use moeflow::weights::{
        Checkpoint, LoadOptions, upload_checkpoint_layer, upload_checkpoint_layer_placed,
    };
    // Qwen2-MoE in bf16; gpt-oss in MXFP4 as shipped (gate and up rows interleaved, biases);
    // Qwen3-MoE in FP8 with f32 scales (one per 128 x 128 tile). The host bytes per expert,
    // from F and H: as stored.
    type BytesPerExpert = fn(u64, u64) -> u64;
    let fixtures: [(&str, BytesPerExpert); 3] = [
        ("qwen2_moe_bf16_t5_norm", |f, h| 3 * f * h * 2),
        ("gpt_oss_mxfp4_t37", |f, h| 3 * f * h / 32 * 17),
        ("qwen3_moe_fp8_t37", |f, h| 3 * f * h + 3 * f.div_ceil(128) * h.div_ceil(128) * 4),
    ];
    for (fixture, per_expert) in fixtures {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(fixture);
        let config = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let opts = LoadOptions { config: Some(config), ..LoadOptions::default() };
        let ckpt = Checkpoint::open(&dir.join("weights.safetensors")).unwrap();
        for ctx in contexts() {
            let want = upload_checkpoint_layer(&ctx, &ckpt, &opts, |c| c).unwrap().layer;
            let cfg = *want.config();
            let (h, e) = (cfg.route.hidden as usize, cfg.route.experts);
            let x = Synth::new(65).uniform(7 * h, 1.0);
            let want = want.forward_host(&ctx, &x).unwrap();
            for placement in
                [ExpertPlacement::all_on_host(e), ExpertPlacement::with_host(e, &[0, e - 1]).unwrap()]
            {
                let placed =
                    upload_checkpoint_layer_placed(&ctx, &ckpt, &opts, |_| Ok(placement.clone()), |c| c)
                        .unwrap();
                assert_eq!(placed.host.experts(), placement.host_experts());
                let per_expert = per_expert(u64::from(cfg.ffn), h as u64);
                assert_eq!(
                    placed.host.bytes(),
                    per_expert * placement.host_experts().len() as u64,
                    "{fixture}"
                );
                let got = placed.uploaded.layer.forward_host_hybrid(&ctx, &x, &placed.host).unwrap();
                let what = format!("{fixture} {} host {:?}", ctx.adapter().slug(), placement.host_experts());
                assert_eq!(got.indices, want.indices, "{what}: indices");
                assert_rows_close(&what, &got.y, &want.y, h);
            }
        }
    }
    // A layer converted on load cannot leave its experts in place.
    for (fixture, refusal) in [
        ("qwen2_moe_bf16_t5_norm", "keeps the stored dtype"),
        ("gpt_oss_mxfp4_t37", "as shipped, MXFP4 blocks"),
    ] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(fixture);
        let config = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let opts =
            LoadOptions { config: Some(config), dtype: Some(WeightDtype::F32), ..LoadOptions::default() };
        let ckpt = Checkpoint::open(&dir.join("weights.safetensors")).unwrap();
        let Some(ctx) = contexts().into_iter().next() else { return };
        let err = upload_checkpoint_layer_placed(
            &ctx,
            &ckpt,
            &opts,
            |e| Ok(ExpertPlacement::all_on_host(e)),
            |c| c,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(refusal), "{fixture}: {err}");
    }
}
