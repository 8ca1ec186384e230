//! The host experts (`moeflow::host_experts`, the CPU's expert FFN) against the CPU reference,
//! bit for bit: every stored dtype, both orders, both activations with biases, adversarial
//! inputs, sizes that are multiples of no block, any thread count; and bad placements.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use moeflow::bits::canonical;
use moeflow::host_experts::{HostBias, HostEntry, HostExperts, HostProjection};
use moeflow::kernels::gemm::{Activation, GemmOrder, QuantisedValues, StoredValues, WeightDtype};
use moeflow::reference::gemm::{FfnBias, FfnWeights, ffn_row};
use moeflow::synth::StoredExperts;

/// The experts `held` of `stored` on the host.
fn host<'a>(stored: &'a StoredExperts, held: &[u32]) -> HostProjection<'a> {
    let mut p = HostProjection::new(stored.shape()).unwrap();
    for &x in held {
        p.hold(x, stored.expert(x)).unwrap();
    }
    p
}

/// Makes block `b`'s scale infinite (Q8_0, Q4_0) or NaN (MXFP4): its values are ±inf or NaN
/// in the decoded weights too.
fn poison_block(stored: &mut StoredExperts, b: usize) {
    let bits = if stored.dtype() == WeightDtype::Mxfp4 { 255 } else { f16::INFINITY.to_bits() };
    stored.set_block_scale(b, bits).unwrap();
}

/// Makes the scales of `blocks` the format's smallest (Q8_0, Q4_0: a subnormal f16; MXFP4:
/// 2^-127).
fn tiny_blocks(stored: &mut StoredExperts, blocks: std::ops::Range<usize>) {
    let bits = if stored.dtype() == WeightDtype::Mxfp4 { 0 } else { 1 };
    stored.set_block_scales(blocks, bits).unwrap();
}

fn random(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// x rows with cancellations, signed zeros, a NaN, an infinity and 1-ulp neighbours.
fn adversarial_x(rng: &mut ChaCha8Rng, tokens: usize, h: usize) -> Vec<f32> {
    let mut x = random(rng, tokens * h, 1.0);
    x[0] = 1e8;
    x[4.min(h - 1)] = -1e8;
    x[1] = 1.0;
    x[h..2 * h].fill(-0.0);
    x[2 * h + h / 2] = f32::NAN;
    x[3 * h + 1] = f32::INFINITY;
    for (i, v) in x[4 * h..5 * h].iter_mut().enumerate() {
        *v = if i % 2 == 0 { 1.0 } else { 1.0f32.next_up() };
    }
    x
}

struct Case {
    dtype: WeightDtype,
    h: usize,
    f: usize,
}

fn check(case: &Case, order: GemmOrder, activation: Activation, biased: bool, threads: Option<usize>) {
    let (e, tokens, (h, f)) = (6usize, 18usize, (case.h, case.f));
    let mut rng = ChaCha8Rng::seed_from_u64(case.h as u64 * 31 + case.f as u64);
    let mut gate_v = random(&mut rng, e * f * h, 0.5);
    if case.dtype == WeightDtype::F32 {
        // Specials in the weights of expert 2 (which takes every token) and 5 (two tokens).
        for at in [2 * f * h, 5 * f * h] {
            gate_v[at] = f32::NAN;
            gate_v[at + h + 1] = f32::INFINITY;
            gate_v[at + 2 * h] = -0.0;
        }
    }
    let poisoned = [2 * f * h / 32 + 3, 5 * f * h / 32 + 3];
    // The second poisoned block all zeros: zero times an infinite or NaN scale is NaN (where
    // nothing else makes the output NaN).
    gate_v[32 * poisoned[1]..32 * poisoned[1] + 32].fill(0.0);
    let mut gate = StoredExperts::new(case.dtype, &gate_v, [e, f, h]).unwrap();
    let mut up = StoredExperts::new(case.dtype, &random(&mut rng, e * f * h, 0.5), [e, f, h]).unwrap();
    let down = StoredExperts::new(case.dtype, &random(&mut rng, e * h * f, 0.5), [e, h, f]).unwrap();
    // Expert 2's fourth block: infinite or NaN values; expert 5's (two tokens): NaN ones; the
    // smallest scale in all of expert 4's up projection (one token), whose outputs are then
    // that small too.
    for b in poisoned {
        poison_block(&mut gate, b);
    }
    tiny_blocks(&mut up, 4 * f * h / 32..5 * f * h / 32);
    let biases = [random(&mut rng, e * f, 0.1), random(&mut rng, e * f, 0.1), random(&mut rng, e * h, 0.1)];
    let held = [0u32, 2, 3, 4, 5];
    let mut host =
        HostExperts::new(host(&gate, &held), host(&up, &held), host(&down, &held), order, activation)
            .unwrap();
    if biased {
        host = host.with_bias(HostBias { gate: &biases[0], up: &biases[1], down: &biases[2] }).unwrap();
    }
    if let Some(t) = threads {
        host = host.with_threads(t).unwrap();
    }
    let x = adversarial_x(&mut rng, tokens, h);
    // Expert 2 takes every token (18: more than any rows kernel takes, so the tile), 0 four
    // (token 6 twice; a rows kernel where the CPU has one: two tokens at a time), 5 two, 4
    // one, 3 none.
    let mut entries: Vec<HostEntry> = (0..tokens as u32).map(|t| HostEntry { token: t, expert: 2 }).collect();
    entries.extend(
        [(6, 0), (1, 5), (6, 5), (0, 0), (6, 0), (5, 4), (3, 0)]
            .map(|(token, expert)| HostEntry { token, expert }),
    );
    let mut out = vec![0.0f32; entries.len() * h];
    host.run(&x, &entries, &mut out).unwrap();
    let w = FfnWeights {
        gate: gate.decoded(),
        up: up.decoded(),
        down: down.decoded(),
        hidden: h,
        ffn: f,
        order,
        activation,
        bias: biased.then(|| FfnBias { gate: &biases[0], up: &biases[1], down: &biases[2] }),
        f16_operands: false,
    };
    for (i, en) in entries.iter().enumerate() {
        let t = en.token as usize;
        let want = ffn_row(&x[t * h..(t + 1) * h], en.expert as usize, &w);
        assert_eq!(
            canonical(&out[i * h..(i + 1) * h]),
            canonical(&want),
            "{:?} H={h} F={f} {order:?} {activation:?} bias={biased}: entry {i} {en:?}",
            case.dtype
        );
    }
}

#[test]
fn host_experts_give_the_references_bits_in_every_dtype_and_order() {
    let cases = [
        // K not a multiple of four; columns not a multiple of the tiles' 16 or 32.
        Case { dtype: WeightDtype::F32, h: 37, f: 21 },
        // H past one chunk of 256 with a tail.
        Case { dtype: WeightDtype::F32, h: 300, f: 40 },
        Case { dtype: WeightDtype::F16, h: 37, f: 21 },
        // f16 rows read in place (H a multiple of 16).
        Case { dtype: WeightDtype::F16, h: 320, f: 40 },
        Case { dtype: WeightDtype::Bf16, h: 300, f: 21 },
        Case { dtype: WeightDtype::Q8_0, h: 320, f: 96 },
        Case { dtype: WeightDtype::Q4_0, h: 320, f: 96 },
        Case { dtype: WeightDtype::Mxfp4, h: 320, f: 64 },
        Case { dtype: WeightDtype::Fp8, h: 300, f: 40 },
    ];
    for case in &cases {
        for order in [GemmOrder::Strict, GemmOrder::Fast] {
            check(case, order, Activation::Swiglu, false, None);
        }
        check(case, GemmOrder::Strict, Activation::GPT_OSS, true, Some(1));
    }
}

#[test]
fn host_experts_give_the_same_bits_on_any_thread_count() {
    let case = Case { dtype: WeightDtype::Q4_0, h: 320, f: 96 };
    for threads in [1, 2, 3] {
        check(&case, GemmOrder::Fast, Activation::GPT_OSS, true, Some(threads));
    }
}

#[test]
fn host_experts_refuse_bad_placements_and_entries() {
    let (e, f, h) = (4usize, 32usize, 64usize);
    let v = vec![0.25f32; e * f * h];
    let stored = StoredExperts::new(WeightDtype::Q8_0, &v, [e, f, h]).unwrap();
    let mut p = HostProjection::new([e as u32, f as u32, h as u32]).unwrap();
    let err = p.hold(4, stored.expert(0)).unwrap_err().to_string();
    assert!(err.contains("expert 4 is out of range"), "{err}");
    p.hold(1, stored.expert(1)).unwrap();
    let err = p.hold(1, stored.expert(1)).unwrap_err().to_string();
    assert!(err.contains("expert 1 is placed on the host twice"), "{err}");
    let StoredValues::Quantised(QuantisedValues::Q8_0(bytes)) = stored.expert(0) else { unreachable!() };
    let short = StoredValues::Quantised(QuantisedValues::Q8_0(&bytes[..34]));
    assert!(p.hold(2, short).is_err(), "a short expert is refused");
    let err = p.hold_rows(2, stored.expert(2), 2, 2).unwrap_err().to_string();
    assert!(err.contains("not below their step 2"), "{err}");
    assert!(p.hold_rows(2, stored.expert(2), 0, 2).is_err(), "half the rows a step of 2 needs");
    let f32_bytes = bytemuck::cast_slice::<f32, u8>(&v[..f * h]);
    let err =
        p.hold(2, StoredValues::Float { dtype: WeightDtype::F32, bytes: f32_bytes }).unwrap_err().to_string();
    assert!(err.contains("the experts held before are Q8_0"), "{err}");
    assert!(HostProjection::new([0, 1, 1]).is_err());

    let gate = host(&stored, &[1, 2]);
    let up = host(&stored, &[1, 2]);
    let down_stored = StoredExperts::new(WeightDtype::Q8_0, &vec![0.5f32; e * h * f], [e, h, f]).unwrap();
    let err = HostExperts::new(
        gate.clone(),
        up.clone(),
        host(&down_stored, &[1]),
        GemmOrder::Strict,
        Activation::Swiglu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("expert 2 is placed on the host, but host memory holds no down weights"), "{err}");
    let err = HostExperts::new(
        gate.clone(),
        up.clone(),
        host(&stored, &[1, 2]),
        GemmOrder::Strict,
        Activation::Swiglu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("down projection"), "a down of the gate's shape is refused: {err}");
    let host = HostExperts::new(gate, up, host(&down_stored, &[1, 2]), GemmOrder::Strict, Activation::Swiglu)
        .unwrap();
    assert_eq!(host.experts(), vec![1, 2]);
    assert_eq!(host.bytes(), 2 * 3 * (f * h / 32 * 34) as u64);
    let x = vec![0.5f32; 2 * h];
    let mut out = vec![0.0f32; h];
    let err = host.run(&x, &[HostEntry { token: 0, expert: 0 }], &mut out).unwrap_err().to_string();
    assert!(err.contains("routed to expert 0, which the host does not hold"), "{err}");
    let err = host.run(&x, &[HostEntry { token: 2, expert: 1 }], &mut out).unwrap_err().to_string();
    assert!(err.contains("names token 2 but x has 2 rows"), "{err}");
    assert!(host.run(&x, &[HostEntry { token: 0, expert: 1 }; 2], &mut out).is_err(), "out too short");
    assert!(host.run(&x[1..], &[], &mut []).is_err(), "x not whole rows");
    host.run(&x, &[], &mut []).unwrap();
    assert!(host.clone().with_threads(0).is_err());
    assert!(host.with_bias(HostBias { gate: &[0.0], up: &[0.0], down: &[0.0] }).is_err());
    assert!(["avx512", "avx2+fma", "neon", "baseline"].contains(&HostExperts::simd()));
}

/// The experts `held` of three stored projections on the host, SwiGLU in the strict order.
fn strict_swiglu<'a>(
    gate: &'a StoredExperts,
    up: &'a StoredExperts,
    down: &'a StoredExperts,
    held: &[u32],
) -> HostExperts<'a> {
    HostExperts::new(
        host(gate, held),
        host(up, held),
        host(down, held),
        GemmOrder::Strict,
        Activation::Swiglu,
    )
    .unwrap()
}

/// Expert `x`'s stored bytes (f32 or Q8_0).
fn bytes_of(s: &StoredExperts, x: u32) -> &[u8] {
    match s.expert(x) {
        StoredValues::Float { bytes, .. } | StoredValues::Quantised(QuantisedValues::Q8_0(bytes)) => bytes,
        _ => unreachable!(),
    }
}

/// f32 or Q8_0 bytes as stored values.
fn values_of(dtype: WeightDtype, bytes: &[u8]) -> StoredValues<'_> {
    match dtype {
        WeightDtype::F32 => StoredValues::Float { dtype, bytes },
        _ => StoredValues::Quantised(QuantisedValues::Q8_0(bytes)),
    }
}

#[test]
fn rows_held_every_other_give_their_own_projections_bits() {
    // gpt-oss's fused gate/up: gate and up rows alternate in one tensor, held as two
    // projections with a step of two; the same bits as the two held apart.
    let (e, f, h) = (3usize, 64usize, 96usize);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for dtype in [WeightDtype::F32, WeightDtype::Q8_0] {
        let [gate, up, down] = [[e, f, h], [e, f, h], [e, h, f]]
            .map(|shape| StoredExperts::new(dtype, &random(&mut rng, e * f * h, 0.5), shape).unwrap());
        let fused: Vec<Vec<u8>> = (0..e as u32)
            .map(|x| {
                let (g, u) = (bytes_of(&gate, x), bytes_of(&up, x));
                let row = g.len() / f;
                g.chunks(row).zip(u.chunks(row)).flat_map(|(g, u)| [g, u].concat()).collect()
            })
            .collect();
        let held = [0u32, 2];
        let apart = strict_swiglu(&gate, &up, &down, &held);
        let shape = [e as u32, f as u32, h as u32];
        let (mut g, mut u) = (HostProjection::new(shape).unwrap(), HostProjection::new(shape).unwrap());
        for &x in &held {
            g.hold_rows(x, values_of(dtype, &fused[x as usize]), 0, 2).unwrap();
            u.hold_rows(x, values_of(dtype, &fused[x as usize]), 1, 2).unwrap();
        }
        assert_eq!(g.bytes(), host(&gate, &held).bytes(), "each projection counts its own rows");
        let together =
            HostExperts::new(g, u, host(&down, &held), GemmOrder::Strict, Activation::Swiglu).unwrap();
        let x = random(&mut rng, 3 * h, 1.0);
        // Tokens 0-2 through expert 0 (the tile), token 1 through expert 2 (the rows kernel).
        let entries: Vec<HostEntry> =
            [(0, 0), (1, 0), (2, 0), (1, 2)].map(|(token, expert)| HostEntry { token, expert }).to_vec();
        let (mut want, mut got) = (vec![0.0; entries.len() * h], vec![0.0; entries.len() * h]);
        apart.run(&x, &entries, &mut want).unwrap();
        together.run(&x, &entries, &mut got).unwrap();
        assert_eq!(canonical(&got), canonical(&want), "{dtype:?}");
    }
}

#[test]
fn ggml_mxfp4_blocks_give_the_mxfp4_bits() {
    // GGUF's MXFP4 (llama.cpp's `block_mxfp4`: scale byte first, values j and j + 16 in one
    // byte) read in place: the bits of the same codes and scales in gpt-oss's layout, through
    // the rows kernel (one and two tokens) and the tile (three), with NaN and 2^-127 scales.
    let (e, f, h) = (3usize, 64usize, 96usize);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let [mut gate, up, mut down] = [[e, f, h], [e, f, h], [e, h, f]].map(|shape| {
        let mut values = random(&mut rng, e * f * h, 0.5);
        // Zero codes in the blocks below whose scale is NaN: NaN all the same.
        for row in [5, 2 * h + 5] {
            values[row * f..row * f + 32].fill(0.0);
        }
        StoredExperts::new(WeightDtype::Mxfp4, &values, shape).unwrap()
    });
    // A NaN scale in output row 5 of expert 0's and 2's down (NaN there alone), the smallest
    // scales in expert 2's first gate rows.
    for row in [5, 2 * h + 5] {
        down.set_block_scales(row * f / 32..row * f / 32 + 1, 255).unwrap();
    }
    gate.set_block_scales(2 * f * h / 32..2 * f * h / 32 + 5, 0).unwrap();
    let ggml = |s: &StoredExperts| -> Vec<Vec<u8>> {
        (0..e as u32)
            .map(|x| match s.expert(x) {
                StoredValues::Quantised(QuantisedValues::Mxfp4 { codes, scales }) => {
                    moeflow::quant::mxfp4_to_ggml(codes, scales).unwrap()
                }
                _ => unreachable!(),
            })
            .collect()
    };
    let blocks = [ggml(&gate), ggml(&up), ggml(&down)];
    let held = [0u32, 2];
    let as_ggml = |i: usize, shape: [u32; 3]| {
        let mut p = HostProjection::new(shape).unwrap();
        for &x in &held {
            p.hold_ggml_mxfp4(x, &blocks[i][x as usize]).unwrap();
        }
        p
    };
    let (fh, hf) = ([e as u32, f as u32, h as u32], [e as u32, h as u32, f as u32]);
    let from_ggml = HostExperts::new(
        as_ggml(0, fh),
        as_ggml(1, fh),
        as_ggml(2, hf),
        GemmOrder::Strict,
        Activation::Swiglu,
    )
    .unwrap();
    assert_eq!(from_ggml.bytes(), 3 * (f * h / 32 * 17 * held.len()) as u64);
    let want = strict_swiglu(&gate, &up, &down, &held);
    let x = random(&mut rng, 3 * h, 1.0);
    let entries: Vec<HostEntry> =
        [(0, 0), (1, 0), (2, 0), (1, 2), (2, 2)].map(|(token, expert)| HostEntry { token, expert }).to_vec();
    let (mut a, mut b) = (vec![0.0; entries.len() * h], vec![0.0; entries.len() * h]);
    want.run(&x, &entries, &mut a).unwrap();
    from_ggml.run(&x, &entries, &mut b).unwrap();
    assert_eq!(canonical(&b), canonical(&a));
    let mut p = HostProjection::new(fh).unwrap();
    let err = p.hold_ggml_mxfp4(0, &blocks[0][0][..17]).unwrap_err().to_string();
    assert!(err.contains("ggml MXFP4 blocks"), "{err}");
}
