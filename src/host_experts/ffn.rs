//! The host experts' FFN over the rows routed to them ([`HostExperts::run`]).
//!
//! Two passes, each threaded over (expert, block of [`R`] output columns): gate and up over
//! every row of an expert at once, each column's weights decoded once per chunk of K and
//! multiplied into all its rows, then the activation; then down over the activations. Each
//! output column's dot runs over K in the layer's order (`kernel.rs`), its bias one add after
//! it, the activation `reference::gemm::epilogue`: the bits of `reference::gemm::ffn_row`.

use rayon::prelude::*;

use super::decode;
use super::experts::HostExperts;
use super::kernel::{self, Lanes, R};
use super::projection::HostProjection;
use crate::error::{Error, Result};
use crate::kernels::gemm::{GemmOrder, StoredValues};
use crate::reference::gemm::epilogue;

/// Columns of K decoded into a tile at a time: a multiple of 128 (so FP8's groups and the
/// 32-value blocks stay whole), 16 KiB of f32 tile.
const KC: usize = 256;

/// One row routed to a host expert: token `token`'s x row through expert `expert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostEntry {
    /// The row of x.
    pub token: u32,
    /// The expert.
    pub expert: u32,
}

/// The rows of one expert: indices into the entries, in their order.
struct Group {
    expert: u32,
    entries: Vec<usize>,
}

/// Per-thread tiles of decoded weights.
struct Tiles {
    a: Vec<Lanes>,
    b: Vec<Lanes>,
}

impl Tiles {
    fn new() -> Self {
        Tiles { a: vec![[0.0; R]; KC], b: vec![[0.0; R]; KC] }
    }
}

/// The accumulators of a block of columns for each row, in an order.
enum Acc {
    Strict(Vec<[Lanes; 4]>),
    Fast(Vec<Lanes>),
}

impl Acc {
    fn new(order: GemmOrder, rows: usize) -> Result<Self> {
        Ok(match order {
            GemmOrder::Strict => Acc::Strict(filled("host experts' accumulators", rows, [[0.0; R]; 4])?),
            GemmOrder::Fast => Acc::Fast(filled("host experts' accumulators", rows, [0.0; R])?),
        })
    }

    /// Adds the chunk of K at `at` of every row of `x` (rows `stride` apart) times `tile`.
    fn add(&mut self, tile: &[Lanes], x: &[f32], stride: usize, at: usize) {
        match self {
            Acc::Strict(a) => kernel::strict_chunk(tile, x, stride, at, a),
            Acc::Fast(a) => kernel::fast_chunk(tile, x, stride, at, a),
        }
    }

    /// Row `m`'s dot products.
    fn sums(&self, m: usize) -> Lanes {
        match self {
            Acc::Strict(a) => kernel::strict_sums(&a[m]),
            Acc::Fast(a) => a[m],
        }
    }
}

/// A host buffer of `len` copies of `value`, or [`Error::HostMemory`] naming `what`.
fn filled<T: Clone>(what: &str, len: usize, value: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::HostMemory {
        what: what.to_string(),
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(len, value);
    Ok(v)
}

/// A zeroed host buffer of `len` f32s (as [`filled`]).
fn zeros(what: &str, len: usize) -> Result<Vec<f32>> {
    filled(what, len, 0.0)
}

impl HostExperts<'_> {
    /// Computes `out[i, H]` = expert `entries[i].expert`'s FFN of `x[entries[i].token]` for
    /// every entry, from `x[tokens, H]`: `down(act(gate x + b_g, up x + b_u)) + b_d`, each
    /// output the bits of `reference::gemm::ffn_row` on the decoded weights in this order.
    /// Entries of one expert may come in any order and repeat a token; no entries is no
    /// work.
    ///
    /// # Errors
    /// [`Error::Shape`] when `x` is not whole rows of H or `out` is not `entries.len()` rows;
    /// [`Error::InvalidArgument`] for an entry whose token is past x's rows or whose expert
    /// the host does not hold (or is past E); [`Error::HostMemory`] where the host cannot
    /// allocate the rows' working buffers.
    pub fn run(&self, x: &[f32], entries: &[HostEntry], out: &mut [f32]) -> Result<()> {
        let [experts, _, h] = self.shape();
        let h = h as usize;
        if !x.len().is_multiple_of(h) {
            return Err(Error::shape("host experts' x", format!("rows of H = {h}"), x.len()));
        }
        if out.len() as u64 != entries.len() as u64 * h as u64 {
            return Err(Error::shape(
                "host experts' out",
                format!("{} rows of H = {h} (one per entry)", entries.len()),
                out.len(),
            ));
        }
        let tokens = x.len() / h;
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts as usize];
        for (i, en) in entries.iter().enumerate() {
            if en.token as usize >= tokens {
                return Err(Error::invalid(format!(
                    "host entry {i} names token {} but x has {tokens} rows",
                    en.token
                )));
            }
            if !self.holds(en.expert) {
                return Err(Error::invalid(format!(
                    "host entry {i} is routed to expert {}, which the host does not hold (it holds {:?} of 0..{experts})",
                    en.expert,
                    self.experts()
                )));
            }
            by_expert[en.expert as usize].push(i);
        }
        let groups: Vec<Group> = by_expert
            .into_iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, entries)| Group { expert: e as u32, entries })
            .collect();
        if groups.is_empty() {
            return Ok(());
        }
        match &self.pool {
            Some(pool) => pool.install(|| self.compute(x, entries, &groups, out)),
            None => self.compute(x, entries, &groups, out),
        }
    }

    /// [`Self::run`] on checked entries grouped by expert.
    fn compute(&self, x: &[f32], entries: &[HostEntry], groups: &[Group], out: &mut [f32]) -> Result<()> {
        let [_, f, h] = self.shape();
        let (f, h) = (f as usize, h as usize);
        let (f4, h4) = (f.next_multiple_of(4), h.next_multiple_of(4));
        // Each expert's rows of x, K padded with zeros to a multiple of four.
        let xs = groups
            .iter()
            .map(|g| {
                let mut rows = zeros("host experts' x rows", g.entries.len() * h4)?;
                for (row, &i) in rows.chunks_exact_mut(h4).zip(&g.entries) {
                    let t = entries[i].token as usize;
                    row[..h].copy_from_slice(&x[t * h..(t + 1) * h]);
                }
                Ok(rows)
            })
            .collect::<Result<Vec<_>>>()?;
        let up_tasks: Vec<(usize, usize)> =
            (0..groups.len()).flat_map(|g| (0..f.div_ceil(R)).map(move |b| (g, b))).collect();
        let act_blocks: Vec<Vec<f32>> = up_tasks
            .par_iter()
            .map_init(Tiles::new, |tiles, &(g, b)| self.gate_up_block(tiles, &groups[g], &xs[g], b))
            .collect::<Result<_>>()?;
        let mut acts = groups
            .iter()
            .map(|g| zeros("host experts' activations", g.entries.len() * f4))
            .collect::<Result<Vec<_>>>()?;
        for (&(g, b), block) in up_tasks.iter().zip(&act_blocks) {
            scatter(block, &mut acts[g], f4, b * R..f.min((b + 1) * R));
        }
        drop(act_blocks);
        let down_tasks: Vec<(usize, usize)> =
            (0..groups.len()).flat_map(|g| (0..h.div_ceil(R)).map(move |b| (g, b))).collect();
        let out_blocks: Vec<Vec<f32>> = down_tasks
            .par_iter()
            .map_init(Tiles::new, |tiles, &(g, b)| self.down_block(tiles, &groups[g], &acts[g], b))
            .collect::<Result<_>>()?;
        for (&(g, b), block) in down_tasks.iter().zip(&out_blocks) {
            let cols = b * R..h.min((b + 1) * R);
            for (row, &i) in block.chunks_exact(R).zip(&groups[g].entries) {
                out[i * h + cols.start..i * h + cols.end].copy_from_slice(&row[..cols.len()]);
            }
        }
        Ok(())
    }

    /// Columns `b·R ..` of the activations of `group`'s rows: `[rows, R]`.
    fn gate_up_block(&self, tiles: &mut Tiles, group: &Group, x: &[f32], b: usize) -> Result<Vec<f32>> {
        let [_, f, h] = self.shape();
        let (f, h) = (f as usize, h as usize);
        let (e, rows) = (group.expert, group.entries.len());
        let cols = b * R..f.min((b + 1) * R);
        let (gate, up) = (values(&self.gate, e)?, values(&self.up, e)?);
        let (mut acc_g, mut acc_u) = (Acc::new(self.order, rows)?, Acc::new(self.order, rows)?);
        let stride = h.next_multiple_of(4);
        for at in (0..h).step_by(KC) {
            let ks = at..h.min(at + KC);
            let len = ks.len().next_multiple_of(4);
            decode::tile(gate, h, cols.clone(), ks.clone(), &mut tiles.a[..len]);
            decode::tile(up, h, cols.clone(), ks, &mut tiles.b[..len]);
            acc_g.add(&tiles.a[..len], x, stride, at);
            acc_u.add(&tiles.b[..len], x, stride, at);
        }
        let mut block = zeros("host experts' output block", rows * R)?;
        for (m, out) in block.chunks_exact_mut(R).enumerate() {
            let (g, u) = (acc_g.sums(m), acc_u.sums(m));
            for (r, n) in cols.clone().enumerate() {
                let i = e as usize * f + n;
                let (g, u) = match &self.bias {
                    Some(bias) => (g[r] + bias.gate[i], u[r] + bias.up[i]),
                    None => (g[r], u[r]),
                };
                out[r] = epilogue(self.activation, g, u);
            }
        }
        Ok(block)
    }

    /// Columns `b·R ..` of the outputs of `group`'s rows from their activations `act`
    /// (`[rows, F padded to four]`): `[rows, R]`.
    fn down_block(&self, tiles: &mut Tiles, group: &Group, act: &[f32], b: usize) -> Result<Vec<f32>> {
        let [_, f, h] = self.shape();
        let (f, h) = (f as usize, h as usize);
        let (e, rows) = (group.expert, group.entries.len());
        let cols = b * R..h.min((b + 1) * R);
        let down = values(&self.down, e)?;
        let mut acc = Acc::new(self.order, rows)?;
        let stride = f.next_multiple_of(4);
        for at in (0..f).step_by(KC) {
            let ks = at..f.min(at + KC);
            let len = ks.len().next_multiple_of(4);
            decode::tile(down, f, cols.clone(), ks, &mut tiles.a[..len]);
            acc.add(&tiles.a[..len], act, stride, at);
        }
        let mut block = zeros("host experts' output block", rows * R)?;
        for (m, out) in block.chunks_exact_mut(R).enumerate() {
            let d = acc.sums(m);
            for (r, n) in cols.clone().enumerate() {
                out[r] = match &self.bias {
                    Some(bias) => d[r] + bias.down[e as usize * h + n],
                    None => d[r],
                };
            }
        }
        Ok(block)
    }
}

/// Expert `e`'s values of `p` ([`HostExperts::new`] checked that the projections hold the same
/// experts, and [`HostExperts::run`] that each entry's expert is held).
fn values<'p, 'a>(p: &'p HostProjection<'a>, e: u32) -> Result<&'p StoredValues<'a>> {
    p.values(e).ok_or_else(|| Error::invalid(format!("host memory holds no weights of expert {e}")))
}

/// Writes a `[rows, R]` block into columns `cols` of `[rows, stride]` rows.
fn scatter(block: &[f32], rows: &mut [f32], stride: usize, cols: std::ops::Range<usize>) {
    for (src, dst) in block.chunks_exact(R).zip(rows.chunks_exact_mut(stride)) {
        dst[cols.clone()].copy_from_slice(&src[..cols.len()]);
    }
}
