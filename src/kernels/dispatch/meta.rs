//! The words of a dispatch layout's `meta` buffer, as wgsl/dispatch/params.wgsl names them:
//! the device layout writes them, the host layout (`host.rs`) computes the same.

/// Word of the layout's `meta` buffer holding the valid entries placed (`META_ROWS` in
/// wgsl/dispatch/params.wgsl, as are the words below).
pub(crate) const META_ROWS: u32 = 0;
/// Meta word: rows including tile padding.
pub(crate) const META_PADDED_ROWS: u32 = 1;
/// Meta word: tiles in use.
pub(crate) const META_TILES: u32 = 2;
/// Meta word: the largest expert count.
pub(crate) const META_MAX_COUNT: u32 = 3;
/// Meta word: experts with at least one entry.
pub(crate) const META_NONEMPTY: u32 = 4;
/// Meta word: entries past the bucket bound.
pub(crate) const META_OVERFLOW: u32 = 5;
/// Meta word: entries whose expert index was out of range.
pub(crate) const META_INVALID: u32 = 6;
/// Words of the `meta` buffer (the last one unused).
pub(crate) const META_WORDS: u32 = 8;
