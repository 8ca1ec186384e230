//! What a kernel family registers with the benchmark matrix: a named A/B comparison with
//! two size sets (GPU and CPU adapters), each with held-out sizes for confirmation.

use std::fmt;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::context::{AdapterDescription, Context};
use crate::error::{Error, Result};
use crate::pipeline::Dispatch;

/// Which size set runs: the one named in the issues for real GPUs, or a smaller one for
/// adapters that run shaders on the CPU (lavapipe, llvmpipe), so the matrix stays short there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SizeSet {
    /// Sizes for GPUs.
    Gpu,
    /// Smaller sizes for CPU adapters.
    Cpu,
}

impl SizeSet {
    /// `Cpu` for CPU adapters, `Gpu` otherwise.
    pub fn for_adapter(adapter: &AdapterDescription) -> Self {
        if adapter.is_cpu() { SizeSet::Cpu } else { SizeSet::Gpu }
    }
}

/// One size of a comparison: named integer parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Size(pub Vec<(String, u32)>);

impl Size {
    /// A size from `(name, value)` pairs.
    pub fn of(params: &[(&str, u32)]) -> Self {
        Size(params.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    /// The value of `name`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the parameter and the size's parameters when the size
    /// has none of that name (a misspelt parameter is an error, not a size of 0).
    pub fn get(&self, name: &str) -> Result<u32> {
        self.optional(name).ok_or_else(|| {
            Error::InvalidArgument(format!("benchmark size `{self}` has no parameter `{name}`"))
        })
    }

    /// The value of `name`, or `None` when the size leaves it out (a parameter with a
    /// default, such as a worker count the device's probe chooses).
    pub(crate) fn optional(&self, name: &str) -> Option<u32> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(" "))
    }
}

/// A boxed check that reads the variants' outputs back and compares them.
pub type Validate = Box<dyn Fn(&Context) -> Result<()>>;

/// Host-driven work: runs once per call and returns when its effects are complete.
pub(crate) type HostRun = Box<dyn Fn(&Context) -> Result<()>>;

/// What one variant runs per repetition.
pub enum Work {
    /// Dispatches recorded in order into one compute pass: timed on the GPU clock (where the
    /// adapter has timestamps) and the wall clock.
    Gpu(Vec<Dispatch>),
    /// Work driven from the host (readbacks, CPU steps, uploads): wall clock only.
    Host {
        /// The work.
        run: HostRun,
        /// Dispatches it submits per run.
        dispatches: usize,
        /// Device-to-host readbacks per run.
        readbacks: u32,
    },
}

impl Work {
    /// Dispatches per run.
    pub fn dispatches(&self) -> usize {
        match self {
            Work::Gpu(d) => d.len(),
            Work::Host { dispatches, .. } => *dispatches,
        }
    }

    /// Device-to-host readbacks per run.
    pub(crate) fn readbacks(&self) -> u32 {
        match self {
            Work::Gpu(_) => 0,
            Work::Host { readbacks, .. } => *readbacks,
        }
    }
}

/// One size of a comparison, built on a context and ready to time.
pub struct Case {
    /// Variant A (the baseline).
    pub a: Work,
    /// Variant B.
    pub b: Work,
    /// Floating-point operations of one run of the work (0 where it does not apply).
    pub flops: f64,
    /// Bytes the work must move at least once per run (0 where it does not apply).
    pub bytes: f64,
    /// Tokens processed per run (0 where it does not apply), for tokens/s.
    pub tokens: u32,
    /// Reads both variants' outputs and checks them (A against the CPU oracle, B against A
    /// as the contract requires). Called before warm-up and after the timed sequence.
    pub validate: Validate,
    /// What ran, where the comparison's names do not say it all (e.g. which kernel variants).
    pub note: Option<String>,
}

/// A registered A/B comparison.
pub trait Comparison {
    /// Stable name, e.g. `route/fused-vs-unfused`.
    fn name(&self) -> &'static str;
    /// One sentence: what is compared and why.
    fn description(&self) -> &'static str;
    /// Names of variants A and B.
    fn variants(&self) -> (&'static str, &'static str);
    /// Sizes of `set`; `held_out` gives the confirmation sizes.
    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size>;
    /// Builds the case for one size with data from `seed`.
    ///
    /// # Errors
    /// Whatever building the case's buffers and plans returns (shapes, limits, missing
    /// features, device errors).
    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case>;
}

/// The sizes of a set (`held_out`: the confirmation sizes).
pub(crate) type SizesFn = Box<dyn Fn(SizeSet, bool) -> Vec<Size>>;

/// Builds the case for one size with data from a seed.
pub(crate) type BuildFn = Box<dyn Fn(&Context, &Size, u64) -> Result<Case>>;

/// A comparison written as data: its names, its sizes and how one size is built. Every one of
/// moeflow's comparisons is a value of it, made one way: [`Registered::new`] with the sizes and
/// the builder of one comparison, or [`Registered::configured`] for a table of comparisons of
/// one kind that differ in a configuration (a bench module's function returns one, or a list
/// for a table). The trait stays for comparisons a caller writes as a type of its own.
pub struct Registered {
    name: &'static str,
    description: &'static str,
    variants: (&'static str, &'static str),
    sizes: SizesFn,
    build: BuildFn,
}

impl Comparison for Registered {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        self.description
    }
    fn variants(&self) -> (&'static str, &'static str) {
        self.variants
    }
    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        (self.sizes)(set, held_out)
    }
    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        (self.build)(ctx, size, seed)
    }
}

impl Registered {
    /// A comparison: its stable `name` (e.g. `route/fused-vs-unfused`), one sentence of what is
    /// compared and why, the names of variants A and B, its sizes per set (`held_out`: the
    /// confirmation sizes) and the case of one size built with data from a seed.
    pub fn new(
        name: &'static str,
        description: &'static str,
        variants: (&'static str, &'static str),
        sizes: impl Fn(SizeSet, bool) -> Vec<Size> + 'static,
        build: impl Fn(&Context, &Size, u64) -> Result<Case> + 'static,
    ) -> Self {
        Registered { name, description, variants, sizes: Box::new(sizes), build: Box::new(build) }
    }

    /// A comparison of a table of one kind: `sizes` and `build` take the comparison's
    /// configuration (`config`, e.g. the two executors or formats it compares) first.
    pub fn configured<C: 'static>(
        name: &'static str,
        description: &'static str,
        variants: (&'static str, &'static str),
        config: C,
        sizes: fn(&C, SizeSet, bool) -> Vec<Size>,
        build: fn(&C, &Context, &Size, u64) -> Result<Case>,
    ) -> Self {
        let config = Rc::new(config);
        let sized = Rc::clone(&config);
        Registered::new(
            name,
            description,
            variants,
            move |set, held_out| sizes(&sized, set, held_out),
            move |ctx, size, seed| build(&config, ctx, size, seed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Size;

    #[test]
    fn a_missing_size_parameter_is_an_error_naming_it() {
        let size = Size::of(&[("M", 4), ("H", 64)]);
        assert_eq!(size.get("H").unwrap(), 64);
        let err = size.get("h").unwrap_err().to_string();
        assert!(err.contains("`h`") && err.contains("M=4 H=64"), "{err}");
        assert_eq!(size.optional("W"), None);
    }
}
