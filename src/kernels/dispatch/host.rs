//! The dispatch layout on the host: a CPU stable sort of routed entries by expert, with the
//! device layout's padding, tile map and bucket lists. It is the CPU oracle of the device
//! layout (`moeflow::reference::dispatch` re-exports it) and the layout
//! [`super::host_dispatch`] uploads (the host-dispatch path).

use super::meta::{
    META_INVALID, META_MAX_COUNT, META_NONEMPTY, META_OVERFLOW, META_PADDED_ROWS, META_ROWS, META_TILES,
    META_WORDS,
};

/// Marks padding rows, unused tiles and empty bucket slots.
pub const NONE: u32 = u32::MAX;

/// Summary words of a layout (the device writes the same into its `meta` buffer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Valid entries placed (sum of counts).
    pub rows: u32,
    /// Rows including tile padding.
    pub padded_rows: u32,
    /// Tiles in use (`padded_rows / tile`).
    pub tiles: u32,
    /// Largest expert count.
    pub max_count: u32,
    /// Experts with at least one entry.
    pub nonempty: u32,
    /// Entries past the bucket bound (0 when unbounded).
    pub overflow: u32,
    /// Entries whose expert index was out of range (placed nowhere).
    pub invalid: u32,
}

impl Meta {
    /// From the device's meta words (words past the slice read as 0).
    pub fn from_words(w: &[u32]) -> Self {
        let word = |i: u32| w.get(i as usize).copied().unwrap_or(0);
        Meta {
            rows: word(META_ROWS),
            padded_rows: word(META_PADDED_ROWS),
            tiles: word(META_TILES),
            max_count: word(META_MAX_COUNT),
            nonempty: word(META_NONEMPTY),
            overflow: word(META_OVERFLOW),
            invalid: word(META_INVALID),
        }
    }

    /// As the device's meta words (the last one unused).
    pub fn to_words(self) -> [u32; META_WORDS as usize] {
        let mut w = [0; META_WORDS as usize];
        for (i, v) in [
            (META_ROWS, self.rows),
            (META_PADDED_ROWS, self.padded_rows),
            (META_TILES, self.tiles),
            (META_MAX_COUNT, self.max_count),
            (META_NONEMPTY, self.nonempty),
            (META_OVERFLOW, self.overflow),
            (META_INVALID, self.invalid),
        ] {
            w[i as usize] = v;
        }
        w
    }
}

/// A grouped row layout. Entry `i = token * k + slot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Entries per expert, `[E]`.
    pub counts: Vec<u32>,
    /// Exclusive offsets of the unpadded grouping, `[E + 1]`.
    pub offsets: Vec<u32>,
    /// Exclusive offsets with each count rounded up to the tile, `[E + 1]`.
    pub padded: Vec<u32>,
    /// Grouped row -> entry (NONE for padding), `[padded_rows]`.
    pub perm: Vec<u32>,
    /// Entry -> grouped row (NONE for invalid entries), `[entries]`.
    pub inverse: Vec<u32>,
    /// Tile -> expert for the tiles in use, `[tiles]`.
    pub tile_expert: Vec<u32>,
    /// Overflow list offsets per expert for a bound, `[E + 1]`.
    pub overflow_offsets: Vec<u32>,
    /// Summary.
    pub meta: Meta,
}

/// Builds the layout by a stable sort of entries by expert (indices >= experts are invalid
/// and skipped); `bound` (0: none) only affects the overflow offsets and count.
pub fn layout(indices: &[u32], experts: u32, tile: u32, bound: u32) -> Layout {
    let e = experts as usize;
    let mut counts = vec![0u32; e];
    for &x in indices {
        if x < experts {
            counts[x as usize] += 1;
        }
    }
    let round = |c: u32| c.div_ceil(tile) * tile;
    let over = |c: u32| if bound == 0 { 0 } else { c.saturating_sub(bound) };
    let (mut offsets, mut padded, mut overflow_offsets) =
        (vec![0u32; e + 1], vec![0u32; e + 1], vec![0u32; e + 1]);
    for i in 0..e {
        offsets[i + 1] = offsets[i] + counts[i];
        padded[i + 1] = padded[i] + round(counts[i]);
        overflow_offsets[i + 1] = overflow_offsets[i] + over(counts[i]);
    }
    let padded_rows = padded[e];
    let mut perm = vec![NONE; padded_rows as usize];
    let mut inverse = vec![NONE; indices.len()];
    let mut next: Vec<u32> = padded[..e].to_vec();
    for (i, &x) in indices.iter().enumerate() {
        if x < experts {
            let row = next[x as usize];
            next[x as usize] += 1;
            perm[row as usize] = i as u32;
            inverse[i] = row;
        }
    }
    let tiles = padded_rows / tile;
    let tile_expert = (0..tiles).map(|t| (padded.partition_point(|&p| p <= t * tile) - 1) as u32).collect();
    let rows = offsets[e];
    Layout {
        meta: Meta {
            rows,
            padded_rows,
            tiles,
            max_count: counts.iter().copied().max().unwrap_or(0),
            nonempty: counts.iter().filter(|&&c| c > 0).count() as u32,
            overflow: overflow_offsets[e],
            invalid: indices.len() as u32 - rows,
        },
        counts,
        offsets,
        padded,
        perm,
        inverse,
        tile_expert,
        overflow_offsets,
    }
}

/// Bucket lists from a k = 1 layout: `pad_perm[c * bound + r]` is the token of rank r in
/// bucket c (NONE past its count) and `overflow` the tokens ranked at or past the bound, in
/// (bucket, rank) order.
pub fn buckets(l: &Layout, bound: u32) -> (Vec<u32>, Vec<u32>) {
    let mut pad_perm = vec![NONE; l.counts.len() * bound as usize];
    let mut overflow = Vec::new();
    for (c, &count) in l.counts.iter().enumerate() {
        for r in 0..count {
            let token = l.perm[(l.offsets[c] + r) as usize];
            if r < bound {
                pad_perm[c * bound as usize + r as usize] = token;
            } else {
                overflow.push(token);
            }
        }
    }
    (pad_perm, overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_layout_by_hand() {
        // tokens 0..3, k = 2: entries (0,0)=1 (0,1)=0 (1,0)=1 (1,1)=2 (2,0)=1 (2,1)=0
        let l = layout(&[1, 0, 1, 2, 1, 0], 4, 2, 0);
        assert_eq!(l.counts, vec![2, 3, 1, 0]);
        assert_eq!(l.offsets, vec![0, 2, 5, 6, 6]);
        assert_eq!(l.padded, vec![0, 2, 6, 8, 8]);
        assert_eq!(l.perm, vec![1, 5, 0, 2, 4, NONE, 3, NONE]);
        assert_eq!(l.inverse, vec![2, 0, 3, 6, 4, 1]);
        assert_eq!(l.tile_expert, vec![0, 1, 1, 2]);
        assert_eq!(l.meta.max_count, 3);
        assert_eq!(l.meta.nonempty, 3);
        let l1 = layout(&[1, 0, 1, 1, 1], 2, 1, 2);
        let (pad, over) = buckets(&l1, 2);
        assert_eq!(pad, vec![1, NONE, 0, 2]);
        assert_eq!(over, vec![3, 4]);
        assert_eq!(l1.meta.overflow, 2);
    }
}
