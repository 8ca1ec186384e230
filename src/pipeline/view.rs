//! The caller's buffers and textures as a plan binds them: a view of a buffer, one bound
//! buffer range, one bound texture.

use crate::error::{Error, Result};

/// One buffer bound at `binding`, covering bytes `[offset, offset + size)`.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    /// Binding index in group 0.
    pub binding: u32,
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// Bytes bound (at least 4).
    pub size: u64,
    /// First byte (a multiple of the adapter's offset alignment).
    pub offset: u64,
}

impl<'a> Binding<'a> {
    /// `size` bytes of `buffer` from its start.
    pub fn new(binding: u32, buffer: &'a wgpu::Buffer, size: u64) -> Self {
        Binding { binding, buffer, size, offset: 0 }
    }
}

/// A range of a buffer that a plan reads or writes: bytes `[offset, offset + size)`. Activations
/// can live in one arena buffer at offsets, and swap roles between layers; a whole buffer
/// converts with `From`. Kernels index from the view's start, so a view gives the bits of a
/// buffer of its own. Plans check that the view lies in its buffer, that its offset is a
/// multiple of the device's `min_storage_buffer_offset_alignment`, and that it holds what they
/// read or write.
#[derive(Clone, Copy, Debug)]
pub struct BufferView<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// First byte.
    pub offset: u64,
    /// Bytes in the view.
    pub size: u64,
}

impl<'a> BufferView<'a> {
    /// Bytes `[offset, offset + size)` of `buffer` (checked when a plan binds it).
    pub fn new(buffer: &'a wgpu::Buffer, offset: u64, size: u64) -> Self {
        BufferView { buffer, offset, size }
    }

    /// Checks that the view lies within its buffer.
    ///
    /// # Errors
    /// [`Error::Shape`] naming `what` for a range past the buffer's end.
    pub(crate) fn check_in_buffer(&self, what: &str) -> Result<()> {
        let end = self.offset.checked_add(self.size);
        if end.is_none_or(|end| end > self.buffer.size()) {
            return Err(Error::shape(
                what,
                format!("a range within the buffer's {} bytes", self.buffer.size()),
                format!("bytes {} .. {}", self.offset, self.offset.saturating_add(self.size)),
            ));
        }
        Ok(())
    }

    /// The first `bytes` bytes of the view, bound at `binding`.
    pub(crate) fn bind(&self, binding: u32, bytes: u64) -> Binding<'a> {
        Binding { binding, buffer: self.buffer, size: bytes, offset: self.offset }
    }
}

impl<'a> From<&'a wgpu::Buffer> for BufferView<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        BufferView { buffer, offset: 0, size: buffer.size() }
    }
}

/// One texture bound at `binding` (a whole `texture_2d_array<u32>` view).
#[derive(Clone, Copy, Debug)]
pub struct TextureBinding<'a> {
    /// Binding index in group 0.
    pub binding: u32,
    /// The texture (every layer and its only mip level are bound).
    pub texture: &'a wgpu::Texture,
}
