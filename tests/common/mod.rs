//! Shared test helpers: one context per adapter, seeded data, and float comparison.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use moeflow::Context;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One context per adapter. With no adapter at all, the calling test fails when
/// `MOEFLOW_REQUIRE_ADAPTER=1` and otherwise prints why it does nothing.
///
/// Contexts on Vulkan, Metal and DX12 adapters are made once per test process and shared by
/// its tests (wgpu's error scopes are per thread, so concurrent tests do not see each other's
/// errors), so each pipeline is compiled once per process: SwiftShader keeps no shader cache
/// across devices, and compiling the GEMM kernels anew for every test dominated its run. GL
/// contexts are made fresh on every call: wgpu runs a GL device behind one lock that panics
/// after six seconds of waiting, which concurrent tests on one device could reach.
pub fn contexts() -> Vec<Arc<Context>> {
    static SHARED: OnceLock<Vec<Arc<Context>>> = OnceLock::new();
    let open = |gl: bool| -> Vec<Arc<Context>> {
        moeflow::wgpu_adapters()
            .iter()
            .filter(|a| (a.get_info().backend == wgpu::Backend::Gl) == gl)
            .map(|a| {
                Arc::new(Context::from_adapter(a).expect("creating a device on an adapter that wgpu listed"))
            })
            .collect()
    };
    let mut ctxs = SHARED.get_or_init(|| open(false)).clone();
    ctxs.extend(open(true));
    require_some(ctxs.len());
    ctxs
}

/// Every wgpu adapter (for tests that create their own devices), with the same rule.
pub fn wgpu_adapters() -> Vec<wgpu::Adapter> {
    let adapters = moeflow::wgpu_adapters();
    require_some(adapters.len());
    adapters
}

fn require_some(found: usize) {
    if found == 0 {
        if std::env::var("MOEFLOW_REQUIRE_ADAPTER").as_deref() == Ok("1") {
            panic!("MOEFLOW_REQUIRE_ADAPTER=1 but wgpu found no adapter (install mesa-vulkan-drivers)");
        }
        eprintln!("skipped: wgpu found no adapter (install mesa-vulkan-drivers to run GPU tests)");
    }
}

/// Runs `check` on each of `items` (contexts or adapters, with its index) at once, one thread
/// each, and returns when all have finished; a panic on any thread fails the caller then.
///
/// The CPU adapters compile a pipeline at its first dispatch, which is most of a cold run's
/// time; run one after another, one adapter's compiles wait for the other's while a core idles.
pub fn side_by_side<T: Sync>(items: &[T], check: impl Fn(usize, &T) + Sync) {
    std::thread::scope(|s| {
        for (i, item) in items.iter().enumerate() {
            let check = &check;
            s.spawn(move || check(i, item));
        }
    });
}

/// A lane block of `rows` rows, one column and 8 lanes, for the tests whose subject is not the
/// register block (window spanning, texture copies, binding and device limits, the tuner's
/// awaiting): the windows, texels and padded rows a block reads depend on its rows and K, not
/// on its columns, and a block of one column compiles in seconds where a 16 x 8 one takes the
/// CPU adapters 4 to 16 s (SwiftShader minutes).
pub const fn narrow_block(rows: u32) -> moeflow::kernels::gemm::LaneBlock {
    moeflow::kernels::gemm::LaneBlock::new(rows, 1, 8)
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// k distinct experts per token; with `skew`, experts are drawn towards 0 and odd ones above 2
/// stay empty.
pub fn routes(seed: u64, tokens: u32, e: u32, k: u32, skew: bool) -> Vec<u32> {
    let mut r = rng(seed);
    let mut out = Vec::new();
    for _ in 0..tokens {
        let start = out.len();
        while out.len() - start < k as usize {
            let c = if skew {
                let u: f32 = r.random::<f32>();
                let x = ((u * u * e as f32) as u32).min(e - 1);
                if x > 2 && x % 2 == 1 { x - 1 } else { x }
            } else {
                r.random_range(0..e)
            };
            if !out[start..].contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

pub fn uniform(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// The project's float bound: |got - want| <= 2e-5 + 2e-5 * |want|, NaN only where NaN.
pub fn close(got: f32, want: f32) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return want == got;
    }
    (got - want).abs() <= 2e-5 + 2e-5 * want.abs()
}

/// Asserts elementwise closeness; returns how many elements were bit-equal.
pub fn assert_close(what: &str, got: &[f32], want: &[f32]) -> usize {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut bit_equal = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(close(*g, *w), "{what}[{i}]: got {g:e}, reference {w:e}");
        bit_equal += usize::from(moeflow::bits::same_bits(*g, *w));
    }
    bit_equal
}

/// The values' bits under the bit-identity contract (`moeflow::bits`: any NaN as the canonical
/// one), for `assert_eq!` between variants that claim the same bits.
pub fn bits(v: &[f32]) -> Vec<u32> {
    moeflow::bits::canonical(v)
}

/// Bound relative to each row's scale: |got - ref| <= 2e-5 + 2e-5 * max|ref row| (the scale
/// over the row's finite values), for outputs of sums whose terms cancel; NaN only against NaN
/// and an infinity only against itself, as [`close`]. Returns how many elements were
/// bit-equal, or the first element out of bounds.
pub fn rows_close(got: &[f32], want: &[f32], width: usize) -> Result<usize, String> {
    if got.len() != want.len() {
        return Err(format!("{} values, want {}", got.len(), want.len()));
    }
    let mut bit_equal = 0;
    for (r, (g, w)) in got.chunks(width).zip(want.chunks(width)).enumerate() {
        let scale = w.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        for (c, (&a, &b)) in g.iter().zip(w).enumerate() {
            let within = if a.is_nan() || b.is_nan() || a.is_infinite() || b.is_infinite() {
                close(a, b)
            } else {
                (a - b).abs() <= 2e-5 + 2e-5 * scale
            };
            if !within {
                return Err(format!("row {r} col {c}: got {a:e}, reference {b:e}"));
            }
            bit_equal += usize::from(moeflow::bits::same_bits(a, b));
        }
    }
    Ok(bit_equal)
}

/// [`rows_close`], panicking with `what` on the first element out of bounds.
pub fn assert_rows_close(what: &str, got: &[f32], want: &[f32], width: usize) -> usize {
    rows_close(got, want, width).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Whether the sweeps run in full (`MOEFLOW_FULL_SWEEPS=1`): every combination of their
/// dimensions, as a developer runs them when changing a kernel family, instead of
/// [`covering`]'s set.
pub fn full_sweeps() -> bool {
    std::env::var("MOEFLOW_FULL_SWEEPS").as_deref() == Ok("1")
}

/// The cases of a sweep over dimensions of `sizes` values each, as index tuples in the
/// product's order: every combination under [`full_sweeps`], else a covering set in which
/// every pair of values of any two dimensions occurs together at least once (greedy: each
/// case taken is the first of the product that covers the most pairs not yet covered), so a
/// fault that needs two settings at once is still reached.
pub fn covering(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut product: Vec<Vec<usize>> = vec![Vec::new()];
    for &n in sizes {
        product = product.iter().flat_map(|p| (0..n).map(move |v| [p.as_slice(), &[v]].concat())).collect();
    }
    if full_sweeps() || sizes.len() < 2 {
        return product;
    }
    let pairs_of = |case: &[usize]| -> Vec<(usize, usize, usize, usize)> {
        let mut out = Vec::new();
        for a in 0..case.len() {
            for b in a + 1..case.len() {
                out.push((a, case[a], b, case[b]));
            }
        }
        out
    };
    let mut uncovered: std::collections::HashSet<_> = product.iter().flat_map(|c| pairs_of(c)).collect();
    let mut chosen = Vec::new();
    while !uncovered.is_empty() {
        let gain = |c: &Vec<usize>| pairs_of(c).iter().filter(|p| uncovered.contains(p)).count();
        let best = product.iter().max_by_key(|c| (gain(c), std::cmp::Reverse(*c))).cloned();
        let Some(best) = best else { break };
        for p in pairs_of(&best) {
            uncovered.remove(&p);
        }
        chosen.push(best);
    }
    chosen.sort();
    chosen
}

/// The cases of a sweep over adapters (`gl[i]`: whether adapter `i` runs on GL) and dimensions
/// of `sizes` values, as index tuples with the adapter's index first. The adapters that are
/// not GL take a [`covering`] set of (adapter, dimensions...) between them: every pair of
/// settings meets, each setting on each of them. A GL adapter, where another adapter is there
/// to take that share, runs the first case only (`MOEFLOW_FULL_SWEEPS=1`: all of them, as
/// every other adapter): for the sweeps that use this, what varies between cases is host-side
/// planning (weight splits, texture placement, uniform windows) or a kernel's specialisation,
/// which naga's GLSL back end translates the same way for every case, while llvmpipe compiles
/// each GL pipeline at about twice lavapipe's cost (GL's compiles were about half of a cold
/// run of the suite: docs/portability.md).
pub fn sweep(gl: &[bool], sizes: &[usize]) -> Vec<Vec<usize>> {
    let lean: Vec<bool> = gl.iter().map(|&g| g && !full_sweeps() && gl.iter().any(|&o| !o)).collect();
    let full: Vec<usize> = (0..gl.len()).filter(|&i| !lean[i]).collect();
    let dims = [&[full.len()][..], sizes].concat();
    let mut cases: Vec<Vec<usize>> = covering(&dims)
        .into_iter()
        .map(|mut c| {
            c[0] = full[c[0]];
            c
        })
        .collect();
    for i in (0..gl.len()).filter(|&i| lean[i]) {
        cases.push([&[i][..], &vec![0; sizes.len()]].concat());
    }
    cases
}

/// Whether each of `ctxs` runs on GL, for [`sweep`].
pub fn on_gl(ctxs: &[Arc<Context>]) -> Vec<bool> {
    ctxs.iter().map(|c| c.adapter().backend == "gl").collect()
}

/// Whether each of `adapters` runs on GL, for [`sweep`].
pub fn adapters_on_gl(adapters: &[wgpu::Adapter]) -> Vec<bool> {
    adapters.iter().map(|a| a.get_info().backend == wgpu::Backend::Gl).collect()
}

/// A GGUF file of one Qwen2-MoE layer (`blk.0.`): `e` experts of `[f, h]` gate and up and
/// `[h, f]` down, `k` of them per token, the router `[e, h]` f32, each expert tensor `(type,
/// bytes)` as ggml stores it.
#[cfg(feature = "checkpoint")]
pub fn qwen2moe_gguf(
    [h, f, e, k]: [u64; 4],
    router: &[f32],
    [gate, up, down]: [(moeflow::weights::gguf::GgmlType, Vec<u8>); 3],
) -> Vec<u8> {
    use moeflow::weights::gguf::{GgmlType, GgufValue, GgufWriter};
    GgufWriter::default()
        .metadata("general.architecture", GgufValue::Str("qwen2moe".into()))
        .metadata("qwen2moe.block_count", GgufValue::U32(1))
        .metadata("qwen2moe.embedding_length", GgufValue::U32(h as u32))
        .metadata("qwen2moe.expert_count", GgufValue::U32(e as u32))
        .metadata("qwen2moe.expert_used_count", GgufValue::U32(k as u32))
        .metadata("qwen2moe.expert_feed_forward_length", GgufValue::U32(f as u32))
        .tensor(
            "blk.0.ffn_gate_inp.weight",
            &[h, e],
            GgmlType::F32,
            router.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
        .tensor("blk.0.ffn_gate_exps.weight", &[h, f, e], gate.0, gate.1)
        .tensor("blk.0.ffn_up_exps.weight", &[h, f, e], up.0, up.1)
        .tensor("blk.0.ffn_down_exps.weight", &[f, h, e], down.0, down.1)
        .to_bytes()
}
