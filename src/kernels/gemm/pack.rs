//! The host side of an upload: weight rows of f32 rounded to a dtype's values and packed into
//! the u32 words the kernels read, for every [`WeightDtype`].

use half::{bf16, f16};

use super::dtype::WeightDtype;
use super::quantised;
use crate::error::Result;

impl WeightDtype {
    /// The values the shader sees for weight rows of `k` values (`data.len() / k` rows)
    /// uploaded as this dtype: each value rounded to nearest even for f16 and bf16; for the
    /// quantised formats, the rows quantised block by block along K and decoded exactly
    /// ([`crate::quant`]'s decoders; see docs/quant.md for the rules).
    ///
    /// # Errors
    /// For a quantised dtype: `k == 0`, a length that is not whole rows, or a value that is not
    /// finite ([`Error::InvalidArgument`](crate::error::Error::InvalidArgument)). Float dtypes
    /// never fail.
    pub fn round(self, data: &[f32], k: usize) -> Result<Vec<f32>> {
        Ok(match self {
            WeightDtype::F32 => data.to_vec(),
            WeightDtype::F16 => data.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            WeightDtype::Bf16 => data.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                quantised::quantise_rows(self, data, k)?.1
            }
        })
    }

    /// Packs weight rows of `k` values into the u32 words the kernels read (the f32 words,
    /// halves low half first, or the quantised groups of docs/quant.md).
    ///
    /// # Errors
    /// As [`WeightDtype::round`].
    pub fn pack(self, data: &[f32], k: usize) -> Result<Vec<u32>> {
        let halves: Vec<u16> = match self {
            WeightDtype::F32 => return Ok(data.iter().map(|v| v.to_bits()).collect()),
            WeightDtype::F16 => data.iter().map(|&v| f16::from_f32(v).to_bits()).collect(),
            WeightDtype::Bf16 => data.iter().map(|&v| bf16::from_f32(v).to_bits()).collect(),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                return Ok(quantised::quantise_rows(self, data, k)?.0);
            }
        };
        Ok(halves.chunks(2).map(|p| u32::from(p[0]) | (u32::from(*p.get(1).unwrap_or(&0)) << 16)).collect())
    }
}
