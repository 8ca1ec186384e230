//! [`HostExperts`]: the routed experts a host holds, their biases, order, activation and
//! threads, checked against each other.

use std::sync::Arc;

use super::kernel::{self, RowsIsa};
use super::memory::reserved;
use super::projection::HostProjection;
use crate::error::{Error, Result};
use crate::kernels::gemm::{Activation, GemmOrder};

/// The routed experts' biases on the host (gpt-oss): gate and up `[E, F]`, down `[E, H]`.
#[derive(Clone, Copy, Debug)]
pub struct HostBias<'a> {
    /// `[E, F]`.
    pub gate: &'a [f32],
    /// `[E, F]`.
    pub up: &'a [f32],
    /// `[E, H]`.
    pub down: &'a [f32],
}

/// The biases [`HostExperts::with_bias`] keeps, copied: gate and up `[E, F]`, down `[E, H]`.
#[derive(Clone, Debug)]
pub(super) struct Biases {
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) down: Vec<f32>,
}

/// A layer's routed experts that host memory holds, computed on the CPU: gate and up
/// `[E, F, H]`, down `[E, H, F]` ([`HostProjection`]s holding the same experts in one dtype),
/// the activation between them, optional biases and the accumulation order of every dot.
#[derive(Clone, Debug)]
pub struct HostExperts<'a> {
    pub(super) gate: HostProjection<'a>,
    pub(super) up: HostProjection<'a>,
    pub(super) down: HostProjection<'a>,
    pub(super) bias: Option<Biases>,
    pub(super) order: GemmOrder,
    pub(super) activation: Activation,
    pub(super) pool: Option<Arc<rayon::ThreadPool>>,
    /// The instructions the rows kernels run in on this CPU (None: the tile serves).
    pub(super) rows: Option<RowsIsa>,
}

impl<'a> HostExperts<'a> {
    /// The experts `gate`, `up` and `down` hold, run with `activation` in `order`, on rayon's
    /// global pool (one thread per core unless `RAYON_NUM_THREADS` says).
    ///
    /// # Errors
    /// [`Error::Shape`] when the shapes are not `[E, F, H]`, `[E, F, H]`, `[E, H, F]`;
    /// [`Error::InvalidArgument`] for projections that hold different experts (an expert
    /// placed on the host with no host memory for one of its weights) or different dtypes, or
    /// an activation whose constants do not validate.
    pub fn new(
        gate: HostProjection<'a>,
        up: HostProjection<'a>,
        down: HostProjection<'a>,
        order: GemmOrder,
        activation: Activation,
    ) -> Result<Self> {
        activation.validate()?;
        let [e, f, h] = gate.shape();
        for (name, p, want) in [("up", &up, [e, f, h]), ("down", &down, [e, h, f])] {
            if p.shape() != want {
                return Err(Error::shape(
                    format!("host experts' {name} projection"),
                    format!("{want:?} (gate is {:?})", gate.shape()),
                    format!("{:?}", p.shape()),
                ));
            }
        }
        for x in 0..e {
            let held = [("gate", gate.holds(x)), ("up", up.holds(x)), ("down", down.holds(x))];
            if held.iter().any(|h| h.1) && !held.iter().all(|h| h.1) {
                let missing: Vec<&str> = held.iter().filter(|h| !h.1).map(|h| h.0).collect();
                return Err(Error::invalid(format!(
                    "expert {x} is placed on the host, but host memory holds no {} weights for it",
                    missing.join(" or ")
                )));
            }
        }
        if gate.dtype() != up.dtype() || gate.dtype() != down.dtype() {
            return Err(Error::invalid(format!(
                "host experts' projections are stored in one dtype; got gate {:?}, up {:?}, down {:?}",
                gate.dtype(),
                up.dtype(),
                down.dtype()
            )));
        }
        Ok(HostExperts { gate, up, down, bias: None, order, activation, pool: None, rows: RowsIsa::detect() })
    }

    /// Adds the experts' projection biases, each one add after its dot product (copied: they
    /// are small, and may be converted from the checkpoint's).
    ///
    /// # Errors
    /// [`Error::Shape`] when the lengths are not `[E, F]`, `[E, F]`, `[E, H]`;
    /// [`Error::HostMemory`] where the host cannot hold the copy.
    pub fn with_bias(self, bias: HostBias<'_>) -> Result<Self> {
        let [e, f, h] = self.gate.shape();
        let (e, f, h) = (e as usize, f as usize, h as usize);
        let copy = |name: &str, values: &[f32], want: usize| -> Result<Vec<f32>> {
            if values.len() != want {
                return Err(Error::shape(format!("host experts' {name} bias"), want, values.len()));
            }
            let mut copy = reserved(&format!("host experts' {name} bias"), want)?;
            copy.extend_from_slice(values);
            Ok(copy)
        };
        let bias = Biases {
            gate: copy("gate", bias.gate, e * f)?,
            up: copy("up", bias.up, e * f)?,
            down: copy("down", bias.down, e * h)?,
        };
        Ok(HostExperts { bias: Some(bias), ..self })
    }

    /// Runs on a pool of `threads` threads of its own instead of rayon's global pool (as
    /// llama.cpp's `-t`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero threads or a pool the OS refuses.
    pub fn with_threads(self, threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::invalid("host experts need at least 1 thread"));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("moeflow-host-{i}"))
            .build()
            .map_err(|e| Error::invalid(format!("host experts' thread pool of {threads}: {e}")))?;
        Ok(HostExperts { pool: Some(Arc::new(pool)), ..self })
    }

    /// `[E, F, H]`: experts, FFN size, hidden size.
    pub fn shape(&self) -> [u32; 3] {
        self.gate.shape()
    }

    /// Whether expert `e` is on the host.
    pub fn holds(&self, e: u32) -> bool {
        self.gate.holds(e)
    }

    /// The experts on the host, ascending.
    pub fn experts(&self) -> Vec<u32> {
        (0..self.shape()[0]).filter(|&e| self.holds(e)).collect()
    }

    /// Bytes of host memory their weights take, as stored (biases not counted).
    pub fn bytes(&self) -> u64 {
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// The accumulation order of every dot product.
    pub fn order(&self) -> GemmOrder {
        self.order
    }

    /// The activation between the gate/up and down projections.
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// Whether the projections add biases.
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Threads the FFN runs on.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    /// The SIMD target the dot products run on this CPU: `avx512`, `avx2+fma`, `neon` or
    /// `baseline` (chosen at run time; every target gives the same bits).
    pub fn simd() -> &'static str {
        kernel::simd_target()
    }
}
