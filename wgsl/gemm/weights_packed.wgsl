// Expert weights packed in u32 words, unpacked with integer operations so every adapter runs
// every dtype: DTYPE 0 is f32 (one per word), 1 is IEEE half and 2 is bfloat16 (two per word,
// low half first). weight_from(is_up, idx) returns element idx of w (or w_up) as f32.

// Weights [E, N, K].
@group(0) @binding(2) var<storage, read> w: array<u32>;
// Second weights (up projection) for SWIGLU, same shape and dtype.
@group(0) @binding(3) var<storage, read> w_up: array<u32>;

fn weight_from(buf_is_up: bool, idx: u32) -> f32 {
    var word: u32;
    if DTYPE == 0u {
        if buf_is_up {
            return bitcast<f32>(w_up[idx]);
        }
        return bitcast<f32>(w[idx]);
    }
    if buf_is_up {
        word = w_up[idx >> 1u];
    } else {
        word = w[idx >> 1u];
    }
    let bits16 = (word >> ((idx & 1u) * 16u)) & 0xffffu;
    if DTYPE == 1u {
        return f16_bits_to_f32(bits16);
    }
    return bitcast<f32>(bits16 << 16u);
}

// Exact IEEE half -> f32 with integer operations only (no f16 capability needed).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let exponent = (h >> 10u) & 0x1fu;
    let mantissa = h & 0x3ffu;
    if exponent == 0u {
        // Zero or subnormal: mantissa * 2^-24, exact in f32.
        let magnitude = f32(mantissa) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(magnitude) | sign);
    }
    if exponent == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (mantissa << 13u));
    }
    return bitcast<f32>(sign | ((exponent + 112u) << 23u) | (mantissa << 13u));
}

