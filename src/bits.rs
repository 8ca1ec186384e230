//! What "bit-identical" promises for float outputs, and the one comparison that implements it.
//!
//! Variants that claim equivalence (fused and unfused kernels, batched and sequential runs,
//! every DAG executor, tuned and default kernels) give, on the same adapter:
//!
//! - every value that is not NaN with the same bits: `+0.0` and `-0.0` differ, and so does
//!   every ulp;
//! - NaN exactly where the other gives NaN.
//!
//! A NaN's sign and payload are not promised. WGSL leaves them to the implementation, IEEE 754
//! does not fix which operand's NaN an operation returns, and x86 returns the first operand's
//! NaN, or a negative default NaN for an invalid operation, so the sign follows the operand
//! order a driver's code generator chose, which on the LLVM CPU adapters depends on the host
//! CPU (seen: `0x7fc00000` from the task queue, `0xffc00000` from the staged kernels, every
//! other value identical). Every bitwise check in the tests, the benchmark's validation and
//! the examples goes through these functions.

/// The bits [`canonical_bits`] gives every NaN: the positive quiet NaN.
pub const CANONICAL_NAN: u32 = 0x7fc0_0000;

/// `v`'s bits, with any NaN as [`CANONICAL_NAN`]: two values are bit-identical under the
/// contract exactly when these are equal.
pub fn canonical_bits(v: f32) -> u32 {
    if v.is_nan() { CANONICAL_NAN } else { v.to_bits() }
}

/// [`canonical_bits`] of every value, for comparing whole outputs (`assert_eq!` prints both).
pub fn canonical(values: &[f32]) -> Vec<u32> {
    values.iter().map(|&v| canonical_bits(v)).collect()
}

/// Whether `a` and `b` are bit-identical under the contract: the same bits, or both NaN.
pub fn same_bits(a: f32, b: f32) -> bool {
    canonical_bits(a) == canonical_bits(b)
}

/// Whether `a` and `b` have the same length and every pair is [`same_bits`].
pub fn bit_identical(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| same_bits(x, y))
}

/// Where `a` and `b` first differ under the contract: the first index whose pair is not
/// [`same_bits`], or the shorter length where one is a prefix of the other; `None` when they
/// are bit-identical.
pub fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    match a.iter().zip(b).position(|(&x, &y)| !same_bits(x, y)) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// How many pairs of `a` and `b` (over the shorter length) are not [`same_bits`].
pub fn differences(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|&(&x, &y)| !same_bits(x, y)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_sign_and_payload_are_not_compared_and_everything_else_is() {
        let negative_nan = f32::from_bits(0xffc0_0000);
        let payload_nan = f32::from_bits(0x7f80_0001);
        assert!(same_bits(f32::NAN, negative_nan));
        assert!(same_bits(payload_nan, negative_nan));
        assert!(!same_bits(0.0, -0.0), "signed zeros differ");
        assert!(!same_bits(1.0, f32::from_bits(1.0f32.to_bits() + 1)), "one ulp differs");
        assert!(!same_bits(f32::NAN, f32::INFINITY));
        assert!(!same_bits(f32::INFINITY, f32::NEG_INFINITY));
        assert_eq!(canonical(&[negative_nan, -0.0]), vec![CANONICAL_NAN, 0x8000_0000]);
    }

    #[test]
    fn slices_compare_position_by_position_and_by_length() {
        let a = [1.0, f32::NAN, -0.0];
        assert!(bit_identical(&a, &[1.0, f32::from_bits(0xffc0_0000), -0.0]));
        assert_eq!(first_difference(&a, &[1.0, f32::NAN, 0.0]), Some(2));
        assert_eq!(first_difference(&a, &[1.0, 2.0, 0.0]), Some(1));
        assert_eq!(differences(&a, &[1.0, 2.0, 0.0]), 2);
        assert_eq!(first_difference(&a, &a[..2]), Some(2));
        assert!(!bit_identical(&a, &a[..2]));
        assert_eq!(first_difference(&a, &a), None);
    }
}
