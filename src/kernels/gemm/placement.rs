//! [`ExpertPlacement`]: which of a layer's routed experts the device holds and which the host
//! (llama.cpp's `--cpu-moe` puts every routed expert on the host, `-ot` a chosen set).

use std::ops::Range;

use crate::error::{Error, Result};

/// Where each of a layer's `E` routed experts lives: on the device (its weights uploaded,
/// computed by the expert kernels) or on the host (its weights left in host memory, computed
/// by [`crate::host_experts::HostExperts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertPlacement {
    on_host: Vec<bool>,
}

impl ExpertPlacement {
    /// Every expert on the device (the layer as it runs without host experts).
    pub fn all_on_device(experts: u32) -> Self {
        ExpertPlacement { on_host: vec![false; experts as usize] }
    }

    /// Every expert on the host (`--cpu-moe`).
    pub fn all_on_host(experts: u32) -> Self {
        ExpertPlacement { on_host: vec![true; experts as usize] }
    }

    /// The experts `host` on the host, the others on the device (`-ot`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an expert out of `0..experts` or named twice.
    pub fn with_host(experts: u32, host: &[u32]) -> Result<Self> {
        let mut on_host = vec![false; experts as usize];
        for &e in host {
            let slot = on_host.get_mut(e as usize).ok_or_else(|| {
                Error::invalid(format!("host expert {e} is out of range: the layer has experts 0..{experts}"))
            })?;
            if *slot {
                return Err(Error::invalid(format!("expert {e} is placed on the host twice")));
            }
            *slot = true;
        }
        Ok(ExpertPlacement { on_host })
    }

    /// E.
    pub fn experts(&self) -> u32 {
        self.on_host.len() as u32
    }

    /// Whether expert `e` is on the host (false past E).
    pub fn on_host(&self, e: u32) -> bool {
        self.on_host.get(e as usize).copied().unwrap_or(false)
    }

    /// The experts on the host, ascending.
    pub fn host_experts(&self) -> Vec<u32> {
        (0..self.experts()).filter(|&e| self.on_host(e)).collect()
    }

    /// The experts on the device, ascending.
    pub fn device_experts(&self) -> Vec<u32> {
        (0..self.experts()).filter(|&e| !self.on_host(e)).collect()
    }

    /// The runs of consecutive device experts within `experts`.
    pub(crate) fn device_runs(&self, experts: Range<u32>) -> Vec<Range<u32>> {
        let mut runs: Vec<Range<u32>> = Vec::new();
        for e in experts.filter(|&e| !self.on_host(e)) {
            match runs.last_mut() {
                Some(run) if run.end == e => run.end = e + 1,
                _ => runs.push(e..e + 1),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_name_their_experts_and_refuse_bad_ones() {
        let p = ExpertPlacement::with_host(8, &[1, 2, 6]).unwrap();
        assert_eq!(p.host_experts(), vec![1, 2, 6]);
        assert_eq!(p.device_experts(), vec![0, 3, 4, 5, 7]);
        assert_eq!(p.device_runs(0..8), vec![0..1, 3..6, 7..8]);
        assert_eq!(p.device_runs(2..5), vec![3..5]);
        assert!(ExpertPlacement::all_on_host(4).device_runs(0..4).is_empty());
        let err = ExpertPlacement::with_host(8, &[8]).unwrap_err().to_string();
        assert!(err.contains("host expert 8 is out of range"), "{err}");
        let err = ExpertPlacement::with_host(8, &[3, 3]).unwrap_err().to_string();
        assert!(err.contains("expert 3 is placed on the host twice"), "{err}");
    }
}
