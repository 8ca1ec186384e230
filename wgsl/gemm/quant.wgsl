// Quantised expert weights (DTYPE 3..6), unpacked with integer operations and at most one f32
// product per value, so every adapter sees exactly the values of moeflow::quant's CPU
// decoders. Composed after weights_quant.wgsl (weight_word) and half.wgsl (f16_bits_to_f32).
//
// A weight row (one output column of one expert, K values) holds groups = ceil(K / G) groups
// of G values (docs/quant.md): first the groups' header words, zero words up to a multiple of
// four (quant_codes_at), then the groups' code words, block b (values 32b .. 32b + 31) at code
// word b * B. Rows are whole vec4s of words. Values past K are zero codes; blocks wholly past K
// have a zero scale.
//
// | DTYPE | format | G   | header                          | codes per group                | B |
// |-------|--------|-----|---------------------------------|--------------------------------|---|
// | 3     | Q8_0   | 64  | two f16 d (block 0 low half)    | 16 words, one i8 per byte      | 8 |
// | 4     | Q4_0   | 64  | two f16 d (block 0 low half)    | 8 words, ggml's nibble order   | 4 |
// | 5     | MXFP4  | 128 | four E8M0 bytes (block 0 low)   | 16 words, gpt-oss nibble order | 4 |
// | 6     | FP8    | 128 | f32 scale_inv of the group      | 32 words, one e4m3 per byte    | 8 |

const DTYPE_Q8_0: u32 = 3u;
const DTYPE_Q4_0: u32 = 4u;
const DTYPE_MXFP4: u32 = 5u;
const DTYPE_FP8: u32 = 6u;

// Values per group.
fn quant_group_values() -> u32 {
    if DTYPE == DTYPE_Q8_0 || DTYPE == DTYPE_Q4_0 {
        return 64u;
    }
    return 128u;
}

// Code words per block of 32 values (B).
fn quant_block_words() -> u32 {
    if DTYPE == DTYPE_Q4_0 || DTYPE == DTYPE_MXFP4 {
        return 4u;
    }
    return 8u;
}

// The first code word of a row of `kdim` values, from the row's first word: past the headers
// and their padding to a multiple of four.
fn quant_codes_at(kdim: u32) -> u32 {
    let g = quant_group_values();
    return ((kdim + g - 1u) / g + 3u) / 4u * 4u;
}

// Words of a weight row of `kdim` values.
fn quant_row_words(kdim: u32) -> u32 {
    let g = quant_group_values();
    return quant_codes_at(kdim) + (kdim + g - 1u) / g * (g / 32u) * quant_block_words();
}

// An FP4 e2m1 code (bits 0..3) times 2^(scale - 127), built bit by bit: exact, subnormal
// results included (no product an adapter could flush); scale 255 is NaN, results past f32's
// range are infinities. Branch-free (selects): the kernels unroll this per value, and
// SwiftShader's compile time and memory grow with every branch of the unrolled code; the
// terms of `scale` alone are the same for the values of a block, so the compilers compute
// them once per block.
fn mxfp4_value(code: u32, scale: u32) -> f32 {
    let sign = (code & 8u) << 28u;
    let mag = code & 7u;
    // mag 2..7 are (1 + m / 2) x 2^(mag / 2 - 1), m = mag & 1: exponent field
    // scale - 1 + mag / 2 and mantissa bit m, together (scale - 1) << 23 + mag << 22. mag 1
    // (0.5 = 2^-1) is the same with mag 0. In u32, wrapping below zero at scale 0.
    let t = select(mag, 0u, mag == 1u);
    let normal = ((scale - 1u) << 23u) + (t << 22u);
    // Exponent field e - 1 <= 0 (scale 0 or 1 only): a subnormal, the significand shifted
    // right by 2 - e, exact (two significant bits).
    let e = scale + (t >> 1u);
    let subnormal = (0x800000u | (normal & 0x7fffffu)) >> (2u - min(e, 1u));
    // Past 254 the exponent field is infinity's.
    var bits = select(min(normal, 0x7f800000u), subnormal, e <= 1u);
    bits = select(bits, 0u, mag == 0u);
    // A NaN built from a runtime value: a constant NaN is a shader-creation error in WGSL.
    bits = select(bits, 0x7fc00000u, scale == 255u);
    return bitcast<f32>(sign | bits);
}

// Twice the magnitudes of FP4 e2m1 codes 0 .. 7 (0, 0.5, 1, 1.5, 2, 3, 4, 6), nibble by nibble.
const E2M1_TWICE: u32 = 0xc8643210u;

// mxfp4_value for a scale byte s in 2 ..= 252 (NARROW_SCALES), given as `half_scale` =
// 2^(s - 128): twice the code's magnitude (an integer up to 12) times half_scale, one product
// that is exact and normal (2^-126 .. 1.5 x 2^127), so no adapter can round or flush it; the
// sign bit set after it (code 8 is -0.0). The same bits as mxfp4_value in about 10 operations
// instead of 21.
fn mxfp4_narrow_value(code: u32, half_scale: f32) -> f32 {
    let twice = (E2M1_TWICE >> ((code & 7u) << 2u)) & 0xfu;
    return bitcast<f32>(bitcast<u32>(f32(twice) * half_scale) | ((code & 8u) << 28u));
}

// An FP8 e4m3 ("fn") byte as f32 (exact; 0x7f and 0xff are NaN) in about 11 operations. The
// magnitude's exponent and mantissa fields shifted to f32's places and rebiased by one add
// (bias 7 to 127: 120 << 23) are the value for exponent fields 1 .. 15; field 0 gives
// 2^-7 x (1 + m / 8) that way, and its subnormal value m x 2^-9 is twice that less 2^-6: one
// fma whose product and sum are exact (fused or not, the same bits) and whose operands and
// result are normal or zero, so no adapter can flush them. The sign goes on last (code 0x80
// is -0.0). Branch-free (selects), as `mxfp4_value`.
fn fp8_value(byte: u32) -> f32 {
    let magnitude = byte & 0x7fu;
    let normal = bitcast<f32>((magnitude << 20u) + 0x3c000000u);
    let value = select(normal, fma(normal, 2.0, -0.015625), magnitude < 8u);
    // A NaN built from a runtime value: a constant NaN is a shader-creation error in WGSL.
    let bits = select(bitcast<u32>(value), 0x7fc00000u, magnitude == 0x7fu);
    return bitcast<f32>(bits | ((byte & 0x80u) << 24u));
}

// The scale of block `block` (0 .. G / 32 - 1) of a group from the group's header word, as
// quant_lane takes it: f32 bits of d (Q8_0, Q4_0; f16 in the header) or of scale_inv (FP8),
// the E8M0 byte s (MXFP4), or under NARROW_SCALES f32 bits of 2^(s - 128) (mxfp4_narrow_value).
fn quant_scale(head: u32, block: u32) -> u32 {
    switch DTYPE {
        case 3u, 4u: {
            return bitcast<u32>(f16_bits_to_f32((head >> (16u * block)) & 0xffffu));
        }
        case 5u: {
            let s = (head >> (8u * block)) & 0xffu;
            if NARROW_SCALES {
                // Exponent field s - 1, mantissa 0: 2^(s - 128), normal for s >= 2.
                return (s - 1u) << 23u;
            }
            return s;
        }
        default: {
            return head;
        }
    }
}

// Value i (0 .. 3) of four values given as bytes of `word`, by format, under its block's
// `scale` (quant_scale): Q8_0 and FP8 take byte i; Q4_0 takes byte i's nibble at `shift`;
// MXFP4 takes nibble i of the half word at `shift`.
fn quant_lane(word: u32, i: u32, shift: u32, scale: u32) -> f32 {
    switch DTYPE {
        case 3u: {
            let q = bitcast<i32>(((word >> (8u * i)) & 0xffu) << 24u) >> 24u;
            return f32(q) * bitcast<f32>(scale);
        }
        case 4u: {
            let q = i32((word >> (8u * i + shift)) & 0xfu) - 8;
            return f32(q) * bitcast<f32>(scale);
        }
        case 5u: {
            let code = (word >> (shift + 4u * i)) & 0xfu;
            if NARROW_SCALES {
                return mxfp4_narrow_value(code, bitcast<f32>(scale));
            }
            return mxfp4_value(code, scale);
        }
        default: {
            return fp8_value((word >> (8u * i)) & 0xffu) * bitcast<f32>(scale);
        }
    }
}

// The header word of the group holding value k of the row whose first word is `base`.
fn quant_head_at(base: u32, k: u32) -> u32 {
    return base + k / quant_group_values();
}

// The first code word of the block holding value k of the row whose first word is `base`.
fn quant_codes_of(base: u32, k: u32, kdim: u32) -> u32 {
    return base + quant_codes_at(kdim) + k / 32u * quant_block_words();
}

// Where values j .. j + 3 of a block (j a multiple of four) are: (the code word in the block,
// the shift of their first bits in it).
fn quant_word_shift(j: u32) -> vec2<u32> {
    if DTYPE == DTYPE_Q4_0 {
        // Byte j of a block holds value j (low nibble) and j + 16 (high nibble).
        return vec2<u32>((j % 16u) / 4u, select(0u, 4u, j >= 16u));
    }
    if DTYPE == DTYPE_MXFP4 {
        // Byte b of a block holds values 2b (low nibble) and 2b + 1 (high nibble).
        return vec2<u32>(j / 8u, 4u * (j % 8u));
    }
    return vec2<u32>(j / 4u, 0u);
}

// Values k .. k + 3 (k a multiple of four, k < kdim) of the row whose first word is `base`,
// 0.0 at k + j >= kdim: the group's header and one code word.
fn quant_group4(buf_is_up: bool, base: u32, k: u32, kdim: u32) -> vec4<f32> {
    let scale = quant_scale(weight_word(buf_is_up, quant_head_at(base, k)), (k % quant_group_values()) / 32u);
    let at = quant_word_shift(k % 32u);
    return quant_vec4(weight_word(buf_is_up, quant_codes_of(base, k, kdim) + at.x), at.y, scale, k, kdim);
}

// The four values of a code word (with the nibble `shift` of Q4_0 and MXFP4) under `scale`.
fn quant_full4(word: u32, shift: u32, scale: u32) -> vec4<f32> {
    return vec4<f32>(
        quant_lane(word, 0u, shift, scale),
        quant_lane(word, 1u, shift, scale),
        quant_lane(word, 2u, shift, scale),
        quant_lane(word, 3u, shift, scale),
    );
}

// quant_full4 for values k .. k + 3 of a row, 0.0 at k + j >= kdim.
fn quant_vec4(word: u32, shift: u32, scale: u32, k: u32, kdim: u32) -> vec4<f32> {
    let live = vec4<bool>(true, k + 1u < kdim, k + 2u < kdim, k + 3u < kdim);
    return select(vec4<f32>(0.0), quant_full4(word, shift, scale), live);
}
