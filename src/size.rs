//! Checked size arithmetic for sizes that come from the caller (shapes, element counts, byte
//! counts): a product or sum that does not fit is an `Err` naming what was being sized and
//! every operand, never a value wrapped around in a release build.

use crate::error::{Error, Result};

/// The product of `factors` (a shape's dimensions, then an element's bytes where the result
/// is bytes).
///
/// # Errors
/// [`Error::InvalidArgument`] naming `what` and the factors when the product does not fit in
/// a u64.
pub(crate) fn product(what: &str, factors: &[u64]) -> Result<u64> {
    factors.iter().try_fold(1u64, |p, &f| p.checked_mul(f)).ok_or_else(|| {
        let shown: Vec<String> = factors.iter().map(u64::to_string).collect();
        Error::invalid(format!("{what}: {} does not fit in 64 bits", shown.join(" × ")))
    })
}

/// [`product`] of host lengths, as a `usize`.
///
/// # Errors
/// As [`product`], and where the product does not fit in a `usize`.
pub(crate) fn host_product(what: &str, factors: &[usize]) -> Result<usize> {
    let wide: Vec<u64> = factors.iter().map(|&f| f as u64).collect();
    let p = product(what, &wide)?;
    usize::try_from(p).map_err(|_| Error::invalid(format!("{what}: {p} does not fit in this host's usize")))
}

/// `a · b` as a `u32`, for counts the kernels index with 32 bits.
///
/// # Errors
/// [`Error::LimitExceeded`] naming `what`, the product and `why` the limit holds, when the
/// product does not fit in a `u32`.
pub(crate) fn u32_product(what: &str, a: u32, b: u32, why: &str) -> Result<u32> {
    a.checked_mul(b).ok_or_else(|| Error::limit(what, u64::from(a) * u64::from(b), u32::MAX.into(), why))
}

/// `bytes` rounded up to a multiple of `align` (a power of two or any positive step).
///
/// # Errors
/// [`Error::InvalidArgument`] naming `what` when the rounded size does not fit in a u64.
pub(crate) fn round_up(what: &str, bytes: u64, align: u64) -> Result<u64> {
    bytes.checked_next_multiple_of(align).ok_or_else(|| {
        Error::invalid(format!("{what}: {bytes} bytes rounded up to {align} do not fit in 64 bits"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_is_an_error_naming_every_factor() {
        assert_eq!(product("x", &[3, 5, 4]).unwrap(), 60);
        assert_eq!(product("x", &[]).unwrap(), 1);
        let err = product("tensor `x`", &[1 << 31, 1 << 31, 4]).unwrap_err().to_string();
        assert!(err.contains("tensor `x`: 2147483648 × 2147483648 × 4 does not fit"), "{err}");
        assert!(host_product("y", &[usize::MAX, 2]).is_err());
        assert_eq!(round_up("b", 5, 4).unwrap(), 8);
        assert_eq!(u32_product("n", 3, 5, "u32").unwrap(), 15);
        let err = u32_product("max_tokens * k", 1 << 16, 1 << 16, "u32 entries").unwrap_err().to_string();
        assert!(err.contains("max_tokens * k") && err.contains("4294967296"), "{err}");
        assert!(round_up("b", u64::MAX, 4).unwrap_err().to_string().contains("18446744073709551615 bytes"));
    }
}
