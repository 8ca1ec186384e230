//! How a projection's weights split into device buffers: [`WeightChunk`] and the split.

use std::ops::Range;

use super::dtype::WeightDtype;
use crate::error::{Error, Result};

/// One buffer of a projection's weights: experts `experts`, and of each the output columns
/// `cols`, as `[experts.len(), cols.len(), k]` packed words from word 0.
#[derive(Debug)]
pub(super) struct WeightChunk {
    pub(super) buffer: wgpu::Buffer,
    pub(super) experts: Range<u32>,
    pub(super) cols: Range<u32>,
    pub(super) bytes: u64,
}

/// How `[experts, n, k]` weights of `dtype` split into chunks of at most `limit` bytes: whole
/// experts, as many per chunk as fit; or, where one expert alone is past the limit, each
/// expert in runs of whole output columns (rows of the weight matrix). K is never split.
pub(super) fn chunking(
    dtype: WeightDtype,
    [experts, n, k]: [u32; 3],
    limit: u64,
) -> Result<Vec<(Range<u32>, Range<u32>)>> {
    // Word indices inside a chunk are u32; keep every element index below 2^32 too.
    let limit = limit.min(u64::from(u32::MAX) + 1);
    let (n64, k64) = (u64::from(n), u64::from(k));
    let fits = |rows: u64| dtype.packed_bytes(rows, k64) <= limit && rows * k64 <= u64::from(u32::MAX) + 1;
    if fits(n64) {
        let mut per_chunk = (limit / dtype.packed_bytes(n64, k64).max(1)).max(1);
        while per_chunk > 1 && !fits(per_chunk * n64) {
            per_chunk -= 1;
        }
        let per_chunk = u32::try_from(per_chunk).unwrap_or(u32::MAX);
        return Ok((0..experts)
            .step_by(per_chunk as usize)
            .map(|e0| (e0..e0.saturating_add(per_chunk).min(experts), 0..n))
            .collect());
    }
    let mut per_chunk = limit / dtype.packed_bytes(1, k64).max(1);
    while per_chunk > 0 && !fits(per_chunk) {
        per_chunk -= 1;
    }
    if per_chunk == 0 {
        return Err(Error::limit(
            format!("one output column of the expert weights [{experts}, {n}, {k}] as {dtype:?}"),
            dtype.packed_bytes(1, k64),
            limit,
            "max_storage_buffer_binding_size (weights split by expert and by output column, never along K)",
        ));
    }
    let per_chunk = u32::try_from(per_chunk).unwrap_or(u32::MAX);
    Ok((0..experts)
        .flat_map(|e| {
            (0..n)
                .step_by(per_chunk as usize)
                .map(move |c0| (e..e + 1, c0..c0.saturating_add(per_chunk).min(n)))
        })
        .collect())
}
