//! [`HostProjection`]: one projection of the routed experts, `[E, N, K]`, held in host memory
//! in its stored format, expert by expert.

use super::tile::GGML_MXFP4_BLOCK_BYTES;
use crate::error::{Error, Result};
use crate::kernels::gemm::{QuantisedValues, StoredValues, WeightDtype};
use crate::size;

/// One projection `[E, N, K]` of a layer's routed experts as host memory holds it: for each
/// expert the host computes, its `[N, K]` values where they lie (a memory-mapped checkpoint
/// tensor, quantised blocks as shipped, or f32 values of the caller's), never converted or
/// copied. Experts the host does not hold are absent.
#[derive(Clone, Debug)]
pub struct HostProjection<'a> {
    shape: [u32; 3],
    dtype: Option<WeightDtype>,
    experts: Vec<Option<(Values<'a>, RowMap)>>,
}

/// One expert's values as the host reads them: in one of moeflow's stored layouts, or as
/// ggml's MXFP4 blocks (llama.cpp's `block_mxfp4`, 17 bytes: an E8M0 scale byte, then 16
/// bytes whose low nibbles are values 0-15 and high nibbles 16-31), which GGUF files hold.
#[derive(Clone, Copy, Debug)]
pub(super) enum Values<'a> {
    /// Values as [`StoredValues`] describes them.
    Stored(StoredValues<'a>),
    /// ggml's MXFP4 blocks, row by row.
    GgmlMxfp4(&'a [u8]),
}

impl Values<'_> {
    /// The values' dtype (ggml's MXFP4 blocks: MXFP4).
    pub(super) fn dtype(&self) -> WeightDtype {
        match self {
            Values::Stored(v) => v.dtype(),
            Values::GgmlMxfp4(_) => WeightDtype::Mxfp4,
        }
    }
}

/// Where a projection's rows lie among the stored rows of an expert's values: row `n` is
/// stored row `first + n · step` (every row in order: `first` 0, `step` 1; gpt-oss's fused
/// gate/up rows: gate `first` 0, up `first` 1, `step` 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RowMap {
    first: usize,
    step: usize,
}

impl RowMap {
    /// The stored row of row `n`.
    pub(super) fn at(self, n: usize) -> usize {
        self.first + n * self.step
    }
}

impl<'a> HostProjection<'a> {
    /// A projection of shape `[experts, n, k]` holding no expert yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty dimension.
    pub fn new(shape: [u32; 3]) -> Result<Self> {
        if shape.contains(&0) {
            return Err(Error::invalid(format!(
                "a host projection needs every dimension at least 1; got {shape:?}"
            )));
        }
        Ok(HostProjection { shape, dtype: None, experts: vec![None; shape[0] as usize] })
    }

    /// Every expert of `[experts, n, k]` f32 values (row-major, as [`crate::layer::MoeWeights`]
    /// holds them), read in place.
    ///
    /// # Errors
    /// As [`Self::new`]; [`Error::Shape`] when `values` is not `experts · n · k` long.
    pub fn from_f32(values: &'a [f32], shape: [u32; 3]) -> Result<Self> {
        let mut p = Self::new(shape)?;
        let per = shape[1] as usize * shape[2] as usize;
        if values.len() as u64 != per as u64 * u64::from(shape[0]) {
            return Err(Error::shape("host expert values", format!("{shape:?}"), values.len()));
        }
        for (e, v) in values.chunks_exact(per).enumerate() {
            p.hold(
                e as u32,
                StoredValues::Float { dtype: WeightDtype::F32, bytes: bytemuck::cast_slice(v) },
            )?;
        }
        Ok(p)
    }

    /// Holds expert `e`'s `[n, k]` values `values`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an expert past the shape's, one held already, or values
    /// in another dtype than the experts held before; the values' own length checks
    /// ([`Error::Shape`]; K not whole blocks for a block format).
    pub fn hold(&mut self, e: u32, values: StoredValues<'a>) -> Result<()> {
        self.hold_rows(e, values, 0, 1)
    }

    /// Holds expert `e`'s `[n, k]` values as every `step`-th row of `values` (`[step · n, k]`
    /// as stored) from row `first`: gpt-oss's fused gate/up projection, whose rows alternate
    /// gate and up, read in place as two projections (`first` 0 and 1, `step` 2).
    ///
    /// # Errors
    /// As [`Self::hold`]; [`Error::InvalidArgument`] for `first` not below `step`.
    pub fn hold_rows(&mut self, e: u32, values: StoredValues<'a>, first: u32, step: u32) -> Result<()> {
        let [experts, n, k] = self.shape;
        if first >= step {
            return Err(Error::invalid(format!(
                "expert {e}'s rows start at stored row {first}, not below their step {step}"
            )));
        }
        let stored_rows = size::u32_product("host projection stored rows", n, step, "u32")?;
        self.check_slot(e, values.dtype())?;
        values.check(e, [experts, stored_rows, k])?;
        self.place(
            e,
            values.dtype(),
            Values::Stored(values),
            RowMap { first: first as usize, step: step as usize },
        );
        Ok(())
    }

    /// Holds expert `e`'s `[n, k]` values as ggml's MXFP4 blocks (llama.cpp's `block_mxfp4`,
    /// as GGUF files hold them: 17 bytes for each 32 values along K), read in place; the same
    /// values as [`crate::quant::mxfp4_from_ggml`]'s regrouping decodes to.
    ///
    /// # Errors
    /// As [`Self::hold`] (the experts held before must be MXFP4 too); [`Error::InvalidArgument`]
    /// for K not a multiple of 32; [`Error::Shape`] for blocks not `n · k / 32` long.
    pub fn hold_ggml_mxfp4(&mut self, e: u32, blocks: &'a [u8]) -> Result<()> {
        let [_, n, k] = self.shape;
        if !k.is_multiple_of(32) {
            return Err(Error::invalid(format!("MXFP4 expert weights need K a multiple of 32; K is {k}")));
        }
        let want = u64::from(n) * u64::from(k) / 32 * GGML_MXFP4_BLOCK_BYTES as u64;
        if blocks.len() as u64 != want {
            return Err(Error::shape(
                format!("expert {e}'s ggml MXFP4 blocks of [{n}, {k}]"),
                want,
                blocks.len(),
            ));
        }
        self.check_slot(e, WeightDtype::Mxfp4)?;
        self.place(e, WeightDtype::Mxfp4, Values::GgmlMxfp4(blocks), RowMap { first: 0, step: 1 });
        Ok(())
    }

    /// Checks that expert `e` can take values of `dtype`: in range, not held yet, in the dtype
    /// of the experts held before.
    fn check_slot(&self, e: u32, dtype: WeightDtype) -> Result<()> {
        let experts = self.shape[0];
        match self.experts.get(e as usize) {
            None => {
                return Err(Error::invalid(format!(
                    "expert {e} is out of range: the projection has experts 0..{experts}"
                )));
            }
            Some(Some(_)) => return Err(Error::invalid(format!("expert {e} is placed on the host twice"))),
            Some(None) => {}
        }
        match self.dtype {
            Some(held) if held != dtype => Err(Error::invalid(format!(
                "expert {e}'s values are {dtype:?}; the experts held before are {held:?}"
            ))),
            _ => Ok(()),
        }
    }

    /// Holds expert `e`'s `values` of `dtype`, its rows where `map` says (the caller checked
    /// the slot, [`Self::check_slot`]).
    fn place(&mut self, e: u32, dtype: WeightDtype, values: Values<'a>, map: RowMap) {
        if let Some(slot) = self.experts.get_mut(e as usize) {
            *slot = Some((values, map));
        }
        self.dtype = Some(dtype);
    }

    /// `[experts, n, k]`.
    pub fn shape(&self) -> [u32; 3] {
        self.shape
    }

    /// The stored dtype of the experts held (None while none is).
    pub fn dtype(&self) -> Option<WeightDtype> {
        self.dtype
    }

    /// Whether expert `e` is held.
    pub fn holds(&self, e: u32) -> bool {
        self.experts.get(e as usize).is_some_and(Option::is_some)
    }

    /// Expert `e`'s values and where its rows lie in them, where held.
    pub(super) fn values(&self, e: u32) -> Option<(&Values<'a>, RowMap)> {
        self.experts.get(e as usize).and_then(Option::as_ref).map(|(v, map)| (v, *map))
    }

    /// Bytes of host memory the held experts' rows take (as stored; of values shared by
    /// projections, each projection's rows).
    pub fn bytes(&self) -> u64 {
        self.experts.iter().flatten().map(|(v, map)| stored_bytes(v) / map.step as u64).sum()
    }
}

/// The bytes of one expert's stored values.
fn stored_bytes(v: &Values<'_>) -> u64 {
    let bytes = match *v {
        Values::GgmlMxfp4(b) => b.len(),
        Values::Stored(StoredValues::Float { bytes, .. }) => bytes.len(),
        Values::Stored(StoredValues::Quantised(QuantisedValues::Q8_0(b) | QuantisedValues::Q4_0(b))) => {
            b.len()
        }
        Values::Stored(StoredValues::Quantised(QuantisedValues::Mxfp4 { codes, scales })) => {
            codes.len() + scales.len()
        }
        Values::Stored(StoredValues::Quantised(QuantisedValues::Fp8 { weight, scale_inv, .. })) => {
            weight.len() + std::mem::size_of_val(scale_inv)
        }
    };
    bytes as u64
}
