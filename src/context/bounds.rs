//! Which shader modules are built with wgpu's runtime bounds checks ([`BoundsChecks`]).

use std::str::FromStr;

use crate::error::{Error, Result};

/// Environment variable read when a context is made (see [`BoundsChecks`]): `everywhere`
/// builds every module with runtime bounds checks; unset or `where-unproven`, only the modules
/// whose indices are not proven in range. Any other value is logged and taken as `everywhere`.
pub const BOUNDS_CHECKS_ENV: &str = "MOEFLOW_BOUNDS_CHECKS";

/// Which shader modules a context builds with wgpu's runtime bounds checks.
///
/// The checks clamp every dynamic index into a fixed-size array (workgroup tiles, vector
/// lanes; on Vulkan even with robust buffer access) and, on back ends without robust buffer
/// access, every buffer index. The GEMM kernels, whose indices their contract proves in range
/// ([`Indexing::Proven`](crate::shader::Indexing::Proven)), need none. The choice applies to
/// modules built after it is made; both builds give the same bits (tests/gemm.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BoundsChecks {
    /// Modules proven in range without checks, the others with (the default).
    #[default]
    WhereUnproven,
    /// Every module with checks: tests, validation-layer runs, work on a kernel.
    Everywhere,
}

impl FromStr for BoundsChecks {
    type Err = Error;

    /// `where-unproven` or `everywhere`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "where-unproven" => Ok(BoundsChecks::WhereUnproven),
            "everywhere" => Ok(BoundsChecks::Everywhere),
            _ => {
                Err(Error::invalid(format!("bounds checks `{s}`: expected `where-unproven` or `everywhere`")))
            }
        }
    }
}

impl BoundsChecks {
    /// The choice named by [`BOUNDS_CHECKS_ENV`]; the checked one, with a log line, for a
    /// value that names neither.
    pub(super) fn from_env() -> Self {
        match std::env::var(BOUNDS_CHECKS_ENV) {
            Err(_) => BoundsChecks::default(),
            Ok(v) => v.parse().unwrap_or_else(|e| {
                log::warn!("moeflow: {BOUNDS_CHECKS_ENV}: {e}; building every module with bounds checks");
                BoundsChecks::Everywhere
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_checks_parse() {
        assert_eq!("everywhere".parse::<BoundsChecks>().unwrap(), BoundsChecks::Everywhere);
        assert_eq!("where-unproven".parse::<BoundsChecks>().unwrap(), BoundsChecks::WhereUnproven);
        let e = "off".parse::<BoundsChecks>().unwrap_err().to_string();
        assert!(e.contains("`off`"), "{e}");
    }
}
