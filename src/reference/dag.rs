//! CPU oracle of the DAG layer's row ops, in `wgsl/dag/program.wgsl`'s order: every stage
//! over every row, stage by stage.

use crate::dag::{RowGraph, RowOp};

pub(crate) const RMS_EPS: f32 = 1e-6;

/// Virtual lanes of the shader's RMS sum (its order does not depend on the workgroup size).
pub(crate) const SUM_LANES: usize = 64;

/// Sum of squares of `row` as the shader forms it: virtual lane `v` accumulates columns
/// `v, v + 64, ...` with `fma`, then a pairwise tree over the 64 lanes.
fn sum_squares(row: &[f32]) -> f32 {
    super::workgroup_sum(row, SUM_LANES, |acc, v| v.mul_add(v, acc))
}

/// The first (stage, element) where `got` leaves the project's bound around `want`
/// ([`super::within`]); `None` when every value is within it.
pub fn first_outside_bound(got: &[Vec<f32>], want: &[Vec<f32>]) -> Option<(usize, usize)> {
    got.iter()
        .zip(want)
        .enumerate()
        .find_map(|(s, (g, w))| g.iter().zip(w).position(|(a, b)| !super::within(*a, *b)).map(|i| (s, i)))
}

/// Every stage's output (`rows x cols`, row-major), in stage order, for input `x`.
pub fn row_graph(g: &RowGraph, x: &[f32]) -> Vec<Vec<f32>> {
    let (rows, cols) = (g.graph().rows() as usize, g.cols() as usize);
    let mut outs: Vec<Vec<f32>> = Vec::with_capacity(g.graph().stages().len());
    for (s, stage) in g.graph().stages().iter().enumerate() {
        let src: &[f32] = match g.source(s) {
            Some(q) => &outs[q],
            None => x,
        };
        let mut out = vec![0f32; rows * cols];
        for r in 0..rows {
            let row = &src[r * cols..(r + 1) * cols];
            let dst = &mut out[r * cols..(r + 1) * cols];
            match &stage.kernel {
                RowOp::Affine { w, b } => {
                    for c in 0..cols {
                        dst[c] = row[c].mul_add(w[c], b[c]);
                    }
                }
                RowOp::Silu => {
                    let (up, down) = (r.saturating_sub(1), (r + 1).min(rows - 1));
                    for c in 0..cols {
                        let quarter_down = 0.25 * src[down * cols + c];
                        let h = 0.25f32.mul_add(src[up * cols + c], 0.5f32.mul_add(row[c], quarter_down));
                        dst[c] = h / (1.0 + (-h).exp());
                    }
                }
                RowOp::Rms { gamma } => {
                    let inv = 1.0 / (sum_squares(row) / cols as f32 + RMS_EPS).sqrt();
                    for c in 0..cols {
                        dst[c] = (row[c] * inv) * gamma[c];
                    }
                }
            }
        }
        outs.push(out);
    }
    outs
}
