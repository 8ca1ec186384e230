// 16-bit weights as f32 with integer operations only (exact; no shader-f16 needed), shared by
// the packed-word and texture weight paths.

// Exact IEEE half -> f32 with integer operations only (no f16 capability needed).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let exponent = (h >> 10u) & 0x1fu;
    let mantissa = h & 0x3ffu;
    let normal = sign | ((exponent + 112u) << 23u) | (mantissa << 13u);
    // Infinity or NaN (payload kept).
    let special = sign | 0x7f800000u | (mantissa << 13u);
    // Zero or subnormal: mantissa * 2^-24, exact (and normal or zero) in f32.
    let subnormal = bitcast<u32>(f32(mantissa) * 5.9604644775390625e-8) | sign;
    // Selects, not branches: unrolled per value in the kernels (see quant.wgsl).
    var bits = select(normal, special, exponent == 31u);
    bits = select(bits, subnormal, exponent == 0u);
    return bitcast<f32>(bits);
}

// A 16-bit weight as f32 (DTYPE 1: IEEE half, 2: bfloat16).
fn half_to_f32(bits16: u32) -> f32 {
    if DTYPE == 1u {
        return f16_bits_to_f32(bits16);
    }
    return bitcast<f32>(bits16 << 16u);
}
