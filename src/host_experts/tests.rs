//! The host experts against the CPU reference, bit for bit: every stored dtype, both orders,
//! both activations with biases, adversarial inputs, sizes that are multiples of no block.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{HostBias, HostEntry, HostExperts, HostProjection};
use crate::bits::canonical;
use crate::kernels::gemm::{Activation, GemmOrder, QuantisedValues, StoredValues, WeightDtype};
use crate::quant;
use crate::reference::gemm::{FfnBias, FfnWeights, ffn_row};

const FP8_TILE: [usize; 2] = [128, 128];

/// One projection `[e, n, k]` as a checkpoint would store it, and its decoded values.
struct Stored {
    dtype: WeightDtype,
    shape: [usize; 3],
    bytes: Vec<u8>,
    scales: Vec<u8>,
    fp8_scales: Vec<f32>,
    decoded: Vec<f32>,
}

impl Stored {
    fn new(dtype: WeightDtype, values: &[f32], shape: [usize; 3]) -> Stored {
        let [e, n, k] = shape;
        let mut s = Stored {
            dtype,
            shape,
            bytes: Vec::new(),
            scales: Vec::new(),
            fp8_scales: Vec::new(),
            decoded: Vec::new(),
        };
        match dtype {
            WeightDtype::F32 => s.bytes = bytemuck::cast_slice(values).to_vec(),
            WeightDtype::F16 => {
                s.bytes = values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect()
            }
            WeightDtype::Bf16 => {
                s.bytes = values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect()
            }
            WeightDtype::Q8_0 => s.bytes = quant::q8_0_quantize(values).unwrap(),
            WeightDtype::Q4_0 => s.bytes = quant::q4_0_quantize(values).unwrap(),
            WeightDtype::Mxfp4 => (s.bytes, s.scales) = quant::mxfp4_quantize(values).unwrap(),
            WeightDtype::Fp8 => {
                for x in 0..e {
                    let (w, sc) =
                        quant::fp8_block_quantize(&values[x * n * k..(x + 1) * n * k], [n, k], FP8_TILE)
                            .unwrap();
                    s.bytes.extend(w);
                    s.fp8_scales.extend(sc);
                }
            }
        }
        s.decode();
        s
    }

    fn decode(&mut self) {
        let [e, n, k] = self.shape;
        self.decoded = (0..e as u32)
            .flat_map(|x| match self.expert(x) {
                StoredValues::Quantised(q) => q.dequantise([1, n, k]).unwrap(),
                StoredValues::Float { dtype, bytes } => match dtype {
                    WeightDtype::F32 => bytemuck::pod_collect_to_vec(bytes),
                    WeightDtype::F16 => {
                        bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
                    }
                    _ => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
                },
            })
            .collect();
    }

    fn expert(&self, x: u32) -> StoredValues<'_> {
        let [_, n, k] = self.shape;
        let x = x as usize;
        let blocks = n * k / 32;
        fn part(v: &[u8], x: usize, per: usize) -> &[u8] {
            &v[x * per..(x + 1) * per]
        }
        match self.dtype {
            WeightDtype::F32 => {
                StoredValues::Float { dtype: self.dtype, bytes: part(&self.bytes, x, n * k * 4) }
            }
            WeightDtype::F16 | WeightDtype::Bf16 => {
                StoredValues::Float { dtype: self.dtype, bytes: part(&self.bytes, x, n * k * 2) }
            }
            WeightDtype::Q8_0 => {
                StoredValues::Quantised(QuantisedValues::Q8_0(part(&self.bytes, x, blocks * 34)))
            }
            WeightDtype::Q4_0 => {
                StoredValues::Quantised(QuantisedValues::Q4_0(part(&self.bytes, x, blocks * 18)))
            }
            WeightDtype::Mxfp4 => StoredValues::Quantised(QuantisedValues::Mxfp4 {
                codes: part(&self.bytes, x, blocks * 16),
                scales: part(&self.scales, x, blocks),
            }),
            WeightDtype::Fp8 => {
                let tiles = n.div_ceil(FP8_TILE[0]) * k.div_ceil(FP8_TILE[1]);
                StoredValues::Quantised(QuantisedValues::Fp8 {
                    weight: part(&self.bytes, x, n * k),
                    scale_inv: &self.fp8_scales[x * tiles..(x + 1) * tiles],
                    block: FP8_TILE,
                })
            }
        }
    }

    /// The experts `held` of this projection on the host.
    fn host(&self, held: &[u32]) -> HostProjection<'_> {
        let [e, n, k] = self.shape;
        let mut p = HostProjection::new([e as u32, n as u32, k as u32]).unwrap();
        for &x in held {
            p.hold(x, self.expert(x)).unwrap();
        }
        p
    }

    /// Makes block `b`'s scale infinite (Q8_0, Q4_0) or NaN (MXFP4): its values are ±inf or
    /// NaN in the decoded weights too.
    fn poison_block(&mut self, b: usize) {
        match self.dtype {
            WeightDtype::Q8_0 => self.bytes[b * 34..b * 34 + 2].copy_from_slice(&f16::INFINITY.to_le_bytes()),
            WeightDtype::Q4_0 => self.bytes[b * 18..b * 18 + 2].copy_from_slice(&f16::INFINITY.to_le_bytes()),
            WeightDtype::Mxfp4 => self.scales[b] = 255,
            _ => return,
        }
        self.decode();
    }
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
    let (e, tokens, (h, f)) = (6usize, 7usize, (case.h, case.f));
    let mut rng = ChaCha8Rng::seed_from_u64(case.h as u64 * 31 + case.f as u64);
    let mut gate_v = random(&mut rng, e * f * h, 0.5);
    if case.dtype == WeightDtype::F32 {
        // Specials in the weights of expert 2 (which takes every token).
        let at = 2 * f * h;
        gate_v[at] = f32::NAN;
        gate_v[at + h + 1] = f32::INFINITY;
        gate_v[at + 2 * h] = -0.0;
    }
    let mut gate = Stored::new(case.dtype, &gate_v, [e, f, h]);
    let up = Stored::new(case.dtype, &random(&mut rng, e * f * h, 0.5), [e, f, h]);
    let down = Stored::new(case.dtype, &random(&mut rng, e * h * f, 0.5), [e, h, f]);
    // Expert 2's third column block: infinite or NaN values.
    gate.poison_block(2 * f * h / 32 + 3);
    let biases = [random(&mut rng, e * f, 0.1), random(&mut rng, e * f, 0.1), random(&mut rng, e * h, 0.1)];
    let held = [0u32, 2, 3, 5];
    let mut host =
        HostExperts::new(gate.host(&held), up.host(&held), down.host(&held), order, activation).unwrap();
    if biased {
        host = host.with_bias(HostBias { gate: &biases[0], up: &biases[1], down: &biases[2] }).unwrap();
    }
    if let Some(t) = threads {
        host = host.with_threads(t).unwrap();
    }
    let x = adversarial_x(&mut rng, tokens, h);
    // Expert 2 takes every token, 0 and 5 a few (token 6 twice), 3 none.
    let mut entries: Vec<HostEntry> = (0..tokens as u32).map(|t| HostEntry { token: t, expert: 2 }).collect();
    entries
        .extend([(6, 0), (1, 5), (6, 5), (0, 0), (6, 0)].map(|(token, expert)| HostEntry { token, expert }));
    let mut out = vec![0.0f32; entries.len() * h];
    host.run(&x, &entries, &mut out).unwrap();
    let w = FfnWeights {
        gate: &gate.decoded,
        up: &up.decoded,
        down: &down.decoded,
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
        // K not a multiple of four; columns not a multiple of the tile's 16.
        Case { dtype: WeightDtype::F32, h: 37, f: 21 },
        // H past one chunk of 256 with a tail.
        Case { dtype: WeightDtype::F32, h: 300, f: 40 },
        Case { dtype: WeightDtype::F16, h: 37, f: 21 },
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
    let stored = Stored::new(WeightDtype::Q8_0, &v, [e, f, h]);
    let mut p = HostProjection::new([e as u32, f as u32, h as u32]).unwrap();
    let err = p.hold(4, stored.expert(0)).unwrap_err().to_string();
    assert!(err.contains("expert 4 is out of range"), "{err}");
    p.hold(1, stored.expert(1)).unwrap();
    let err = p.hold(1, stored.expert(1)).unwrap_err().to_string();
    assert!(err.contains("expert 1 is placed on the host twice"), "{err}");
    let short = StoredValues::Quantised(QuantisedValues::Q8_0(&stored.bytes[..34]));
    assert!(p.hold(2, short).is_err(), "a short expert is refused");
    let f32_bytes = bytemuck::cast_slice::<f32, u8>(&v[..f * h]);
    let err =
        p.hold(2, StoredValues::Float { dtype: WeightDtype::F32, bytes: f32_bytes }).unwrap_err().to_string();
    assert!(err.contains("the experts held before are Q8_0"), "{err}");
    assert!(HostProjection::new([0, 1, 1]).is_err());

    let gate = stored.host(&[1, 2]);
    let up = stored.host(&[1, 2]);
    let down_stored = Stored::new(WeightDtype::Q8_0, &vec![0.5f32; e * h * f], [e, h, f]);
    let err = HostExperts::new(
        gate.clone(),
        up.clone(),
        down_stored.host(&[1]),
        GemmOrder::Strict,
        Activation::Swiglu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("expert 2 is placed on the host, but host memory holds no down weights"), "{err}");
    let err = HostExperts::new(
        gate.clone(),
        up.clone(),
        stored.host(&[1, 2]),
        GemmOrder::Strict,
        Activation::Swiglu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("down projection"), "a down of the gate's shape is refused: {err}");
    let host =
        HostExperts::new(gate, up, down_stored.host(&[1, 2]), GemmOrder::Strict, Activation::Swiglu).unwrap();
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
