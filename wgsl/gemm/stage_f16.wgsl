// Staging in f16 (GemmVariant::TileF16): x and the weights rounded to f16 as they are stored in
// workgroup memory, four values in two words, and widened back exactly when read. The rounding
// is integer arithmetic, the same bits on every adapter (WGSL leaves the rounding of its own
// conversions to the implementation): to nearest, ties to even; past the largest f16 to
// infinity; NaN to a quiet NaN keeping the top ten mantissa bits (as the CPU reference's
// half::f16::from_f32).

// The f16 bits nearest v.
fn f16_bits_of(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if a >= 0x477ff000u {
        // 65520 and up (infinity included): infinity.
        return sign | 0x7c00u;
    }
    if a >= 0x38800000u {
        // Normal in f16 (2^-14 and up): exponent rebiased by 112, 13 bits rounded off.
        let m = a - 0x38000000u;
        return sign | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
    }
    if a < 0x33000000u {
        // Below 2^-25 (half the least subnormal, which ties to zero): zero.
        return sign;
    }
    // Subnormal in f16: the significand in units of 2^-24, rounded to nearest even (1024 is
    // the least normal, carried into the exponent field).
    let shift = 126u - (a >> 23u);
    let mant = (a & 0x7fffffu) | 0x800000u;
    let half = 1u << (shift - 1u);
    let rest = mant & ((1u << shift) - 1u);
    var q = mant >> shift;
    if rest > half || (rest == half && (q & 1u) == 1u) {
        q += 1u;
    }
    return sign | q;
}

// v rounded to f16, two values per word (the lower one in the low half).
fn stage_f16(v: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(
        f16_bits_of(v.x) | (f16_bits_of(v.y) << 16u),
        f16_bits_of(v.z) | (f16_bits_of(v.w) << 16u),
    );
}

// The four staged values, exactly (f16_bits_to_f32 reads the low half of a word).
fn unstage_f16(p: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(
        f16_bits_to_f32(p.x),
        f16_bits_to_f32(p.x >> 16u),
        f16_bits_to_f32(p.y),
        f16_bits_to_f32(p.y >> 16u),
    );
}
