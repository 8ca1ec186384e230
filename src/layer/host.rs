//! The layer's weights on the host ([`MoeWeights`], [`RouterWeights`]) and their checks
//! against a configuration.

use super::config::MoeConfig;
use crate::error::{Error, Result};

/// Host weights of a MoE layer (f32; rounded to `weight_dtype` on upload).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeWeights {
    /// Router `[E, H]`.
    pub router: Vec<f32>,
    /// Selection bias `[E]`.
    pub bias: Option<Vec<f32>>,
    /// Expert gate projections `[E, F, H]`.
    pub gate: Vec<f32>,
    /// Expert up projections `[E, F, H]`.
    pub up: Vec<f32>,
    /// Expert down projections `[E, H, F]`.
    pub down: Vec<f32>,
    /// Shared expert `(gate [Fs, H], up [Fs, H], down [H, Fs])`.
    pub shared: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
    /// Shared expert gate `[H]`.
    pub shared_gate: Option<Vec<f32>>,
    /// Router bias `[E]`, added to the logits (`RouteConfig::router_bias`).
    pub router_bias: Option<Vec<f32>>,
    /// Expert projection biases (`MoeConfig::expert_bias`).
    pub expert_bias: Option<ExpertBiasValues>,
}

/// The routed experts' projection biases on the host (gpt-oss's `gate_up_proj_bias`, split
/// into gate and up, and `down_proj_bias`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertBiasValues {
    /// Gate biases `[E, F]`.
    pub gate: Vec<f32>,
    /// Up biases `[E, F]`.
    pub up: Vec<f32>,
    /// Down biases `[E, H]`.
    pub down: Vec<f32>,
}

impl ExpertBiasValues {
    fn check(&self, [e, f, h]: [u32; 3]) -> Result<()> {
        expect_len("experts gate bias", self.gate.len(), &[e, f])?;
        expect_len("experts up bias", self.up.len(), &[e, f])?;
        expect_len("experts down bias", self.down.len(), &[e, h])
    }
}

fn expect_len(what: &str, got: usize, dims: &[u32]) -> Result<()> {
    let want: u64 = dims.iter().map(|&d| u64::from(d)).product();
    if got as u64 != want {
        return Err(Error::shape(what, format!("{dims:?} = {want} elements"), got));
    }
    Ok(())
}

impl MoeWeights {
    /// Checks every tensor against `cfg`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a tensor whose length does not fit `cfg`;
    /// [`Error::InvalidArgument`] when the shared expert's tensors and `cfg.shared_ffn` disagree.
    pub fn check(&self, cfg: &MoeConfig) -> Result<()> {
        let (h, f, e) = (cfg.route.hidden, cfg.ffn, cfg.route.experts);
        check_router(
            cfg,
            &self.router,
            self.bias.as_deref(),
            self.shared_gate.as_deref(),
            self.router_bias.as_deref(),
        )?;
        match (&self.expert_bias, cfg.expert_bias) {
            (Some(b), true) => b.check([e, f, h])?,
            (None, false) => {}
            _ => return Err(Error::invalid("expert bias weights and config.expert_bias disagree")),
        }
        expect_len("experts gate", self.gate.len(), &[e, f, h])?;
        expect_len("experts up", self.up.len(), &[e, f, h])?;
        expect_len("experts down", self.down.len(), &[e, h, f])?;
        match (&self.shared, cfg.shared_ffn) {
            (Some((g, u, d)), Some(fs)) => {
                expect_len("shared gate_proj", g.len(), &[fs, h])?;
                expect_len("shared up_proj", u.len(), &[fs, h])?;
                expect_len("shared down_proj", d.len(), &[h, fs])?;
            }
            (None, None) => {}
            _ => return Err(Error::invalid("shared expert weights and config.shared_ffn disagree")),
        }
        Ok(())
    }
}

/// The small f32 tensors of a layer besides its experts: the router, its selection bias
/// and the shared expert's gate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouterWeights {
    /// Router `[E, H]`.
    pub router: Vec<f32>,
    /// Selection bias `[E]`.
    pub bias: Option<Vec<f32>>,
    /// Shared expert gate `[H]`.
    pub shared_gate: Option<Vec<f32>>,
    /// Router bias `[E]`, added to the logits (`RouteConfig::router_bias`).
    pub router_bias: Option<Vec<f32>>,
}

impl RouterWeights {
    /// Checks every tensor against `cfg`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a tensor whose shape does not fit `cfg`;
    /// [`Error::InvalidArgument`] when the shared expert's tensors and `cfg.shared_ffn` disagree.
    pub fn check(&self, cfg: &MoeConfig) -> Result<()> {
        check_router(
            cfg,
            &self.router,
            self.bias.as_deref(),
            self.shared_gate.as_deref(),
            self.router_bias.as_deref(),
        )
    }

    /// The router as the gate buffer holds it: `[E, H]`, then the router bias `[E]` if any.
    pub(super) fn gate_buffer(&self) -> Vec<f32> {
        let mut gate = self.router.clone();
        gate.extend(self.router_bias.iter().flatten());
        gate
    }
}

fn check_router(
    cfg: &MoeConfig,
    router: &[f32],
    bias: Option<&[f32]>,
    shared_gate: Option<&[f32]>,
    router_bias: Option<&[f32]>,
) -> Result<()> {
    let (h, e) = (cfg.route.hidden, cfg.route.experts);
    expect_len("router", router.len(), &[e, h])?;
    match (router_bias, cfg.route.router_bias) {
        (Some(b), true) => expect_len("router bias", b.len(), &[e])?,
        (None, false) => {}
        _ => return Err(Error::invalid("router bias weights and config.route.router_bias disagree")),
    }
    match (bias, cfg.route.bias) {
        (Some(b), true) => expect_len("bias", b.len(), &[e])?,
        (None, false) => {}
        (Some(_), false) => return Err(Error::invalid("weights have a bias but the config does not")),
        (None, true) => {
            return Err(Error::invalid("the config selects with a bias but the weights have none"));
        }
    }
    match (shared_gate, cfg.shared_gate) {
        (Some(g), true) => expect_len("shared expert gate", g.len(), &[h]),
        (None, false) => Ok(()),
        _ => Err(Error::invalid("shared expert gate weights and config.shared_gate disagree")),
    }
}
