//! Quantised expert weights on every adapter: the values the kernels load are `moeflow::quant`'s
//! CPU decoding bit for bit (every code, scales at the extremes, NaN and infinite codes and
//! scales, partial groups), whether uploaded as stored or quantised from f32; and bad stored
//! shapes are clear errors.

mod common;

use common::{contexts, rng, uniform};
use moeflow::Context;
use moeflow::bits::{bit_identical, first_difference};
use moeflow::kernels::gemm::{ExpertWeights, QuantisedValues, WeightDtype};
use moeflow::quant;

/// f16 scales: zero, the smallest subnormal, a subnormal, the smallest normal, ordinary values
/// of both signs, the largest finite, infinity and NaN.
const F16_SCALES: [u16; 10] =
    [0x0000, 0x0001, 0x0155, 0x0400, 0x3c00, 0xb800, 0x2e66, 0x7bff, 0x7c00, 0x7e00];

/// Uploads `values` as stored, reads back what the kernels load, and checks it against the CPU
/// decoding under the NaN contract; returns the weights.
fn check(ctx: &Context, what: &str, values: QuantisedValues<'_>, [e, n, k]: [u32; 3]) -> ExpertWeights {
    let want = values.dequantise([e as usize, n as usize, k as usize]).expect("CPU decoding");
    let w = ExpertWeights::from_quantised(ctx, values, e, n, k).expect("upload");
    assert_eq!(w.dtype(), values.dtype());
    let got = w.unpack(ctx).expect("unpack");
    assert!(
        bit_identical(&got, &want),
        "{what} on {}: value {:?} differs: got {:e}, CPU {:e}",
        ctx.adapter().slug(),
        first_difference(&got, &want),
        first_difference(&got, &want).map_or(0.0, |i| got[i]),
        first_difference(&got, &want).map_or(0.0, |i| want[i]),
    );
    w
}

/// Q8_0 or Q4_0 blocks whose code bytes run through all 256 values and whose scales run
/// through [`F16_SCALES`].
fn ggml_blocks(blocks: usize, block_bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks * block_bytes);
    let mut byte = 0u8;
    for b in 0..blocks {
        out.extend(F16_SCALES[b % F16_SCALES.len()].to_le_bytes());
        for _ in 2..block_bytes {
            out.push(byte);
            byte = byte.wrapping_add(37);
        }
    }
    out
}

#[test]
fn every_q8_0_and_q4_0_code_loads_as_the_cpu_decodes_it() {
    for ctx in contexts() {
        // K = 96: one whole group of two blocks and a group with one block; 2 x 5 rows.
        let [e, n, k] = [2u32, 5, 96];
        let blocks = (e * n * k / 32) as usize;
        let q8 = ggml_blocks(blocks, quant::Q8_0_BLOCK_BYTES);
        check(&ctx, "Q8_0", QuantisedValues::Q8_0(&q8), [e, n, k]);
        let q4 = ggml_blocks(blocks, quant::Q4_0_BLOCK_BYTES);
        check(&ctx, "Q4_0", QuantisedValues::Q4_0(&q4), [e, n, k]);
    }
}

#[test]
fn every_mxfp4_code_and_e8m0_scale_loads_as_the_cpu_decodes_it() {
    for ctx in contexts() {
        // K = 160: a group of four blocks and a group of one; 320 blocks, so every scale byte
        // (0 = 2^-127 with subnormal products, 254 with infinite ones, 255 = NaN) and every
        // pair of FP4 codes appears.
        let [e, n, k] = [2u32, 32, 160];
        let blocks = (e * n * k / 32) as usize;
        let codes: Vec<u8> = (0..blocks * 16).map(|i| (i * 7 % 256) as u8).collect();
        let scales: Vec<u8> = (0..blocks).map(|i| (i % 256) as u8).collect();
        let w = check(&ctx, "MXFP4", QuantisedValues::Mxfp4 { codes: &codes, scales: &scales }, [e, n, k]);
        assert!(!w.narrow_scales());
        // Every narrow scale (2 ..= 252): the kernels' one-product decoding, the same bits.
        let scales: Vec<u8> = (0..blocks).map(|i| (2 + i % 251) as u8).collect();
        let stored = QuantisedValues::Mxfp4 { codes: &codes, scales: &scales };
        let w = check(&ctx, "MXFP4 with narrow scales", stored, [e, n, k]);
        assert!(w.narrow_scales());
    }
}

#[test]
fn every_fp8_code_loads_as_the_cpu_decodes_it() {
    for ctx in contexts() {
        // 130 rows and K = 200: partial 128 x 128 tiles on both sides. Scales: ordinary, zero
        // (0 x NaN codes is NaN), tiny (subnormal codes stay normal products), huge (products
        // past f32 are infinities), negative.
        let [e, n, k] = [2u32, 130, 200];
        let weight: Vec<u8> = (0..(e * n * k) as usize).map(|i| (i * 13 % 256) as u8).collect();
        let scales = [1.0f32, 0.0, 2f32.powi(-100), 3.0e36, -0.0625, 1.0e-3, 7.5, -2.0];
        let scale_inv: Vec<f32> = (0..(e * 2 * 2) as usize).map(|i| scales[i % scales.len()]).collect();
        let stored = QuantisedValues::Fp8 { weight: &weight, scale_inv: &scale_inv, block: [128, 128] };
        check(&ctx, "FP8 128 x 128", stored, [e, n, k]);
        // One scale per row ([1, K] tiles: a tile wider than K).
        let scale_inv: Vec<f32> = (0..(e * n) as usize).map(|i| scales[i % scales.len()]).collect();
        let stored = QuantisedValues::Fp8 { weight: &weight, scale_inv: &scale_inv, block: [1, 256] };
        check(&ctx, "FP8 per row", stored, [e, n, k]);
    }
}

/// `from_f32` with a quantised dtype loads exactly `WeightDtype::round`'s values, for K that
/// is no multiple of a block or a group (split weights: tests/gemm.rs).
#[test]
fn weights_quantised_from_f32_load_as_round_gives_them() {
    for ctx in contexts() {
        for dtype in [WeightDtype::Q8_0, WeightDtype::Q4_0, WeightDtype::Mxfp4, WeightDtype::Fp8] {
            for [e, n, k] in [[3u32, 7, 70], [2, 4, 256], [1, 1, 1]] {
                let mut values = uniform(&mut rng(u64::from(k)), (e * n * k) as usize, 2.0);
                // Exact ties, ±0, a zero row and values spanning many binades.
                values[0] = -0.0;
                if values.len() > 40 {
                    values[1] = values[2];
                    values[3] = 1.0e-30;
                    values[4] = 3.0e4;
                    let end = (2 * k as usize).min(values.len());
                    values[k as usize..end].fill(0.0);
                }
                let want = dtype.round(&values, k as usize).expect("round");
                let w = ExpertWeights::from_f32(&ctx, &values, dtype, e, n, k).expect("upload");
                let got = w.unpack(&ctx).expect("unpack");
                assert!(
                    bit_identical(&got, &want),
                    "{dtype:?} [{e}, {n}, {k}] on {}: value {:?} differs",
                    ctx.adapter().slug(),
                    first_difference(&got, &want)
                );
            }
        }
    }
}

/// The quantised values are close to what they quantise: each format's worst error on uniform
/// data, relative to its block's largest magnitude (Q4_0: a whole step, where a value of the
/// opposite sign to the block's extreme meets the clamp at +7).
#[test]
fn quantisation_error_stays_within_each_formats_step() {
    let values = uniform(&mut rng(5), 64 * 256, 1.0);
    for (dtype, bound) in [
        (WeightDtype::Q8_0, 0.5 / 127.0 + 1e-3),
        (WeightDtype::Q4_0, 1.0 / 8.0 + 1e-3),
        (WeightDtype::Mxfp4, 0.25),
        (WeightDtype::Fp8, 1.0 / 16.0),
    ] {
        let got = dtype.round(&values, 256).expect("round");
        let worst = values
            .chunks(32)
            .zip(got.chunks(32))
            .map(|(v, g)| {
                let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                v.iter().zip(g).fold(0.0f32, |m, (a, b)| m.max((a - b).abs() / amax))
            })
            .fold(0.0f32, f32::max);
        assert!(
            worst <= bound,
            "{dtype:?}: worst error {worst} of the block's largest magnitude, bound {bound}"
        );
    }
}

#[test]
fn bad_stored_shapes_are_clear_errors() {
    for ctx in contexts() {
        let q8 = ggml_blocks(4, quant::Q8_0_BLOCK_BYTES);
        let err = ExpertWeights::from_quantised(&ctx, QuantisedValues::Q8_0(&q8[1..]), 1, 4, 32).unwrap_err();
        assert!(err.to_string().contains("Q8_0 bytes"), "{err}");
        let err = ExpertWeights::from_quantised(&ctx, QuantisedValues::Q8_0(&q8), 1, 2, 40).unwrap_err();
        assert!(err.to_string().contains("multiple of 32"), "{err}");
        let (codes, scales) = (vec![0u8; 64], vec![127u8; 3]);
        let err = ExpertWeights::from_quantised(
            &ctx,
            QuantisedValues::Mxfp4 { codes: &codes, scales: &scales },
            1,
            4,
            32,
        )
        .unwrap_err();
        assert!(err.to_string().contains("MXFP4 scales"), "{err}");
        let weight = vec![0u8; 4 * 256];
        let stored = QuantisedValues::Fp8 { weight: &weight, scale_inv: &[1.0; 8], block: [1, 64] };
        let err = ExpertWeights::from_quantised(&ctx, stored, 1, 4, 256).unwrap_err();
        assert!(err.to_string().contains("groups of 128"), "{err}");
        // Values a quantiser has no code for.
        let err = ExpertWeights::from_f32(&ctx, &[f32::NAN; 32], WeightDtype::Q4_0, 1, 1, 32).unwrap_err();
        assert!(err.to_string().contains("NaN"), "{err}");
    }
}
