//! Expert projections on every adapter: against the CPU reference for every dtype, bitwise
//! equal across paths (grouped, bucketed with overflow, decode, all experts) and across
//! batches (batch invariance), and bad input; the host experts' FFN on the CPU against the
//! reference (`host_ffn/`).

mod common;
mod host_ffn;

use common::{
    adapters_on_gl, assert_rows_close, bits, contexts, covering, on_gl, rng, routes, side_by_side, sweep,
    uniform,
};
use moeflow::bits::{bit_identical, first_difference};
use moeflow::kernels::dispatch::{
    BucketConfig, BucketLayout, DispatchConfig, DispatchLayout, OverflowPolicy,
};
use moeflow::kernels::gemm::{
    Activation, AdapterKind, CoopBlock, DenseKernel, ExpertBias, ExpertFfn, ExpertWeights, FfnBuffers,
    FfnKernels, FfnRouting, GemmOrder, GemmVariant, LaneBlock, StoredValues, TileBlock, WeightDtype,
    check_on_device, plan_dense, plan_dense_ffn, plan_ffn, plan_ffn_all_experts,
};
use moeflow::reference::gemm as reference;
use moeflow::shader::Indexing;
use moeflow::{BoundsChecks, Context};
use rand::Rng;

struct Model {
    e: u32,
    h: u32,
    f: u32,
    dtype: WeightDtype,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    activation: Activation,
    /// Gate, up `[E, F]` and down `[E, H]` biases.
    bias: Option<[Vec<f32>; 3]>,
}

impl Model {
    fn new(seed: u64, e: u32, h: u32, f: u32, dtype: WeightDtype) -> Self {
        let mut r = rng(seed);
        let n = (e * h * f) as usize;
        let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (f as f32).sqrt());
        Model {
            e,
            h,
            f,
            dtype,
            gate: uniform(&mut r, n, sh),
            up: uniform(&mut r, n, sh),
            down: uniform(&mut r, n, sf),
            activation: Activation::Swiglu,
            bias: None,
        }
    }

    fn upload(&self, ctx: &Context) -> ExpertFfn {
        let w = |d: &[f32], n, k| ExpertWeights::from_f32(ctx, d, self.dtype, self.e, n, k).unwrap();
        let ffn = ExpertFfn::new(
            w(&self.gate, self.f, self.h),
            w(&self.up, self.f, self.h),
            w(&self.down, self.h, self.f),
        )
        .unwrap()
        .with_activation(self.activation)
        .unwrap();
        match &self.bias {
            Some([g, u, d]) => {
                ffn.with_bias(ExpertBias::new(ctx, g, u, d, [self.e, self.f, self.h]).unwrap()).unwrap()
            }
            None => ffn,
        }
    }

    fn reference(&self, x: &[f32], idx: &[u32], k: u32) -> Vec<f32> {
        self.reference_in(GemmOrder::Strict, x, idx, k)
    }

    /// The reference on the values the kernels see (`WeightDtype::round` of the model's).
    fn reference_in(&self, order: GemmOrder, x: &[f32], idx: &[u32], k: u32) -> Vec<f32> {
        self.reference_with(order, false, x, idx, k)
    }

    /// The reference in `order`, with every dot's operands rounded to f16 where `f16_operands`.
    fn reference_with(
        &self,
        order: GemmOrder,
        f16_operands: bool,
        x: &[f32],
        idx: &[u32],
        k: u32,
    ) -> Vec<f32> {
        let round = |v: &[f32], k: u32| self.dtype.round(v, k as usize).unwrap();
        let (gate, up, down) =
            (round(&self.gate, self.h), round(&self.up, self.h), round(&self.down, self.f));
        let w = reference::FfnWeights {
            gate: &gate,
            up: &up,
            down: &down,
            hidden: self.h as usize,
            ffn: self.f as usize,
            order,
            activation: self.activation,
            bias: self.bias.as_ref().map(|[g, u, d]| reference::FfnBias { gate: g, up: u, down: d }),
            f16_operands,
        };
        reference::expert_ffn(x, idx, k as usize, &w)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Grouped,
    Bucketed(u32),
    Decode,
}

/// Runs the FFN for host data along `path`; returns `partial[tokens * k, H]`.
fn run(ctx: &Context, ffn: &ExpertFfn, x: &[f32], idx: &[u32], k: u32, path: Path) -> Vec<f32> {
    let h = ffn.hidden();
    let tokens = x.len() as u32 / h;
    let (xb, ib) = (ctx.upload("x", x).unwrap(), ctx.upload("indices", idx).unwrap());
    let partial = ctx.zeroed("partial", u64::from(tokens * k * h) * 4).unwrap();
    let mut ds = Vec::new();
    let layout;
    let buckets;
    // Rows padded to 32 per expert, or to the kernels' blocks where those are taller.
    let tile = ffn.kernels(ctx).block_rows().max(32);
    let routing = match path {
        Path::Grouped => {
            layout = DispatchLayout::new(ctx, DispatchConfig { experts: ffn.experts(), k, tile }, tokens, 0)
                .unwrap();
            ds.extend(layout.plan(ctx, &ib).unwrap());
            FfnRouting::Grouped(&layout)
        }
        Path::Bucketed(bound) => {
            let cfg = BucketConfig { n_caps: ffn.experts(), bound, policy: OverflowPolicy::Overflow };
            buckets = BucketLayout::new(ctx, cfg, tokens * k).unwrap();
            ds.extend(buckets.plan(ctx, &ib).unwrap());
            FfnRouting::Bucketed(&buckets)
        }
        Path::Decode => FfnRouting::Decode,
    };
    let bufs = FfnBuffers { x: (&xb).into(), indices: (&ib).into(), partial: (&partial).into() };
    ds.extend(plan_ffn(ctx, ffn, tokens, k, &bufs, routing).unwrap().into_dispatches());
    ctx.run(&ds.iter().collect::<Vec<_>>()).unwrap();
    ctx.read_back(&partial, (tokens * k * h) as usize).unwrap()
}

#[test]
fn grouped_ffn_matches_the_reference_for_every_dtype() {
    for ctx in contexts() {
        let (mut bit_equal, mut total) = (0, 0);
        for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
            for (e, k, skew) in [(1u32, 1u32, false), (8, 2, true), (60, 4, true), (128, 8, false)] {
                let m = Model::new(u64::from(e), e, 70, 45, dtype);
                let ffn = m.upload(&ctx);
                let tokens = 37;
                let x = uniform(&mut rng(3), (tokens * m.h) as usize, 1.0);
                let idx = routes(u64::from(e) + 1, tokens, e, k, skew);
                let got = run(&ctx, &ffn, &x, &idx, k, Path::Grouped);
                let want = m.reference(&x, &idx, k);
                let what = format!("{} {dtype:?} E={e} k={k}", ctx.adapter().slug());
                bit_equal += assert_rows_close(&what, &got, &want, m.h as usize);
                total += got.len();
            }
        }
        eprintln!("{}: {bit_equal}/{total} outputs bit-equal to the reference", ctx.adapter().slug());
    }
}

#[test]
fn every_path_is_bitwise_identical() {
    for ctx in contexts() {
        for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
            let (e, k, tokens) = (8u32, 2u32, 40u32);
            let m = Model::new(5, e, 64, 40, dtype);
            let ffn = m.upload(&ctx);
            let x = uniform(&mut rng(8), (tokens * m.h) as usize, 1.0);
            let idx = routes(9, tokens, e, k, true);
            let grouped = run(&ctx, &ffn, &x, &idx, k, Path::Grouped);
            // A bound of 3 sends most rows of the popular experts through the overflow pass.
            let bucketed = run(&ctx, &ffn, &x, &idx, k, Path::Bucketed(3));
            let roomy = run(&ctx, &ffn, &x, &idx, k, Path::Bucketed(tokens * k));
            let decode = run(&ctx, &ffn, &x, &idx, k, Path::Decode);
            let what = format!("{} {dtype:?}", ctx.adapter().slug());
            assert_eq!(bits(&grouped), bits(&bucketed), "{what}: grouped vs bucketed with overflow");
            assert_eq!(bits(&grouped), bits(&roomy), "{what}: grouped vs bucketed without overflow");
            assert_eq!(bits(&grouped), bits(&decode), "{what}: grouped vs row-wise");
            // (d) every token through every expert, then pick each entry's expert.
            let xb = ctx.upload("x", &x).unwrap();
            let h = m.h as usize;
            let all = ctx.zeroed("all", u64::from(e * tokens * m.h) * 4).unwrap();
            let plan = plan_ffn_all_experts(&ctx, &ffn, tokens, &xb, &all).unwrap();
            ctx.run(&plan.dispatches()).unwrap();
            let all: Vec<f32> = ctx.read_back(&all, (e * tokens * m.h) as usize).unwrap();
            let picked: Vec<f32> = idx
                .iter()
                .enumerate()
                .flat_map(|(i, &ex)| {
                    let at = (ex as usize * tokens as usize + i / k as usize) * h;
                    all[at..at + h].to_vec()
                })
                .collect();
            assert_eq!(bits(&grouped), bits(&picked), "{what}: grouped vs every-token-every-expert");
        }
    }
}

#[test]
fn a_tokens_output_does_not_depend_on_its_batch() {
    for ctx in contexts() {
        let (e, k) = (16u32, 4u32);
        let m = Model::new(21, e, 48, 36, WeightDtype::F16);
        let ffn = m.upload(&ctx);
        let h = m.h as usize;
        let mut r = rng(22);
        let token = uniform(&mut r, h, 1.0);
        let token_routes = vec![3u32, 0, 15, 7];
        let batch = |n: u32, at: u32, seed: u64| {
            let mut x = uniform(&mut rng(seed), (n as usize) * h, 1.0);
            let mut idx = routes(seed, n, e, k, true);
            x[at as usize * h..(at as usize + 1) * h].copy_from_slice(&token);
            idx[(at * k) as usize..((at + 1) * k) as usize].copy_from_slice(&token_routes);
            (x, idx)
        };
        let slice = |out: &[f32], at: u32| out[(at * k) as usize * h..((at + 1) * k) as usize * h].to_vec();
        let alone = run(&ctx, &ffn, &token, &token_routes, k, Path::Decode);
        let (x7, i7) = batch(7, 4, 30);
        let in7 = slice(&run(&ctx, &ffn, &x7, &i7, k, Path::Decode), 4);
        let (xb, ib) = batch(4096, 2049, 31);
        let big = run(&ctx, &ffn, &xb, &ib, k, Path::Grouped);
        let in4096 = slice(&big, 2049);
        let (xc, ic) = batch(4096, 17, 32);
        let other = slice(&run(&ctx, &ffn, &xc, &ic, k, Path::Grouped), 17);
        let what = ctx.adapter().slug();
        assert_eq!(bits(&alone), bits(&in7), "{what}: alone vs batch of 7");
        assert_eq!(bits(&alone), bits(&in4096), "{what}: alone vs batch of 4096");
        assert_eq!(bits(&alone), bits(&other), "{what}: batch of 4096 with other neighbours");
        assert_rows_close(&what, &alone, &m.reference(&token, &token_routes, k), h);
    }
}

#[test]
fn dense_gemm_matches_the_reference_dot() {
    for ctx in contexts() {
        let (rows, n, kd) = (45u32, 33u32, 70u32);
        let mut r = rng(40);
        let x = uniform(&mut r, (rows * kd) as usize, 1.0);
        let w = uniform(&mut r, (n * kd) as usize, 0.1);
        let weights = ExpertWeights::from_f32(&ctx, &w, WeightDtype::F32, 1, n, kd).unwrap();
        let (xb, yb) = (ctx.upload("x", &x).unwrap(), ctx.zeroed("y", u64::from(rows * n) * 4).unwrap());
        let block = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict).down;
        ctx.run(
            &plan_dense(&ctx, &weights, rows, &xb, &yb, DenseKernel::Block(block), GemmOrder::Strict)
                .unwrap()
                .dispatches(),
        )
        .unwrap();
        let y: Vec<f32> = ctx.read_back(&yb, (rows * n) as usize).unwrap();
        let yr = ctx.zeroed("y rowwise", u64::from(rows * n) * 4).unwrap();
        ctx.run(
            &plan_dense(&ctx, &weights, rows, &xb, &yr, DenseKernel::Rowwise, GemmOrder::Strict)
                .unwrap()
                .dispatches(),
        )
        .unwrap();
        let rowwise: Vec<f32> = ctx.read_back(&yr, (rows * n) as usize).unwrap();
        assert_eq!(bits(&y), bits(&rowwise), "{}: tiled vs row-wise dense", ctx.adapter().slug());
        let want: Vec<f32> = x
            .chunks(kd as usize)
            .flat_map(|xr| w.chunks(kd as usize).map(move |wr| reference::dot(xr, wr)))
            .collect();
        assert_rows_close(&ctx.adapter().slug(), &y, &want, n as usize);
    }
}

#[test]
fn bad_input_is_an_error() {
    for ctx in contexts() {
        let w = |e, n, k, d| ExpertWeights::from_f32(&ctx, &vec![0.0; (e * n * k) as usize], d, e, n, k);
        let err =
            ExpertWeights::from_f32(&ctx, &[0.0; 10], WeightDtype::F32, 2, 2, 3).unwrap_err().to_string();
        assert!(err.contains("[2, 2, 3] = 12 elements"), "{err}");
        let f32w = WeightDtype::F32;
        let err =
            ExpertFfn::new(w(2, 4, 6, f32w).unwrap(), w(2, 4, 5, f32w).unwrap(), w(2, 6, 4, f32w).unwrap())
                .unwrap_err()
                .to_string();
        assert!(err.contains("`up projection`"), "{err}");
        let err =
            ExpertFfn::new(w(2, 4, 6, f32w).unwrap(), w(2, 4, 6, f32w).unwrap(), w(2, 4, 6, f32w).unwrap())
                .unwrap_err()
                .to_string();
        assert!(err.contains("`down projection`"), "{err}");
        let err = ExpertFfn::new(
            w(2, 4, 6, f32w).unwrap(),
            w(2, 4, 6, WeightDtype::F16).unwrap(),
            w(2, 6, 4, f32w).unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("mix dtypes"), "{err}");
        let tiled = GemmVariant::Tile(TileBlock::tiled(8));
        let ffn =
            ExpertFfn::new(w(2, 4, 6, f32w).unwrap(), w(2, 4, 6, f32w).unwrap(), w(2, 6, 4, f32w).unwrap())
                .unwrap()
                .with_kernels(FfnKernels { order: GemmOrder::Strict, up: tiled, down: tiled })
                .unwrap();
        let (x, idx, out) = (
            ctx.zeroed("x", 4 * 6 * 4).unwrap(),
            ctx.zeroed("i", 4 * 4).unwrap(),
            ctx.zeroed("o", 4 * 6 * 4).unwrap(),
        );
        let bufs = FfnBuffers { x: (&x).into(), indices: (&idx).into(), partial: (&out).into() };
        let layout16 =
            DispatchLayout::new(&ctx, DispatchConfig { experts: 2, k: 1, tile: 16 }, 4, 0).unwrap();
        let err = plan_ffn(&ctx, &ffn, 4, 1, &bufs, FfnRouting::Grouped(&layout16)).unwrap_err().to_string();
        assert!(err.contains("multiple of 32"), "{err}");
        let layout = DispatchLayout::new(&ctx, DispatchConfig { experts: 3, k: 1, tile: 32 }, 4, 0).unwrap();
        let err = plan_ffn(&ctx, &ffn, 4, 1, &bufs, FfnRouting::Grouped(&layout)).unwrap_err().to_string();
        assert!(err.contains("the FFN needs E=2"), "{err}");
        let err = plan_ffn(&ctx, &ffn, 8, 1, &bufs, FfnRouting::Decode).unwrap_err().to_string();
        assert!(err.contains("`x`"), "{err}");
        let err = plan_dense_ffn(&ctx, &ffn, 4, &x, &out).unwrap_err().to_string();
        assert!(err.contains("a dense FFN has one expert; this one has 2"), "{err}");
        for (bad, says) in [
            (GemmVariant::Tile(TileBlock::new(48, 64, 4, 4, 4)), "rows and cols must be 32, 64 or 128"),
            (GemmVariant::TileF16(TileBlock::new(64, 64, 2, 4, 4)), "each must be 4 or 8"),
            (GemmVariant::Tile(TileBlock::new(128, 128, 4, 4, 4)), "1024 invocations"),
            (GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 0)), "bk4 = 0"),
            (GemmVariant::CoopF16(CoopBlock::new(32, 32, 12, 32)), "fragment size 12 must be 8 or 16"),
            (
                GemmVariant::CoopF16(CoopBlock::new(48, 32, 16, 32)),
                "must be 16, 32 or 64 and multiples of 16",
            ),
            (GemmVariant::CoopF16(CoopBlock::new(64, 64, 8, 32)), "64 fragments, at most 16"),
            (GemmVariant::CoopF16(CoopBlock::new(32, 32, 16, 24)), "lanes = 24 must be a power of two"),
        ] {
            let err = FfnKernels { order: GemmOrder::Strict, up: bad, down: bad }
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{}: {err}", bad.name());
        }
    }
    for adapter in common::wgpu_adapters() {
        let limits =
            wgpu::Limits { max_storage_buffer_binding_size: 1 << 12, ..wgpu::Limits::downlevel_defaults() };
        let (device, queue) = pollster::block_on(
            adapter.request_device(&wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() }),
        )
        .unwrap();
        let ctx = Context::from_wgpu(device, queue);
        // Past the binding limit, weights split by expert; one column (row of K) past it is an
        // error, since K is never split.
        let w = ExpertWeights::from_f32(&ctx, &vec![0.0; 8 * 16 * 16], WeightDtype::F32, 8, 16, 16).unwrap();
        assert_eq!(w.chunk_count(), 2);
        let w = ExpertWeights::from_f32(&ctx, &vec![0.0; 8 * 16 * 16], WeightDtype::F16, 4, 16, 32).unwrap();
        assert_eq!(w.chunk_count(), 1);
        let err =
            ExpertWeights::from_f32(&ctx, &vec![0.0; 2 * 2048], WeightDtype::F32, 1, 2, 2048).unwrap_err();
        assert!(
            err.to_string().contains("one output column") && err.to_string().contains("never along K"),
            "{err}"
        );
    }
}

/// Every f16 bit pattern (±0, subnormals, normals, ±infinity, NaNs with their payloads) and
/// every bf16 one loads as the IEEE conversion to f32 gives it, bit for bit: through the packed
/// words (what the kernels' integer widening reads) and, where the adapter has shader-f16, the
/// native f16 loads (under the NaN contract).
#[test]
fn every_16_bit_pattern_loads_exactly() {
    let halves: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    for ctx in contexts() {
        for dtype in [WeightDtype::F16, WeightDtype::Bf16] {
            let values = StoredValues::Float { dtype, bytes: &halves };
            let upload = |native| {
                ExpertWeights::stream(&ctx, dtype, [1, 256, 256], |_| Ok(values), |_| {})
                    .and_then(|w| w.with_native_f16(&ctx, native))
                    .unwrap()
            };
            let w = upload(false);
            let want: Vec<f32> = (0..=u16::MAX)
                .map(|b| match dtype {
                    WeightDtype::F16 => half::f16::from_bits(b).to_f32(),
                    _ => f32::from_bits(u32::from(b) << 16),
                })
                .collect();
            let got = w.unpack(&ctx).unwrap();
            let slug = ctx.adapter().slug();
            assert!(
                bit_identical(&got, &want),
                "{slug} {dtype:?}: pattern {:?}",
                first_difference(&got, &want)
            );
            // Payloads kept exactly by the integer widening: every NaN's mantissa, shifted.
            for (b, g) in (0..=u16::MAX).zip(&got) {
                let (exp, mant) = match dtype {
                    WeightDtype::F16 => ((b >> 10) & 0x1f == 0x1f, u32::from(b & 0x3ff) << 13),
                    _ => ((b >> 7) & 0xff == 0xff, u32::from(b & 0x7f) << 16),
                };
                if exp {
                    assert_eq!(g.to_bits() & 0x007f_ffff, mant, "{slug} {dtype:?}: {b:#06x}");
                }
            }
            if dtype == WeightDtype::F16 && ctx.capabilities().shader_f16 {
                let native = upload(true);
                let got = native.unpack(&ctx).unwrap();
                assert!(bit_identical(&got, &want), "{slug} native f16: {:?}", first_difference(&got, &want));
            }
        }
    }
}

#[test]
fn native_f16_loads_equal_the_packed_path_bitwise() {
    for ctx in contexts() {
        let m = Model::new(50, 8, 52, 36, WeightDtype::F16);
        let upload = |native: bool| {
            let w = |d: &[f32], n, k| {
                ExpertWeights::from_f32(&ctx, d, WeightDtype::F16, m.e, n, k)
                    .and_then(|w| w.with_native_f16(&ctx, native))
            };
            let (g, u, d) = (w(&m.gate, m.f, m.h), w(&m.up, m.f, m.h), w(&m.down, m.h, m.f));
            match (g, u, d) {
                (Ok(g), Ok(u), Ok(d)) => Ok(ExpertFfn::new(g, u, d).unwrap()),
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
            }
        };
        if !ctx.capabilities().shader_f16 {
            let err = upload(true).unwrap_err();
            assert!(err.to_string().contains("shader-f16"), "{err}");
            eprintln!("{}: native f16 skipped: the adapter has no shader-f16", ctx.adapter().slug());
            continue;
        }
        let (native, packed) = (upload(true).unwrap(), upload(false).unwrap());
        assert!(native.gate.native_f16() && !packed.gate.native_f16());
        let (k, tokens) = (2u32, 45u32);
        let x = uniform(&mut rng(51), (tokens * m.h) as usize, 1.0);
        let idx = routes(52, tokens, m.e, k, true);
        for path in [Path::Grouped, Path::Decode] {
            let a = run(&ctx, &native, &x, &idx, k, path);
            let b = run(&ctx, &packed, &x, &idx, k, path);
            assert_eq!(bits(&a), bits(&b), "{} {path:?}: native f16 vs packed", ctx.adapter().slug());
        }
        let err = ExpertWeights::from_f32(&ctx, &m.gate, WeightDtype::Bf16, m.e, m.f, m.h)
            .unwrap()
            .with_native_f16(&ctx, true)
            .unwrap_err();
        assert!(err.to_string().contains("need f16 weights"), "{err}");
    }
}

/// Small variants that exercise every part of the generator (blocks of one, odd lane counts,
/// short K chunks) next to the adapter's defaults.
fn variants_under_test(ctx: &Context) -> Vec<GemmVariant> {
    let d = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    let mut v = vec![
        d.up,
        d.down,
        GemmVariant::Direct(LaneBlock::new(1, 1, 1)),
        GemmVariant::Direct(LaneBlock::new(4, 3, 5)),
        GemmVariant::Direct(LaneBlock::new(32, 2, 8)),
        GemmVariant::Texture(LaneBlock::new(4, 3, 5)),
        GemmVariant::Tile(TileBlock::tiled(1)),
        GemmVariant::Tile(TileBlock::tiled(3)),
        GemmVariant::Tile(TileBlock::wide(64, 4, 1)),
        GemmVariant::Tile(TileBlock::wide(128, 8, 3)),
        GemmVariant::Tile(TileBlock::new(64, 32, 4, 4, 2)),
        GemmVariant::Tile(TileBlock::new(128, 64, 8, 8, 1)),
    ];
    v.dedup();
    v
}

/// Adversarial finite values (±0, exact ties, 1-ULP neighbours) scattered over a random
/// background.
fn adversarial(r: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    let specials = [0.0f32, -0.0, 0.5, f32::from_bits(0x3f00_0001), -0.5, 1e-30, -1e-38];
    let mut v = uniform(r, n, scale);
    for _ in 0..n / 8 {
        let i = r.random_range(0..n);
        v[i] = specials[r.random_range(0..specials.len())];
    }
    v
}

/// Cases over (adapter, dtype, order, up variant, down variant: the up one or the first): a
/// covering set in which every pair of settings meets (`common::covering`; every combination
/// with `MOEFLOW_FULL_SWEEPS=1`), so each variant runs on each adapter, in each dtype and each
/// order, with each down variant.
#[test]
fn every_variant_is_bit_identical_within_an_order() {
    let ctxs = contexts();
    let variants = ctxs.iter().map(|c| variants_under_test(c).len()).max().unwrap_or(0);
    let cases = covering(&[ctxs.len(), 2, 2, variants, 2]);
    side_by_side(&ctxs, |a, ctx| {
        // K = 70 and F = 45 are not multiples of four, N is no multiple of any block, one expert
        // takes most tokens and odd experts past 2 stay empty.
        let (e, h, f, k, tokens) = (8u32, 70u32, 45u32, 2u32, 37u32);
        for (d, dtype) in [WeightDtype::F32, WeightDtype::Bf16].into_iter().enumerate() {
            let mut m = Model::new(60, e, h, f, dtype);
            let mut r = rng(61);
            m.gate = dtype.round(&adversarial(&mut r, m.gate.len(), 0.1), h as usize).unwrap();
            m.down = dtype.round(&adversarial(&mut r, m.down.len(), 0.1), f as usize).unwrap();
            // NaN and ±inf in a few places only, so most outputs stay finite and comparable:
            // token 3 has a NaN input, token 5 an infinite one, expert 0's gate row 2 an
            // infinite weight and expert 1's down row 7 a NaN.
            let mut x = adversarial(&mut r, (tokens * h) as usize, 1.0);
            x[(3 * h + 11) as usize] = f32::NAN;
            x[(5 * h + 69) as usize] = f32::NEG_INFINITY;
            m.gate[(2 * h + 4) as usize] = f32::INFINITY;
            m.down[((h + 7) * f + 44) as usize] = f32::NAN;
            let idx = routes(62, tokens, e, k, true);
            for (o, order) in [GemmOrder::Strict, GemmOrder::Fast].into_iter().enumerate() {
                let here: Vec<&Vec<usize>> = cases.iter().filter(|c| c[..3] == [a, d, o]).collect();
                if here.is_empty() {
                    continue;
                }
                let what = format!("{} {dtype:?} {order:?}", ctx.adapter().slug());
                let ffn_of = |up, down| m.upload(ctx).with_kernels(FfnKernels { order, up, down }).unwrap();
                let under_test = variants_under_test(ctx);
                let first = under_test[0];
                let decode = run(ctx, &ffn_of(first, first), &x, &idx, k, Path::Decode);
                let want = m.reference_in(order, &x, &idx, k);
                let finite: Vec<bool> = want.iter().map(|v| v.is_finite()).collect();
                let (g, w): (Vec<f32>, Vec<f32>) = decode
                    .iter()
                    .zip(&want)
                    .zip(&finite)
                    .filter(|(_, ok)| **ok)
                    .map(|((g, w), _)| (*g, *w))
                    .unzip();
                assert_rows_close(&format!("{what} decode vs reference (finite outputs)"), &g, &w, 1);
                for case in here {
                    let up = under_test[case[3] % under_test.len()];
                    let down = [up, first][case[4]];
                    let grouped = run(ctx, &ffn_of(up, down), &x, &idx, k, Path::Grouped);
                    assert_eq!(
                        bits(&grouped),
                        bits(&decode),
                        "{what}: grouped {} / {} vs row-wise",
                        up.name(),
                        down.name()
                    );
                }
            }
        }
    });
}

/// Quantised weights on every path and kernel family: the grouped (the adapter's defaults,
/// where texture variants run as window blocks, and a tiled block), bucketed with
/// overflow and row-wise decode passes (x from windows and from storage) give the
/// same bits, within the bound of the reference on the quantised values. K = 70 and F = 45 end
/// in partial blocks and groups; one expert takes most tokens and odd experts past 2 stay empty.
/// MXFP4 runs twice: with every scale narrow (the one-product decoding), and with one gate
/// block of values near 1e-38 under the E8M0 scale 2^-127 (the gate and up pass decode bit by
/// bit, the down pass with the product). Every case's decode runs on every adapter; the
/// (adapter, case, check) runs are `common::sweep`'s: a covering set on the adapters other than
/// GL (each check of each case on each), the first check on GL.
#[test]
fn quantised_weights_give_the_same_bits_on_every_path_and_variant() {
    let ctxs = contexts();
    let checks = sweep(&on_gl(&ctxs), &[5, path_checks(1)]);
    side_by_side(&ctxs, |a, ctx| {
        let (e, h, f, k, tokens) = (8u32, 70u32, 45u32, 2u32, 37u32);
        let cases = [
            (WeightDtype::Q8_0, false),
            (WeightDtype::Q4_0, false),
            (WeightDtype::Mxfp4, false),
            (WeightDtype::Mxfp4, true),
            (WeightDtype::Fp8, false),
        ];
        for (c, (dtype, wide)) in cases.into_iter().enumerate() {
            let mut m = Model::new(80, e, h, f, dtype);
            let mut r = rng(81);
            m.gate = adversarial(&mut r, m.gate.len(), 0.1);
            m.down = adversarial(&mut r, m.down.len(), 0.1);
            if wide {
                m.gate[..32].fill(1e-38);
            }
            let gate = ExpertWeights::from_f32(ctx, &m.gate, dtype, e, f, h).unwrap();
            assert_eq!(gate.narrow_scales(), dtype == WeightDtype::Mxfp4 && !wide, "{dtype:?}");
            let x = adversarial(&mut r, (tokens * h) as usize, 1.0);
            let idx = routes(82, tokens, e, k, true);
            let what =
                format!("{} {dtype:?}{}", ctx.adapter().slug(), if wide { " (wide scales)" } else { "" });
            // Each way the kernels load weights once (the loads are the same functions in every
            // variant; compiling all of variants_under_test per format takes minutes on the CPU
            // adapters and in CI's Tint check), with a direct block: with the window ones, the
            // blocks that read quantised rows block by block (x from storage there).
            let direct = GemmVariant::Direct(LaneBlock::new(4, 4, 64));
            let run_check = |i| checks.iter().any(|r| r[..] == [a, c, i]);
            assert_every_path_agrees(ctx, &m, &x, &idx, k, &[direct], &what, run_check);
        }
    });
}

/// The checks of [`assert_every_path_agrees`] with `extra` variants: row-wise from storage,
/// bucketed, and grouped through each of the defaults' two, a tiled block and `extra`.
fn path_checks(extra: usize) -> usize {
    5 + extra
}

/// `m` on every path gives the bits of the row-wise decode with the adapter's default kernels,
/// which is within the bound of the reference. The checks, by number, of which those `run`
/// selects: 0 the row-wise kernel beside tiled blocks (x from storage, not windows), 1 bucketed
/// with overflow, then grouped through the defaults' up and down variants (texture ones run as
/// window blocks for weights without texture copies), a tiled block (weight4_tail) and `extra`.
#[allow(clippy::too_many_arguments)]
fn assert_every_path_agrees(
    ctx: &Context,
    m: &Model,
    x: &[f32],
    idx: &[u32],
    k: u32,
    extra: &[GemmVariant],
    what: &str,
    run_check: impl Fn(usize) -> bool,
) {
    let want = m.reference(x, idx, k);
    let ffn_of =
        |up, down| m.upload(ctx).with_kernels(FfnKernels { order: GemmOrder::Strict, up, down }).unwrap();
    let d = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    let tiled = GemmVariant::Tile(TileBlock::tiled(1));
    let mut variants = vec![d.up, d.down, tiled];
    variants.extend_from_slice(extra);
    let first = variants[0];
    let decode = run(ctx, &ffn_of(first, first), x, idx, k, Path::Decode);
    assert_rows_close(&format!("{what} decode vs reference"), &decode, &want, m.h as usize);
    if run_check(0) {
        let from_storage = run(ctx, &ffn_of(tiled, tiled), x, idx, k, Path::Decode);
        assert_eq!(bits(&from_storage), bits(&decode), "{what}: row-wise from storage vs the defaults");
    }
    if run_check(1) {
        let bucketed = run(ctx, &ffn_of(first, first), x, idx, k, Path::Bucketed(4));
        assert_eq!(bits(&bucketed), bits(&decode), "{what}: bucketed vs row-wise");
    }
    for (i, v) in variants.into_iter().enumerate() {
        if run_check(2 + i) {
            let grouped = run(ctx, &ffn_of(v, v), x, idx, k, Path::Grouped);
            assert_eq!(bits(&grouped), bits(&decode), "{what}: grouped {} vs row-wise", v.name());
        }
    }
}

/// gpt-oss's expert FFN (clamped SwiGLU, gate/up and down biases) in f32 and MXFP4: decode,
/// bucketed with overflow and grouped (defaults and a tiled block) give the same bits, within the
/// bound of the reference. Biases of up to ±12 put many gate and up values past the clamp at
/// ±7 on both sides; one expert takes most tokens and odd experts past 2 stay empty.
/// Both dtypes' decode runs on every adapter; the (adapter, dtype, check) runs are
/// `common::sweep`'s (a covering set on the adapters other than GL, the first on GL).
#[test]
fn clamped_swiglu_with_biases_gives_the_same_bits_on_every_path() {
    let ctxs = contexts();
    let checks = sweep(&on_gl(&ctxs), &[2, path_checks(0)]);
    side_by_side(&ctxs, |a, ctx| {
        let (e, h, f, k, tokens) = (8u32, 96u32, 45u32, 2u32, 37u32);
        for (d, dtype) in [WeightDtype::F32, WeightDtype::Mxfp4].into_iter().enumerate() {
            let mut m = Model::new(90, e, h, f, dtype);
            let mut r = rng(91);
            m.activation = Activation::GPT_OSS;
            let ef = (e * f) as usize;
            m.bias = Some([
                uniform(&mut r, ef, 12.0),
                uniform(&mut r, ef, 12.0),
                uniform(&mut r, (e * h) as usize, 1.0),
            ]);
            let x = adversarial(&mut r, (tokens * h) as usize, 1.0);
            let idx = routes(92, tokens, e, k, true);
            let what = format!("{} {dtype:?}", ctx.adapter().slug());
            let run_check = |i| checks.iter().any(|r| r[..] == [a, d, i]);
            assert_every_path_agrees(ctx, &m, &x, &idx, k, &[], &what, run_check);
            // Biases this large put gate and up values past the clamp on both sides.
            let g_bias = &m.bias.as_ref().unwrap()[0];
            assert!(g_bias.iter().any(|&b| b > 8.0) && g_bias.iter().any(|&b| b < -8.0));
        }
    });
}

/// Biases made for other sizes, and clamped SwiGLU constants out of range, are errors.
#[test]
fn bad_biases_and_activations_are_errors() {
    for ctx in contexts() {
        let m = Model::new(93, 2, 8, 4, WeightDtype::F32);
        let err = ExpertBias::new(&ctx, &[0.0; 8], &[0.0; 8], &[0.0; 15], [2, 4, 8]).unwrap_err();
        assert!(err.to_string().contains("down bias"), "{err}");
        let other = ExpertBias::new(&ctx, &[0.0; 6], &[0.0; 6], &[0.0; 16], [2, 3, 8]).unwrap();
        let err = m.upload(&ctx).with_bias(other).unwrap_err();
        assert!(err.to_string().contains("expert biases"), "{err}");
        for bad in [
            Activation::ClampedSwiglu { alpha: 1.0, limit: 0.0 },
            Activation::ClampedSwiglu { alpha: f32::NAN, limit: 7.0 },
            Activation::ClampedSwiglu { alpha: 1.0, limit: f32::INFINITY },
        ] {
            let err = m.upload(&ctx).with_activation(bad).unwrap_err();
            assert!(err.to_string().contains("clamped SwiGLU"), "{err}");
        }
    }
}

/// Blocks whose tile holds fewer live rows than the block run a narrower copy of the K loop
/// (16-row blocks: 16, 8 or 4 rows; 32-row blocks: 32, 16 or 8): experts with 1, 4, 5, 9,
/// 16, 17 and 33 tokens in 32-row tiles reach every copy (and blocks with no live row), and
/// every variant under test with such copies (direct, window and texture blocks of 8 rows or
/// more; the others' partial tiles are `every_variant_is_bit_identical_within_an_order`'s)
/// gives the row-wise kernel's bits, over `common::sweep`'s (adapter, order, variant) cases: each
/// variant on each adapter other than GL and in each order, the strict default on GL.
#[test]
fn blocks_with_few_live_rows_give_the_row_wise_bits() {
    let ctxs = contexts();
    let with_copies = |ctx: &Context| -> Vec<GemmVariant> {
        let mut v = variants_under_test(ctx);
        v.retain(|v| {
            matches!(v, GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) if b.rows >= 8)
        });
        v
    };
    let variants = ctxs.iter().map(|c| with_copies(c).len()).max().unwrap_or(0);
    let cases = sweep(&on_gl(&ctxs), &[2, variants]);
    side_by_side(&ctxs, |a, ctx| {
        let counts = [1u32, 4, 5, 9, 16, 17, 33];
        let (e, h, f, k) = (counts.len() as u32, 36u32, 20u32, 1u32);
        // Tokens interleaved over the experts, so no expert's rows are contiguous in x.
        let mut idx = Vec::new();
        for round in 0..*counts.iter().max().unwrap_or(&0) {
            idx.extend((0..e).filter(|&x| round < counts[x as usize]));
        }
        let tokens = idx.len() as u32;
        let m = Model::new(70, e, h, f, WeightDtype::F32);
        let x = adversarial(&mut rng(71), (tokens * h) as usize, 1.0);
        for (o, order) in [GemmOrder::Strict, GemmOrder::Fast].into_iter().enumerate() {
            let ffn_of = |up, down| m.upload(ctx).with_kernels(FfnKernels { order, up, down }).unwrap();
            let under_test = with_copies(ctx);
            let first = variants_under_test(ctx)[0];
            let decode = run(ctx, &ffn_of(first, first), &x, &idx, k, Path::Decode);
            for case in cases.iter().filter(|c| c[..2] == [a, o]) {
                let v = under_test[case[2] % under_test.len()];
                let grouped = run(ctx, &ffn_of(v, v), &x, &idx, k, Path::Grouped);
                assert_eq!(
                    bits(&grouped),
                    bits(&decode),
                    "{} {order:?}: grouped {} vs row-wise",
                    ctx.adapter().slug(),
                    v.name()
                );
            }
        }
    });
}

/// Window kernels across many windows and every fallback, bitwise the direct kernels' results:
/// K = 1000 holds 16 rows of x per uniform window (the gate/up pass of 16-row blocks spans
/// several windows; 32-row blocks run as 16-row window blocks), K = 1100 holds 14 (16-row
/// blocks run as 8-row window blocks), and K = 2100 holds 7 (no window block: the direct block).
/// Both orders span windows at K = 1000 / 1100; the fallback at K = 2100 is order-blind (it
/// picks the block) and runs in the strict order (each shape compiles its kernels afresh). The
/// (adapter, shape and order, window block) cases are `common::sweep`'s (a covering set on the
/// adapters other than GL, the first case on GL).
#[test]
fn window_kernels_span_windows_and_fall_back_bitwise() {
    let ctxs = contexts();
    let runs =
        [(1000u32, 1100u32, GemmOrder::Strict), (1000, 1100, GemmOrder::Fast), (2100, 45, GemmOrder::Strict)];
    let cases = sweep(&on_gl(&ctxs), &[runs.len(), 2]);
    side_by_side(&ctxs, |a, ctx| {
        for (r, &(h, f, order)) in runs.iter().enumerate() {
            let chosen: Vec<usize> = cases.iter().filter(|c| c[..2] == [a, r]).map(|c| c[2]).collect();
            if chosen.is_empty() {
                continue;
            }
            let (e, k, tokens) = (2u32, 2u32, 41u32);
            let m = Model::new(63, e, h, f, WeightDtype::F32);
            let x = adversarial(&mut rng(64), (tokens * h) as usize, 1.0);
            let idx = routes(65, tokens, e, k, true);
            let what = format!("{} H={h} F={f} {order:?}", ctx.adapter().slug());
            let run_with = |up, down| {
                let ffn = m.upload(ctx).with_kernels(FfnKernels { order, up, down }).unwrap();
                run(ctx, &ffn, &x, &idx, k, Path::Grouped)
            };
            let direct = GemmVariant::Direct(common::narrow_block(16));
            let want = run_with(direct, direct);
            let reference = m.reference_in(order, &x, &idx, k);
            assert_rows_close(&format!("{what} direct vs reference"), &want, &reference, 1);
            for rows in chosen.into_iter().map(|w| [16, 32][w]) {
                let window = GemmVariant::Window(common::narrow_block(rows));
                let got = run_with(window, window);
                assert_eq!(bits(&got), bits(&want), "{what}: {} vs {}", window.name(), direct.name());
            }
        }
    });
}

/// On a device whose uniform bindings are smaller than a window, window kernels run as the
/// direct block and the row-wise passes read x from storage: the same bits as on a device with
/// windows, on every path (grouped, decode, bucketed with its row-wise overflow).
#[test]
fn small_uniform_bindings_run_without_windows_bitwise() {
    side_by_side(&common::wgpu_adapters(), |_, adapter| {
        let limits = wgpu::Limits { max_uniform_buffer_binding_size: 16384, ..adapter.limits() };
        let (device, queue) = pollster::block_on(
            adapter.request_device(&wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() }),
        )
        .unwrap();
        let small = Context::from_wgpu(device, queue);
        let full = Context::from_adapter(adapter).unwrap();
        let (e, h, f, k, tokens) = (4u32, 72u32, 40u32, 2u32, 6u32);
        let m = Model::new(66, e, h, f, WeightDtype::Bf16);
        let x = adversarial(&mut rng(67), (tokens * h) as usize, 1.0);
        let idx = routes(68, tokens, e, k, true);
        // Whether windows are bound depends on the device's uniform limit, not on the block:
        // a narrow one on every adapter, compiled afresh on each of the two devices (the
        // defaults' own blocks run in the other tests).
        let window = GemmVariant::Window(common::narrow_block(16));
        let kernels = FfnKernels { order: GemmOrder::Strict, up: window, down: window };
        for path in [Path::Grouped, Path::Decode, Path::Bucketed(2)] {
            let what = format!("{} {path:?}", full.adapter().slug());
            let on =
                |ctx: &Context| run(ctx, &m.upload(ctx).with_kernels(kernels).unwrap(), &x, &idx, k, path);
            assert_eq!(bits(&on(&small)), bits(&on(&full)), "{what}: without windows vs with");
        }
    });
}

#[test]
fn fast_order_is_deterministic_and_batch_invariant() {
    for ctx in contexts() {
        let (e, k) = (16u32, 4u32);
        let m = Model::new(70, e, 48, 36, WeightDtype::F16);
        let d = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Fast);
        let ffn = m.upload(&ctx).with_kernels(d).unwrap();
        let h = m.h as usize;
        let x = uniform(&mut rng(71), 300 * h, 1.0);
        let idx = routes(72, 300, e, k, true);
        let once = run(&ctx, &ffn, &x, &idx, k, Path::Grouped);
        let again = run(&ctx, &ffn, &x, &idx, k, Path::Grouped);
        let what = ctx.adapter().slug();
        assert_eq!(bits(&once), bits(&again), "{what}: two runs of the fast order");
        // Token 123 alone (decode path) equals its rows in the batch of 300 (grouped path).
        let t = 123usize;
        let alone = run(&ctx, &ffn, &x[t * h..(t + 1) * h], &idx[t * 4..(t + 1) * 4], k, Path::Decode);
        assert_eq!(
            bits(&alone),
            bits(&once[t * 4 * h..(t + 1) * 4 * h]),
            "{what}: fast order, alone vs batch"
        );
        let strict = run(&ctx, &m.upload(&ctx), &x, &idx, k, Path::Grouped);
        assert_rows_close(
            &format!("{what} fast vs reference"),
            &once,
            &m.reference_in(GemmOrder::Fast, &x, &idx, k),
            h,
        );
        assert_rows_close(&format!("{what} strict vs reference"), &strict, &m.reference(&x, &idx, k), h);
    }
}

/// A device whose storage bindings are at most `limit` bytes, on `adapter`.
fn small_binding_context(adapter: &wgpu::Adapter, limit: u64) -> Context {
    limited_context(adapter, wgpu::Limits { max_storage_buffer_binding_size: limit, ..adapter.limits() })
}

/// A device with `limits` on `adapter`.
fn limited_context(adapter: &wgpu::Adapter, limits: wgpu::Limits) -> Context {
    let (device, queue) = pollster::block_on(
        adapter.request_device(&wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() }),
    )
    .unwrap();
    Context::from_wgpu(device, queue)
}

/// Texture variants read the packed words from texture copies made on the device: rows spread
/// over several array layers, copies made from weights split by output column, odd K (16-bit
/// rows that start mid-word), and weights past the texture limits (which run as the window
/// block): every case bitwise the window kernels' results, on the grouped, bucketed (with its
/// row-wise overflow pass) and row-wise decode paths, in every dtype and both orders (the
/// fallback on the grouped path in the strict order), over `common::sweep`'s (adapter, dtype,
/// order, path) cases: every pair of those settings meets on the adapters other than GL, and GL
/// runs f32, strict, grouped (with the fallback).
#[test]
fn texture_weights_give_the_window_results_bitwise() {
    let adapters = common::wgpu_adapters();
    let cases = sweep(&adapters_on_gl(&adapters), &[3, 2, 3]);
    side_by_side(&adapters, |a, adapter| {
        let whole = Context::from_adapter(adapter).unwrap();
        let slug = whole.adapter().slug();
        // K = 999 is 250 texels, 16 rows per x window; F = 71 is odd.
        let (e, h, f, k, tokens) = (4u32, 999u32, 71u32, 2u32, 5u32);
        let per_expert = WeightDtype::F32.packed_bytes(u64::from(f), u64::from(h));
        // Layers of 256 rows (gate and up 284 rows: 2 layers; down 3996: 16) from weights split
        // by column; and too few layers for any copy.
        let layered = limited_context(
            adapter,
            wgpu::Limits {
                max_texture_dimension_2d: 256,
                max_storage_buffer_binding_size: (per_expert / 2).next_multiple_of(4).max(1 << 16),
                ..adapter.limits()
            },
        );
        let no_room = limited_context(
            adapter,
            wgpu::Limits { max_texture_dimension_2d: 256, max_texture_array_layers: 1, ..adapter.limits() },
        );
        for (d, dtype) in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16].into_iter().enumerate() {
            let m = Model::new(70, e, h, f, dtype);
            let x = adversarial(&mut rng(71), (tokens * h) as usize, 1.0);
            let idx = routes(72, tokens, e, k, true);
            for (o, order) in [GemmOrder::Strict, GemmOrder::Fast].into_iter().enumerate() {
                let window = GemmVariant::Window(common::narrow_block(16));
                let texture = GemmVariant::Texture(common::narrow_block(16));
                let with = |ctx: &Context, v| {
                    m.upload(ctx).with_kernels(FfnKernels { order, up: v, down: v }).unwrap()
                };
                let paths = [Path::Grouped, Path::Bucketed(3), Path::Decode];
                for case in cases.iter().filter(|c| c[..3] == [a, d, o]) {
                    let path = paths[case[3]];
                    let what = format!("{slug} {dtype:?} {order:?} {path:?}");
                    let want = run(&whole, &with(&whole, window), &x, &idx, k, path);
                    // Without room for a copy the texture variant runs the window block: its
                    // kernels, on a device of their own (compiled afresh), checked on the
                    // strict grouped cases.
                    let fallback = order == GemmOrder::Strict && path == Path::Grouped;
                    let devices =
                        [("whole", &whole, true), ("layered", &layered, true), ("no room", &no_room, false)];
                    for &(name, ctx, copied) in &devices[..if fallback { 3 } else { 2 }] {
                        let ffn = with(ctx, texture);
                        let got = run(ctx, &ffn, &x, &idx, k, path);
                        assert_eq!(ffn.gate.has_texture(), copied, "{what} {name}: texture copy made");
                        assert_eq!(ffn.down.has_texture(), copied, "{what} {name}: texture copy made");
                        assert_eq!(bits(&got), bits(&want), "{what} {name}: texture vs window");
                    }
                    if dtype == WeightDtype::F32 && order == GemmOrder::Strict {
                        assert!(
                            with(&layered, texture).gate.chunk_count() > 1,
                            "{slug}: the layered weights are split"
                        );
                    }
                }
            }
        }
    });
}

/// Weights past the binding limit split by expert (several experts per chunk, or one), and an
/// expert past it alone splits by output column: every path gives the unsplit results bit for
/// bit on the same adapter, in both orders: f32 split all three ways, f16 (an odd number of
/// halves per column run) and the quantised formats (rows of whole groups) by column and by
/// expert, bf16 by expert pairs. Each split is a fresh device that compiles its kernels again
/// (SwiftShader keeps no shader cache), so each dtype takes the splits that differ for it, and
/// the (adapter, split, order) cases are `common::sweep`'s: each split on each adapter other
/// than GL and in each order, f32 in two experts per chunk in the strict order on GL.
#[test]
fn split_weights_give_the_unsplit_results_bitwise() {
    // The splits each dtype takes, as indices into (two experts per chunk, one, column runs).
    let split_cases: Vec<(WeightDtype, usize)> = [
        (WeightDtype::F32, &[0usize, 1, 2][..]),
        (WeightDtype::F16, &[2]),
        (WeightDtype::Bf16, &[0]),
        (WeightDtype::Q4_0, &[1, 2]),
        (WeightDtype::Fp8, &[1, 2]),
    ]
    .into_iter()
    .flat_map(|(d, ss)| ss.iter().map(move |&s| (d, s)))
    .collect();
    let adapters = common::wgpu_adapters();
    let cases = sweep(&adapters_on_gl(&adapters), &[split_cases.len(), 2]);
    side_by_side(&adapters, |a, adapter| {
        let whole = Context::from_adapter(adapter).unwrap();
        let slug = whole.adapter().slug();
        // Wide H and few tokens, so the weights, not the activations, meet the limit first.
        let (k, tokens) = (2u32, 5u32);
        // Quantised: one format of each group size (64 and 128 values behind a header); the
        // row layout that splitting relies on is the same for all.
        for dtype in
            [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16, WeightDtype::Q4_0, WeightDtype::Fp8]
        {
            let here: Vec<usize> = (0..split_cases.len()).filter(|&i| split_cases[i].0 == dtype).collect();
            if !cases.iter().any(|c| c[0] == a && here.contains(&c[1])) {
                continue;
            }
            // Quantised rows are 4.25 to 9 bits a value: a larger expert keeps half of one
            // above the activations' and outputs' bindings.
            let (h, f) = if dtype.is_quantised() { (2048, 160) } else { (1024, 72) };
            let m = Model::new(60, 4, h, f, dtype);
            let x = adversarial(&mut rng(61), (tokens * m.h) as usize, 1.0);
            let idx = routes(62, tokens, m.e, k, true);
            let per_expert = dtype.packed_bytes(u64::from(m.f), u64::from(m.h));
            // Two experts per chunk; one; and column runs inside each expert.
            let splits = [(2 * per_expert + 4, 2usize), (per_expert, 4), (per_expert / 2, 8)];
            for &i in &here {
                let orders: Vec<usize> = cases.iter().filter(|c| c[..2] == [a, i]).map(|c| c[2]).collect();
                if orders.is_empty() {
                    continue;
                }
                let (limit, chunks) = splits[split_cases[i].1];
                let split = small_binding_context(adapter, limit.next_multiple_of(4));
                for order in orders.into_iter().map(|o| [GemmOrder::Strict, GemmOrder::Fast][o]) {
                    // Any variant shows the split (all are bit-identical within an order); a
                    // short-chunk tiled kernel compiles fast on a fresh device of every adapter
                    // (SwiftShader keeps no shader cache).
                    let tiled = GemmVariant::Tile(TileBlock::tiled(2));
                    let kernels = FfnKernels { order, up: tiled, down: tiled };
                    let a = m.upload(&whole).with_kernels(kernels).unwrap();
                    let b = m.upload(&split).with_kernels(kernels).unwrap();
                    assert_eq!(a.gate.chunk_count(), 1);
                    assert_eq!(b.gate.chunk_count(), chunks, "{dtype:?} limit {limit}");
                    for path in [Path::Grouped, Path::Bucketed(4), Path::Decode] {
                        let (tokens, x) = match path {
                            Path::Decode => (3, &x[..(3 * m.h) as usize]),
                            _ => (tokens, &x[..]),
                        };
                        let idx = &idx[..(tokens * k) as usize];
                        let ya = run(&whole, &a, x, idx, k, path);
                        let yb = run(&split, &b, x, idx, k, path);
                        assert_eq!(bits(&ya), bits(&yb), "{slug} {dtype:?} {order:?} limit {limit} {path:?}");
                    }
                    // The all-experts oracle and the dense GEMM take a fixed expert's chunks.
                    let dense = |ctx: &Context, w: &ExpertWeights| {
                        let xb = ctx.upload("x", &x[..(5 * m.h) as usize]).unwrap();
                        let y = ctx.zeroed("y", u64::from(5 * m.f) * 4).unwrap();
                        let plan = plan_dense(ctx, w, 5, &xb, &y, DenseKernel::Rowwise, order).unwrap();
                        ctx.run(&plan.dispatches()).unwrap();
                        ctx.read_back::<f32>(&y, (5 * m.f) as usize).unwrap()
                    };
                    assert_eq!(bits(&dense(&whole, &a.gate)), bits(&dense(&split, &b.gate)), "{slug} dense");
                }
            }
        }
    });
}

/// The GEMM modules, whose indices their contract proves in range, built without runtime
/// bounds checks (the default) give the bits of the checked build on every path: grouped
/// through the adapter's defaults and a tiled block, bucketed with overflow, row-wise decode,
/// on adversarial values at sizes that are no multiple of any block. Each dispatch says which
/// build ran: GEMM kernels unchecked unless every module is asked to be checked, the others
/// always checked.
#[test]
fn kernels_without_bounds_checks_give_the_checked_bits() {
    side_by_side(&common::wgpu_adapters(), |_, adapter| {
        let [checked, unchecked] = [BoundsChecks::Everywhere, BoundsChecks::WhereUnproven].map(|c| {
            let ctx = Context::from_adapter(adapter).unwrap();
            ctx.set_bounds_checks(c);
            ctx
        });
        let what = checked.adapter().slug();
        let (e, h, f, k, tokens) = (8u32, 70u32, 45u32, 2u32, 37u32);
        let mut m = Model::new(90, e, h, f, WeightDtype::Bf16);
        let mut r = rng(91);
        m.gate = m.dtype.round(&adversarial(&mut r, m.gate.len(), 0.1), h as usize).unwrap();
        m.down = m.dtype.round(&adversarial(&mut r, m.down.len(), 0.1), f as usize).unwrap();
        let x = adversarial(&mut r, (tokens * h) as usize, 1.0);
        let idx = routes(92, tokens, e, k, true);
        let d = FfnKernels::default_for(AdapterKind::of(checked.adapter()), GemmOrder::Strict);
        let tiled = GemmVariant::Tile(TileBlock::tiled(3));
        for (up, path) in
            [(d.up, Path::Grouped), (tiled, Path::Grouped), (d.up, Path::Bucketed(3)), (d.up, Path::Decode)]
        {
            let [a, b] = [&checked, &unchecked].map(|ctx| {
                let ffn = m.upload(ctx).with_kernels(FfnKernels { up, ..d }).unwrap();
                run(ctx, &ffn, &x, &idx, k, path)
            });
            assert_eq!(bits(&a), bits(&b), "{what}: {} on {path:?}, checked vs unchecked", up.name());
        }
        for (ctx, everywhere) in [(&checked, true), (&unchecked, false)] {
            let ffn = m.upload(ctx).with_kernels(FfnKernels { up: tiled, ..d }).unwrap();
            let (xb, ib) = (ctx.upload("x", &x).unwrap(), ctx.upload("indices", &idx).unwrap());
            let partial = ctx.zeroed("partial", u64::from(tokens * k * h) * 4).unwrap();
            let layout =
                DispatchLayout::new(ctx, DispatchConfig { experts: e, k, tile: 32 }, tokens, 0).unwrap();
            let mut ds = layout.plan(ctx, &ib).unwrap();
            let bufs = FfnBuffers { x: (&xb).into(), indices: (&ib).into(), partial: (&partial).into() };
            ds.extend(
                plan_ffn(ctx, &ffn, tokens, k, &bufs, FfnRouting::Grouped(&layout))
                    .unwrap()
                    .into_dispatches(),
            );
            let proven = ds.iter().filter(|d| d.shader().indexing == Indexing::Proven).count();
            assert!(proven >= 2 && proven < ds.len(), "{what}: {proven} of {} dispatches proven", ds.len());
            for d in &ds {
                let want = everywhere || d.shader().indexing == Indexing::Checked;
                assert_eq!(d.bounds_checked(), want, "{what}: {} ({})", d.shader().name, d.entry());
            }
        }
    });
}

/// Values that test rounding to f16: ties to even at 1 (1 + 2^-11, 1 + 3·2^-11), around the
/// least subnormal (2^-25 ties to zero, 3·2^-25 to 2^-23), the least normal and 65504's
/// neighbours (65519 rounds down), and ±0.
const F16_EDGES: [f32; 10] = [
    1.000_488_3,
    1.001_464_8,
    2.980_232_2e-8,
    8.940_697e-8,
    6.103_515_6e-5,
    6.103_515e-5,
    65519.0,
    -65504.0,
    0.0,
    -0.0,
];

/// f16-staged tiles (`GemmVariant::TileF16`, a precision mode): the grouped FFN gives the
/// reference's bits on f16-rounded operands (x and the weights for gate and up, the
/// activations and the weights for down; to nearest, ties to even) in both orders, on
/// adversarial values with f16 ties, subnormals and 65504's neighbours, and one input past
/// 65504 (infinity: the reference's infinities and NaNs there too); K and F no multiple of a
/// tile. The (adapter, order, block pair) cases are a covering set (`common::covering`).
#[test]
fn f16_staged_tiles_give_the_bits_of_f16_rounded_operands() {
    let ctxs = contexts();
    let cases = covering(&[ctxs.len(), 2, 2]);
    for (a, ctx) in ctxs.iter().enumerate() {
        let (e, h, f, k, tokens) = (8u32, 70u32, 45u32, 2u32, 37u32);
        let mut m = Model::new(100, e, h, f, WeightDtype::F32);
        let mut r = rng(101);
        m.gate = adversarial(&mut r, m.gate.len(), 0.1);
        m.down = adversarial(&mut r, m.down.len(), 0.1);
        let mut x = adversarial(&mut r, (tokens * h) as usize, 1.0);
        for (i, v) in F16_EDGES.iter().enumerate() {
            x[i * 37 + 5] = *v;
            m.gate[i * 101 + 3] = *v * 1e-4;
            m.up[i * 89 + 1] = *v;
        }
        x[(6 * h + 9) as usize] = 65520.0;
        let idx = routes(102, tokens, e, k, true);
        for (o, order) in [GemmOrder::Strict, GemmOrder::Fast].into_iter().enumerate() {
            let want = m.reference_with(order, true, &x, &idx, k);
            let pairs = [
                (
                    GemmVariant::TileF16(TileBlock::new(64, 32, 4, 4, 2)),
                    GemmVariant::TileF16(TileBlock::new(64, 64, 8, 4, 3)),
                ),
                (
                    GemmVariant::TileF16(TileBlock::new(128, 64, 8, 8, 1)),
                    GemmVariant::TileF16(TileBlock::new(128, 64, 8, 8, 1)),
                ),
            ];
            for case in cases.iter().filter(|c| c[..2] == [a, o]) {
                let (up, down) = pairs[case[2]];
                let ffn = m.upload(ctx).with_kernels(FfnKernels { order, up, down }).unwrap();
                let got = run(ctx, &ffn, &x, &idx, k, Path::Grouped);
                let what = format!("{} {order:?} {} / {}", ctx.adapter().slug(), up.name(), down.name());
                assert!(want.iter().any(|v| v.is_infinite() || v.is_nan()), "{what}: no infinity reached");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let same = if w.is_nan() { g.is_nan() } else { g.to_bits() == w.to_bits() };
                    assert!(same, "{what}: entry {} column {}: {g} vs {w}", i / h as usize, i % h as usize);
                }
            }
        }
    }
}

/// The documented bound of f16-staged tiles against the exact f32 reference: every output of a
/// dense projection within `2^-10·S + 2^-24·A + (K/2 + 4)·2^-23·S` (S = Σ|x_k·w_k|,
/// A = Σ(|x_k| + |w_k|)), here on values spread over f16's whole finite range and its
/// subnormals (and rows of one f16 edge value each, where every rounding shows), and bitwise
/// the dot of the rounded operands.
#[test]
fn f16_staged_tiles_stay_within_their_bound_of_f32() {
    for ctx in contexts() {
        let (rows, n, kd) = (70u32, 50u32, 301u32);
        let mut r = rng(110);
        // Magnitudes from 2^-26 to 2^8, so products stay well inside f32's normal range.
        let spread = |r: &mut dyn rand::RngCore, len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    let e: i32 = r.random_range(-26..8);
                    let s = if r.random_bool(0.5) { -1.0 } else { 1.0 };
                    s * r.random_range(1.0f32..2.0) * 2f32.powi(e)
                })
                .collect()
        };
        let mut x = spread(&mut r, (rows * kd) as usize);
        // Rows 0..10 hold one value each, an F16_EDGES value: each output of those rows is one
        // product, so every rounding of it shows in the bits.
        for (i, v) in F16_EDGES.iter().enumerate() {
            let row = &mut x[i * kd as usize..(i + 1) * kd as usize];
            row.fill(0.0);
            row[3 * i] = *v;
        }
        let w = spread(&mut r, (n * kd) as usize);
        let wb = ExpertWeights::from_f32(&ctx, &w, WeightDtype::F32, 1, n, kd).unwrap();
        let xb = ctx.upload("x", &x).unwrap();
        let y = ctx.zeroed("y", u64::from(rows * n) * 4).unwrap();
        let tile = GemmVariant::TileF16(TileBlock::new(64, 32, 4, 4, 4));
        let plan = plan_dense(&ctx, &wb, rows, &xb, &y, DenseKernel::Block(tile), GemmOrder::Strict).unwrap();
        ctx.run(&plan.dispatches()).unwrap();
        let got: Vec<f32> = ctx.read_back(&y, (rows * n) as usize).unwrap();
        let (xr, wr) = (reference::round_f16(&x), reference::round_f16(&w));
        let kd = kd as usize;
        let mut worst = 0.0f64;
        for i in 0..rows as usize {
            for c in 0..n as usize {
                let (xi, wc) = (&x[i * kd..(i + 1) * kd], &w[c * kd..(c + 1) * kd]);
                let g = got[i * n as usize + c];
                let staged = reference::dot(&xr[i * kd..(i + 1) * kd], &wr[c * kd..(c + 1) * kd]);
                assert_eq!(
                    g.to_bits(),
                    staged.to_bits(),
                    "{}: ({i}, {c}) vs the rounded dot",
                    ctx.adapter().slug()
                );
                let exact = reference::dot(xi, wc);
                let s: f64 = xi.iter().zip(wc).map(|(a, b)| f64::from(a.abs()) * f64::from(b.abs())).sum();
                let a: f64 = xi.iter().chain(wc).map(|v| f64::from(v.abs())).sum();
                let bound =
                    2f64.powi(-10) * s + 2f64.powi(-24) * a + (kd as f64 / 2.0 + 4.0) * 2f64.powi(-23) * s;
                let err = (f64::from(g) - f64::from(exact)).abs();
                assert!(
                    err <= bound,
                    "{}: ({i}, {c}): {g} vs {exact}, error {err} past {bound}",
                    ctx.adapter().slug()
                );
                worst = worst.max(err / bound);
            }
        }
        eprintln!("{}: worst error {worst:.3} of the bound", ctx.adapter().slug());
    }
}

/// Cooperative-matrix blocks (`GemmVariant::CoopF16`, a precision mode): where the device was
/// created with cooperative matrices of f16 into f32 and one subgroup size, the grouped FFN
/// plans (after the kernel's own check against the reference on the device, `check_on_device`)
/// and stays within 1% of the row scale of the exact reference; everywhere else (every CPU adapter) planning is
/// refused by name, before anything is dispatched.
#[test]
fn coop_blocks_run_only_where_the_device_has_cooperative_matrices() {
    for ctx in contexts() {
        let a = ctx.adapter().clone();
        let (e, h, f, k, tokens) = (8u32, 70u32, 45u32, 2u32, 37u32);
        let m = Model::new(120, e, h, f, WeightDtype::F32);
        let x = uniform(&mut rng(121), (tokens * h) as usize, 1.0);
        let idx = routes(122, tokens, e, k, true);
        let lanes = a.subgroup_sizes[1].max(4);
        let block = GemmVariant::CoopF16(CoopBlock::new(32, 32, 16, lanes));
        let usable = a.capabilities.cooperative_matrix
            && a.cooperative_f16_sizes.contains(&16)
            && a.subgroup_sizes == [lanes, lanes];
        let kernels = FfnKernels { order: GemmOrder::Strict, up: block, down: block };
        let ffn = m.upload(&ctx).with_kernels(kernels).unwrap();
        if usable {
            check_on_device(&ctx, &[block]).expect("the device check passes");
            let got = run(&ctx, &ffn, &x, &idx, k, Path::Grouped);
            let want = m.reference(&x, &idx, k);
            for (row, (g, w)) in got.chunks(h as usize).zip(want.chunks(h as usize)).enumerate() {
                let scale = w.iter().fold(0f32, |s, v| s.max(v.abs())).max(1e-6);
                for (c, (gv, wv)) in g.iter().zip(w).enumerate() {
                    assert!(
                        (gv - wv).abs() <= 0.01 * scale,
                        "{}: entry {row} column {c}: {gv} vs {wv}",
                        a.slug()
                    );
                }
            }
            eprintln!("{}: cooperative blocks ran", a.slug());
            continue;
        }
        let layout =
            DispatchLayout::new(&ctx, DispatchConfig { experts: e, k, tile: 32 }, tokens, 0).unwrap();
        let (xb, ib) = (ctx.upload("x", &x).unwrap(), ctx.upload("indices", &idx).unwrap());
        let partial = ctx.zeroed("partial", u64::from(tokens * k * h) * 4).unwrap();
        let bufs = FfnBuffers { x: (&xb).into(), indices: (&ib).into(), partial: (&partial).into() };
        let err = plan_ffn(&ctx, &ffn, tokens, k, &bufs, FfnRouting::Grouped(&layout)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, moeflow::Error::MissingFeature(_)), "{}: {text}", a.slug());
        assert!(
            text.contains("coop-r32c32-n16") && text.contains("cooperative matrices"),
            "{}: {text}",
            a.slug()
        );
        let checked = check_on_device(&ctx, &[block]).unwrap_err();
        assert!(matches!(checked, moeflow::Error::MissingFeature(_)), "{}: {checked}", a.slug());
        eprintln!("{}: refused as expected: {text}", a.slug());
    }
}
