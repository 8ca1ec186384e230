//! The graph: stages over a grid of row tiles, each reading earlier stages (or the graph
//! input) row-locally, with a halo of neighbouring rows, or whole.
//!
//! Stages can only read stages added before them, so insertion order is a topological
//! order and a graph cannot have a cycle.

use crate::error::{Error, Result};

/// What a stage reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The graph's input.
    Input,
    /// The output of stage `n` (an index returned by [`Graph::add`]).
    Stage(usize),
}

/// How one tile of a stage depends on the rows of what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Rows of the same tile only.
    RowLocal,
    /// Rows of the same tile plus `n` rows on each side (clamped at the edges).
    Halo(u32),
    /// Every row: the source must be complete before any tile of the reader starts.
    Whole,
}

/// One input of a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// What is read.
    pub source: Source,
    /// Which of its rows each tile needs.
    pub reach: Reach,
}

/// A stage: a kernel run over every row tile, and what it reads.
#[derive(Debug)]
pub struct Stage<K> {
    /// Name, for plans and reports.
    pub name: String,
    /// What runs (the executors decide what they can run).
    pub kernel: K,
    /// Inputs, each with its reach.
    pub reads: Vec<Read>,
}

/// A DAG of stages over `rows` rows cut into tiles of `tile_rows` rows (the last tile may be
/// shorter).
#[derive(Debug)]
pub struct Graph<K> {
    rows: u32,
    tile_rows: u32,
    stages: Vec<Stage<K>>,
}

/// Rows `[lo, hi)` of the tiles `[first, last]` a read needs.
fn tiles_for(rows: (u32, u32), tile_rows: u32) -> (u32, u32) {
    (rows.0 / tile_rows, (rows.1 - 1) / tile_rows)
}

impl<K> Graph<K> {
    /// An empty graph over `rows` rows in tiles of `tile_rows`.
    ///
    /// # Errors
    /// [`Error::Shape`] for zero rows or a zero tile.
    pub fn new(rows: u32, tile_rows: u32) -> Result<Self> {
        if rows == 0 || tile_rows == 0 {
            return Err(Error::shape(
                "graph rows and tile rows",
                "both at least 1",
                format!("{rows}, {tile_rows}"),
            ));
        }
        Ok(Graph { rows, tile_rows, stages: Vec::new() })
    }

    /// Adds a stage and returns its index. Every read must name the input or an earlier stage.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a read of a stage that is not earlier.
    pub fn add(&mut self, name: impl Into<String>, kernel: K, reads: Vec<Read>) -> Result<usize> {
        let name = name.into();
        for r in &reads {
            if let Source::Stage(s) = r.source
                && s >= self.stages.len()
            {
                return Err(Error::invalid(format!(
                    "stage `{name}` reads stage {s}, which is not an earlier stage (there are {})",
                    self.stages.len()
                )));
            }
        }
        self.stages.push(Stage { name, kernel, reads });
        Ok(self.stages.len() - 1)
    }

    /// Rows.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Rows per tile.
    pub(crate) fn tile_rows(&self) -> u32 {
        self.tile_rows
    }

    /// Number of row tiles.
    pub fn tiles(&self) -> u32 {
        self.rows.div_ceil(self.tile_rows)
    }

    /// Stages in topological (insertion) order.
    pub fn stages(&self) -> &[Stage<K>] {
        &self.stages
    }

    /// Rows `[lo, hi)` of tile `t`.
    pub(crate) fn tile_span(&self, t: u32) -> (u32, u32) {
        let lo = t * self.tile_rows;
        (lo, (lo + self.tile_rows).min(self.rows))
    }

    /// Rows `[lo, hi)` of the source that rows `[lo, hi)` of a reader need through `reach`.
    pub(crate) fn reach_rows(&self, rows: (u32, u32), reach: Reach) -> (u32, u32) {
        match reach {
            Reach::RowLocal => rows,
            Reach::Halo(h) => (rows.0.saturating_sub(h), (rows.1 + h).min(self.rows)),
            Reach::Whole => (0, self.rows),
        }
    }

    /// Tiles `[first, last]` covering rows `[lo, hi)`.
    pub(crate) fn tiles_of(&self, rows: (u32, u32)) -> (u32, u32) {
        tiles_for(rows, self.tile_rows)
    }
}
