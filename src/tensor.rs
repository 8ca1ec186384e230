//! Device tensors: a view of a buffer with a shape and an element type, as a layer's inputs and
//! outputs are given and returned ([`crate::layer::ForwardIo`], [`crate::layer::ForwardPlan`]).

use std::fmt;

use crate::error::{Error, Result};
use crate::pipeline::BufferView;
use crate::size;

/// The element type of a device tensor (4 bytes each, little-endian as the device stores them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary32: activations, routing weights, logits.
    F32,
    /// Unsigned 32-bit integers: expert indices.
    U32,
}

/// Bytes of one 32-bit word: an element of every [`DType`], and the unit moeflow's device
/// buffers hold (f32 values, u32 indices and counts, packed weights).
pub(crate) const WORD_BYTES: u64 = 4;

/// Bytes of `n` 32-bit words, saturating: a count whose bytes pass a u64 reads as `u64::MAX`
/// bytes, which no view, binding or device limit holds, so the check that takes it refuses it
/// (the counts are products of u32 dimensions; sizes a caller gives are multiplied with
/// [`crate::size::product`], which names an overflow).
pub(crate) const fn word_bytes(n: u64) -> u64 {
    n.saturating_mul(WORD_BYTES)
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 | DType::U32 => WORD_BYTES,
        }
    }

    /// Its name as WGSL spells it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A row-major `[rows, cols]` tensor of [`DType`] elements on the device: the first
/// `rows * cols * dtype.bytes()` bytes of a [`BufferView`] (the view is cut to them). Making one
/// checks that the view lies in its buffer and holds the shape; a plan that binds it checks its
/// shape and element type against the layer and its offset against the device.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    view: BufferView<'a>,
    shape: [u32; 2],
    dtype: DType,
}

impl<'a> Tensor<'a> {
    /// `shape` elements of `dtype` at the start of `view` (a whole buffer or a view of one).
    ///
    /// # Errors
    /// [`Error::Shape`] for a view past its buffer or smaller than the shape's bytes;
    /// [`Error::InvalidArgument`] for a shape whose bytes do not fit in a u64.
    pub fn new(view: impl Into<BufferView<'a>>, shape: [u32; 2], dtype: DType) -> Result<Self> {
        Self::named("tensor", view.into(), shape, dtype)
    }

    /// [`Self::new`], its errors naming the tensor `what`.
    pub(crate) fn named(what: &str, view: BufferView<'a>, shape: [u32; 2], dtype: DType) -> Result<Self> {
        view.check_in_buffer(&format!("view of `{what}`"))?;
        let bytes = size::product(
            &format!("`{what}`, {dtype} {shape:?},"),
            &[u64::from(shape[0]), u64::from(shape[1]), dtype.bytes()],
        )?;
        if view.size < bytes {
            return Err(Error::shape(
                format!("`{what}`, {dtype} {shape:?},"),
                format!("a view of at least {bytes} bytes"),
                format!("{} bytes", view.size),
            ));
        }
        Ok(Tensor { view: BufferView::new(view.buffer, view.offset, bytes), shape, dtype })
    }

    /// [`Self::new`] of f32 elements.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn f32(view: impl Into<BufferView<'a>>, shape: [u32; 2]) -> Result<Self> {
        Self::new(view, shape, DType::F32)
    }

    /// [`Self::new`] of u32 elements.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn u32(view: impl Into<BufferView<'a>>, shape: [u32; 2]) -> Result<Self> {
        Self::new(view, shape, DType::U32)
    }

    /// A tensor of a view that holds `shape` by construction (a plan's own region).
    pub(crate) fn within(view: BufferView<'a>, shape: [u32; 2], dtype: DType) -> Self {
        // The region holds the shape, so its bytes fit (saturating only to keep this total).
        let bytes = u64::from(shape[0]).saturating_mul(u64::from(shape[1])).saturating_mul(dtype.bytes());
        debug_assert!(view.size >= bytes, "a region smaller than its tensor");
        Tensor { view: BufferView::new(view.buffer, view.offset, bytes.min(view.size)), shape, dtype }
    }

    /// Its bytes in the buffer (to bind, copy from or read back).
    pub fn view(&self) -> BufferView<'a> {
        self.view
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [u32; 2] {
        self.shape
    }

    /// Rows (tokens, for a layer's tensors).
    pub fn rows(&self) -> u32 {
        self.shape[0]
    }

    /// Elements per row.
    pub fn cols(&self) -> u32 {
        self.shape[1]
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements in the tensor.
    pub fn len(&self) -> usize {
        self.shape[0] as usize * self.shape[1] as usize
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that this is the `what` tensor a plan expects: `shape` elements of `dtype`.
    ///
    /// # Errors
    /// [`Error::Shape`] naming `what`, the expected and the given shape and type.
    pub(crate) fn check_shape(&self, what: &str, shape: [u32; 2], dtype: DType) -> Result<()> {
        if self.shape != shape || self.dtype != dtype {
            return Err(Error::shape(
                format!("`{what}`"),
                format!("{dtype} {shape:?}"),
                format!("{} {:?}", self.dtype, self.shape),
            ));
        }
        Ok(())
    }
}

impl<'a> From<Tensor<'a>> for BufferView<'a> {
    fn from(t: Tensor<'a>) -> Self {
        t.view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_and_sizes() {
        assert_eq!((DType::F32.to_string(), DType::U32.name()), ("f32".to_string(), "u32"));
        assert_eq!(DType::F32.bytes(), 4);
    }
}
