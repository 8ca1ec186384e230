// 16-bit weights as f32 with integer operations only (exact; no shader-f16 needed), shared by
// the packed-word and texture weight paths.

// Exact IEEE half -> f32 with integer operations only (no f16 capability needed). The
// exponent and mantissa shifted into place are rebiased by one add (2^112 for exponents 1 ..
// 30, 2^224 for 31: infinity, NaN with its payload kept); exponent 0 (zero or subnormal) is
// mantissa * 2^-24, exact and normal or zero in f32, so no adapter can flush it; the sign goes
// on last. About 13 operations.
fn f16_bits_to_f32(h: u32) -> f32 {
    let em = (h & 0x7fffu) << 13u;
    // Selects, not branches: unrolled per value in the kernels (see quant.wgsl).
    var bits = em + select(0x38000000u, 0x70000000u, em >= 0x0f800000u);
    bits = select(bits, bitcast<u32>(f32(em >> 13u) * 5.9604644775390625e-8), em < 0x00800000u);
    return bitcast<f32>(bits | ((h & 0x8000u) << 16u));
}

// A 16-bit weight as f32 (DTYPE 1: IEEE half, 2: bfloat16).
fn half_to_f32(bits16: u32) -> f32 {
    if DTYPE == 1u {
        return f16_bits_to_f32(bits16);
    }
    return bitcast<f32>(bits16 << 16u);
}
