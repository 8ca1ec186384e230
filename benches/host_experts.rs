//! The host expert stage on this CPU: [`HostExperts::run`] over the rows `tokens` tokens route
//! to `k` of `E` experts held in host memory, at Qwen3-30B-A3B's expert shape by default
//! (E = 128, k = 8, H = 2048, F = 768), per stored dtype. Each case: the weights made in their
//! stored format (random values; quantised blocks random codes under fixed scales),
//! `--routings` routings drawn up front (each token `k` distinct experts, seeded) and taken in
//! turn, `--warmup` runs, then `--iters` timed runs; one JSON line per case with the median,
//! minimum and maximum in milliseconds, the threads and the SIMD target.
//!
//! One routing (the default) reads the same experts every run, as ggml's `test-backend-ops`
//! perf mode does: where the last-level cache holds them, they are timed from it. Several
//! routings read other experts each run, from memory, as a model's decode does (each layer's
//! experts are new to the caches).
//!
//! MXFP4 is held in gpt-oss's layout (codes, and each block's scale byte apart) or, with
//! `--mxfp4-layout ggml`, as ggml's `block_mxfp4` (a GGUF file's bytes: the scale byte, then
//! the codes), the bytes ggml's own MXFP4 `MUL_MAT_ID` reads.
//!
//! `cargo bench --bench host_experts -- --dtypes f32,q4_0 --tokens 1,8` (tools/host_abba.sh
//! interleaves it with ggml's CPU `MUL_MAT_ID`).

use std::time::Instant;

use clap::Parser;
use half::f16;
use moeflow::host_experts::{HostEntry, HostExperts, HostProjection};
use moeflow::kernels::gemm::{Activation, GemmOrder, QuantisedValues, StoredValues, WeightDtype};
use rand::seq::index::sample;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Parser)]
struct Args {
    /// Stored dtypes: f32, f16, bf16, q8_0, q4_0, mxfp4.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16,q8_0,q4_0,mxfp4")]
    dtypes: Vec<String>,
    /// Token counts.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    tokens: Vec<u32>,
    #[arg(long, default_value_t = 128)]
    experts: u32,
    #[arg(long, default_value_t = 8)]
    k: u32,
    #[arg(long, default_value_t = 2048)]
    hidden: u32,
    #[arg(long, default_value_t = 768)]
    ffn: u32,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Routings taken in turn, one a run (1: the same experts every run).
    #[arg(long, default_value_t = 1)]
    routings: usize,
    /// MXFP4's layout: gpt-oss (codes and scales apart) or ggml (`block_mxfp4`).
    #[arg(long, default_value = "gpt-oss", value_parser = ["gpt-oss", "ggml"])]
    mxfp4_layout: String,
    /// Threads (rayon's global pool, one per core, when not given).
    #[arg(long)]
    threads: Option<usize>,
    /// The accumulation order: strict or fast.
    #[arg(long, default_value = "strict")]
    order: String,
    /// cargo bench passes `--bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn dtype(name: &str) -> WeightDtype {
    serde_json::from_value(serde_json::Value::String(name.to_string()))
        .unwrap_or_else(|_| panic!("unknown dtype {name}"))
}

/// One projection `[e, n, k]` in `dtype`'s stored layout: (bytes, MXFP4 scales); MXFP4 as
/// ggml's blocks (scale byte first, no scales apart) where `ggml`.
fn stored(rng: &mut ChaCha8Rng, dtype: WeightDtype, [e, n, k]: [usize; 3], ggml: bool) -> (Vec<u8>, Vec<u8>) {
    let values = e * n * k;
    let blocks = values / 32;
    let mut fill = |len: usize| {
        let mut b = vec![0u8; len];
        rng.fill_bytes(&mut b);
        b
    };
    match dtype {
        WeightDtype::F32 => {
            let mut b = fill(values * 4);
            for w in b.chunks_exact_mut(4) {
                let v = (f32::from(w[0]) - 127.5) / 2048.0;
                w.copy_from_slice(&v.to_le_bytes());
            }
            (b, Vec::new())
        }
        WeightDtype::F16 | WeightDtype::Bf16 => {
            let mut b = fill(values * 2);
            for w in b.chunks_exact_mut(2) {
                let v = (f32::from(w[0]) - 127.5) / 2048.0;
                let bits = if dtype == WeightDtype::F16 {
                    f16::from_f32(v).to_le_bytes()
                } else {
                    half::bf16::from_f32(v).to_le_bytes()
                };
                w.copy_from_slice(&bits);
            }
            (b, Vec::new())
        }
        WeightDtype::Q8_0 | WeightDtype::Q4_0 => {
            let per = if dtype == WeightDtype::Q8_0 { 34 } else { 18 };
            let mut b = fill(blocks * per);
            for block in b.chunks_exact_mut(per) {
                block[..2].copy_from_slice(&f16::from_f32(0.001).to_le_bytes());
            }
            (b, Vec::new())
        }
        WeightDtype::Mxfp4 if ggml => {
            let mut b = fill(blocks * 17);
            for block in b.chunks_exact_mut(17) {
                block[0] = 118;
            }
            (b, Vec::new())
        }
        WeightDtype::Mxfp4 => (fill(blocks * 16), vec![118u8; blocks]),
        other => panic!("{other:?} is not a case of this bench"),
    }
}

/// Expert `x`'s values of a projection stored by [`stored`].
fn expert<'a>(
    dtype: WeightDtype,
    (bytes, scales): &'a (Vec<u8>, Vec<u8>),
    x: usize,
    per: usize,
) -> StoredValues<'a> {
    let part = |v: &'a [u8], each: usize| &v[x * each..(x + 1) * each];
    match dtype {
        WeightDtype::F32 => StoredValues::Float { dtype, bytes: part(bytes, per * 4) },
        WeightDtype::F16 | WeightDtype::Bf16 => StoredValues::Float { dtype, bytes: part(bytes, per * 2) },
        WeightDtype::Q8_0 => StoredValues::Quantised(QuantisedValues::Q8_0(part(bytes, per / 32 * 34))),
        WeightDtype::Q4_0 => StoredValues::Quantised(QuantisedValues::Q4_0(part(bytes, per / 32 * 18))),
        _ => StoredValues::Quantised(QuantisedValues::Mxfp4 {
            codes: part(bytes, per / 32 * 16),
            scales: part(scales, per / 32),
        }),
    }
}

fn main() {
    let args = Args::parse();
    let (e, f, h) = (args.experts as usize, args.ffn as usize, args.hidden as usize);
    let order = match args.order.as_str() {
        "fast" => GemmOrder::Fast,
        _ => GemmOrder::Strict,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(54);
    for name in &args.dtypes {
        let dt = dtype(name);
        let shapes = [[e, f, h], [e, f, h], [e, h, f]];
        let ggml = dt == WeightDtype::Mxfp4 && args.mxfp4_layout == "ggml";
        let data: Vec<_> = shapes.iter().map(|&s| stored(&mut rng, dt, s, ggml)).collect();
        let projections: Vec<HostProjection<'_>> = shapes
            .iter()
            .zip(&data)
            .map(|(&[e, n, k], d)| {
                let mut p = HostProjection::new([e as u32, n as u32, k as u32]).expect("shape");
                for x in 0..e {
                    if ggml {
                        let per = n * k / 32 * 17;
                        p.hold_ggml_mxfp4(x as u32, &d.0[x * per..(x + 1) * per]).expect("ggml's blocks");
                    } else {
                        p.hold(x as u32, expert(dt, d, x, n * k)).expect("stored values");
                    }
                }
                p
            })
            .collect();
        let [gate, up, down]: [HostProjection<'_>; 3] = projections.try_into().expect("three projections");
        let mut host = HostExperts::new(gate, up, down, order, Activation::Swiglu).expect("host experts");
        if let Some(t) = args.threads {
            host = host.with_threads(t).expect("threads");
        }
        for &tokens in &args.tokens {
            let x: Vec<f32> = (0..tokens as usize * h).map(|_| rng.random_range(-1.0..1.0)).collect();
            let routings: Vec<Vec<HostEntry>> = (0..args.routings.max(1))
                .map(|_| {
                    (0..tokens)
                        .flat_map(|t| {
                            sample(&mut rng, e, args.k as usize)
                                .into_iter()
                                .map(move |x| HostEntry { token: t, expert: x as u32 })
                                .collect::<Vec<_>>()
                        })
                        .collect()
                })
                .collect();
            let mut out = vec![0.0f32; (tokens * args.k) as usize * h];
            let mut turn = routings.iter().cycle();
            let mut next = || turn.next().expect("at least one routing");
            for _ in 0..args.warmup {
                host.run(&x, next(), &mut out).expect("run");
            }
            let mut ms: Vec<f64> = (0..args.iters)
                .map(|_| {
                    let entries = next();
                    let start = Instant::now();
                    host.run(&x, entries, &mut out).expect("run");
                    start.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            ms.sort_by(f64::total_cmp);
            let mut line = serde_json::json!({
                "case": "host_experts", "dtype": name, "tokens": tokens, "experts": e, "k": args.k,
                "hidden": h, "ffn": f, "order": args.order, "threads": host.threads(),
                "simd": HostExperts::simd(), "iters": args.iters, "routings": routings.len(),
                "median_ms": ms[ms.len() / 2], "min_ms": ms[0], "max_ms": ms[ms.len() - 1],
                "weight_bytes": host.bytes(),
            });
            if dt == WeightDtype::Mxfp4 {
                line["mxfp4_layout"] = args.mxfp4_layout.clone().into();
            }
            println!("{line}");
        }
    }
}
