//! The storage dtypes of expert weights ([`WeightDtype`]): their codes in the kernels, their
//! sizes and the layout of a quantised row's groups. Their rounding and packing on the host
//! are `pack.rs`'s.

use serde::{Deserialize, Serialize};

/// Storage type of expert weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum WeightDtype {
    /// 32-bit floats.
    #[default]
    F32,
    /// IEEE half precision, two per u32 word (low half first).
    F16,
    /// bfloat16, two per u32 word (low half first).
    Bf16,
    /// ggml's Q8_0: blocks of 32 signed bytes with one f16 scale (8.5 bits a value).
    #[serde(rename = "q8_0")]
    Q8_0,
    /// ggml's Q4_0: blocks of 32 nibbles (value − 8) with one f16 scale (4.5 bits a value).
    #[serde(rename = "q4_0")]
    Q4_0,
    /// MXFP4 (OCP Microscaling): blocks of 32 FP4 e2m1 codes with one E8M0 scale (4.25 bits a
    /// value), as gpt-oss ships its experts.
    Mxfp4,
    /// FP8 e4m3 with one f32 `scale_inv` per 128 values along K (8.25 bits a value on the
    /// device); DeepSeek-V3's and Qwen3-FP8's 128 × 128 tiles give each row its tile's scale.
    Fp8,
}

impl WeightDtype {
    /// The `DTYPE` pipeline constant of kernels reading these weights as packed words.
    pub(crate) fn code(self) -> f64 {
        match self {
            WeightDtype::F32 => 0.0,
            WeightDtype::F16 => 1.0,
            WeightDtype::Bf16 => 2.0,
            WeightDtype::Q8_0 => 3.0,
            WeightDtype::Q4_0 => 4.0,
            WeightDtype::Mxfp4 => 5.0,
            WeightDtype::Fp8 => 6.0,
        }
    }

    /// Whether this is a block-quantised format (Q8_0, Q4_0, MXFP4, FP8).
    pub fn is_quantised(self) -> bool {
        self.group().is_some()
    }

    /// Bytes of one element for the float dtypes; None for the quantised formats, whose
    /// values share their blocks' scales.
    pub fn element_bytes(self) -> Option<usize> {
        match self {
            WeightDtype::F32 => Some(4),
            WeightDtype::F16 | WeightDtype::Bf16 => Some(2),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => None,
        }
    }

    /// Bytes on the device of `rows` weight rows of `k` values.
    pub fn packed_bytes(self, rows: u64, k: u64) -> u64 {
        match self {
            WeightDtype::F32 => 4 * rows * k,
            WeightDtype::F16 | WeightDtype::Bf16 => 4 * (rows * k).div_ceil(2),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                4 * rows * self.row_words(k)
            }
        }
    }

    /// `(values, words)` of one quantised group (see `quantised.rs`), None for the float dtypes.
    pub(crate) fn group(self) -> Option<(usize, usize)> {
        match self {
            WeightDtype::F32 | WeightDtype::F16 | WeightDtype::Bf16 => None,
            WeightDtype::Q8_0 => Some((64, 17)),
            WeightDtype::Q4_0 => Some((64, 9)),
            WeightDtype::Mxfp4 => Some((128, 17)),
            WeightDtype::Fp8 => Some((128, 33)),
        }
    }

    /// u32 words of one weight row of `k` values of a quantised dtype (0 for float dtypes): the
    /// headers padded to a multiple of four words, then the codes (`quantised.rs`).
    pub(crate) fn row_words(self, k: u64) -> u64 {
        self.group().map_or(0, |(values, words)| {
            let groups = k.div_ceil(values as u64);
            groups.next_multiple_of(4) + groups * (words as u64 - 1)
        })
    }
}
