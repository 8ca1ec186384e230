//! Seeded synthetic inputs for examples, tests and benchmarks (ChaCha8, so the same seed
//! gives the same data on every platform and release).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A seeded generator of uniform f32 tensors.
#[derive(Clone, Debug)]
pub struct Synth {
    rng: ChaCha8Rng,
}

impl Synth {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Synth { rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn uniform(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.rng.random_range(-scale..scale)).collect()
    }

    /// A routing problem: `x[tokens, hidden]` in [-1, 1) and `gate[experts, hidden]` scaled
    /// by 1/sqrt(hidden) like an initialised linear layer.
    pub fn routing(&mut self, tokens: usize, hidden: usize, experts: usize) -> (Vec<f32>, Vec<f32>) {
        let x = self.uniform(tokens * hidden, 1.0);
        let gate = self.uniform(experts * hidden, 1.0 / (hidden as f32).sqrt());
        (x, gate)
    }
}
