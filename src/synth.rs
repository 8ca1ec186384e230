//! Seeded synthetic inputs for examples, tests and benchmarks (ChaCha8, so the same seed
//! gives the same data on every platform and release).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::layer::{ExpertBiasValues, MoeConfig, MoeWeights};

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

    /// Weights for every tensor `cfg` needs, scaled like initialised linear layers (router
    /// rows by 1/sqrt(H), down projections by 1/sqrt(F)).
    pub fn moe_weights(&mut self, cfg: &MoeConfig) -> MoeWeights {
        let (h, f, e) = (cfg.route.hidden as usize, cfg.ffn as usize, cfg.route.experts as usize);
        let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (f as f32).sqrt());
        MoeWeights {
            router: self.uniform(e * h, sh),
            bias: cfg.route.bias.then(|| self.uniform(e, 0.05)),
            gate: self.uniform(e * f * h, sh),
            up: self.uniform(e * f * h, sh),
            down: self.uniform(e * h * f, sf),
            shared: cfg.shared_ffn.map(|fs| {
                let fs = fs as usize;
                (
                    self.uniform(fs * h, sh),
                    self.uniform(fs * h, sh),
                    self.uniform(h * fs, 1.0 / (fs as f32).sqrt()),
                )
            }),
            shared_gate: cfg.shared_gate.then(|| self.uniform(h, sh)),
            // Drawn last, so layers without them keep their values.
            router_bias: cfg.route.router_bias.then(|| self.uniform(e, 0.5)),
            expert_bias: cfg.expert_bias.then(|| ExpertBiasValues {
                gate: self.uniform(e * f, 0.5),
                up: self.uniform(e * f, 0.5),
                down: self.uniform(e * h, 0.1),
            }),
        }
    }
}
