//! Choosing an adapter: the one wgpu instance, the adapters that run compute in order of
//! preference, and [`AdapterSelector`] (a backend and a name, from a string or the
//! environment).

use std::str::FromStr;
use std::sync::OnceLock;

use super::adapter::{AdapterDescription, Capabilities, backend_name};
use crate::error::{Error, Result};

/// Environment variable read by [`Context::new`](super::Context::new): an [`AdapterSelector`]
/// string.
pub const ADAPTER_ENV: &str = "MOEFLOW_ADAPTER";

/// Which adapter to use: a backend, a name substring, or both.
///
/// Parsed from strings such as `vulkan`, `gl`, `vulkan:llvmpipe`, `metal`, `dx12`, or a bare
/// name substring such as `nvidia`. An empty string selects any adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSelector {
    /// Backends to consider.
    pub backends: wgpu::Backends,
    /// Case-insensitive substring of the adapter name.
    pub name: Option<String>,
}

impl Default for AdapterSelector {
    fn default() -> Self {
        AdapterSelector { backends: wgpu::Backends::all(), name: None }
    }
}

fn parse_backend(s: &str) -> Option<wgpu::Backends> {
    match s.to_ascii_lowercase().as_str() {
        "vulkan" | "vk" => Some(wgpu::Backends::VULKAN),
        "metal" | "mtl" => Some(wgpu::Backends::METAL),
        "dx12" | "d3d12" => Some(wgpu::Backends::DX12),
        "gl" | "gles" | "opengl" => Some(wgpu::Backends::GL),
        _ => None,
    }
}

impl FromStr for AdapterSelector {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(AdapterSelector::default());
        }
        let (head, tail) = match s.split_once(':') {
            Some((h, t)) => (h, Some(t)),
            None => (s, None),
        };
        match (parse_backend(head), tail) {
            (Some(backends), tail) => Ok(AdapterSelector {
                backends,
                name: tail.map(str::trim).filter(|t| !t.is_empty()).map(str::to_string),
            }),
            (None, Some(_)) => Err(Error::invalid(format!(
                "adapter selector `{s}`: `{head}` is not a backend (vulkan, metal, dx12, gl)"
            ))),
            (None, None) => {
                Ok(AdapterSelector { backends: wgpu::Backends::all(), name: Some(head.to_string()) })
            }
        }
    }
}

impl AdapterSelector {
    pub(super) fn matches(&self, info: &wgpu::AdapterInfo) -> bool {
        self.backends.contains(wgpu::Backends::from(info.backend)) && self.matches_name(&info.name)
    }

    fn matches_name(&self, name: &str) -> bool {
        self.name.as_ref().is_none_or(|n| name.to_lowercase().contains(&n.to_lowercase()))
    }
}

/// The one wgpu instance that every [`Context`](super::Context) moeflow opens on Vulkan, Metal or
/// DX12 shares (every backend but GL, narrowed by wgpu's own `WGPU_BACKEND` variable if set).
///
/// wgpu tells resources of different devices apart only within one instance: a buffer made through
/// another instance can be taken for an unrelated buffer of this one, where within one instance it
/// is refused. An app that brings its own device
/// ([`Context::from_wgpu`](super::Context::from_wgpu)) should create it from an adapter of
/// [`wgpu_adapters`] (or make sure every buffer it hands to moeflow comes from the same instance as
/// that device).
///
/// GL is the exception: wgpu 30 runs every device of one instance on a single EGL context
/// behind a lock that panics after six seconds of waiting, so GL adapters come from an
/// instance of their own each time (see [`wgpu_adapters`]), and wgpu cannot tell the buffers
/// of two GL contexts apart. Keep each GL [`Context`](super::Context)'s buffers to that context.
pub fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = instance_backends().difference(wgpu::Backends::GL);
        wgpu::Instance::new(desc)
    })
}

/// Every adapter wgpu can see that runs compute shaders: those of [`instance`], enumerated
/// once per process and kept, then the GL adapters of a fresh GL-only instance. An adapter
/// without compute shaders (a GL context below 4.3 or ES 3.1, as EGL gives on some headless
/// GPUs) can run nothing of moeflow's; it is left out with a log line.
#[cfg(not(target_arch = "wasm32"))]
pub fn wgpu_adapters() -> Vec<wgpu::Adapter> {
    pollster::block_on(wgpu_adapters_async())
}

/// [`wgpu_adapters`], awaiting wgpu's enumeration instead of blocking on it.
pub async fn wgpu_adapters_async() -> Vec<wgpu::Adapter> {
    static SHARED: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    let mut adapters = match SHARED.get() {
        Some(shared) => shared.clone(),
        None => {
            let found =
                instance().enumerate_adapters(instance_backends().difference(wgpu::Backends::GL)).await;
            // Another caller may have enumerated meanwhile: the first list is kept.
            SHARED.get_or_init(|| found).clone()
        }
    };
    let gl = instance_backends().intersection(wgpu::Backends::GL);
    if !gl.is_empty() {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = gl;
        adapters.extend(wgpu::Instance::new(desc).enumerate_adapters(gl).await);
    }
    adapters.retain(|a| a.get_info().backend != wgpu::Backend::Noop);
    adapters.retain(|a| {
        let ok = runs_compute(&a.get_downlevel_capabilities());
        if !ok {
            let i = a.get_info();
            log::warn!(
                "moeflow: leaving out {} ({}): it has no compute shaders or no indirect dispatch",
                i.name,
                backend_name(i.backend)
            );
        }
        ok
    });
    adapters
}

/// Whether an adapter with these capabilities runs compute shaders, with grids read from the
/// device (a plan for a maximum token count sizes its grids there; every compute back end has
/// both: GL from 4.3 and ES 3.1, which brought compute shaders).
pub(super) fn runs_compute(caps: &wgpu::DownlevelCapabilities) -> bool {
    caps.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS | wgpu::DownlevelFlags::INDIRECT_EXECUTION)
}

fn instance_backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or_default()
}

/// Rank for choosing a default: real GPUs first, then by backend.
pub(super) fn preference(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let device = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal => 1,
        wgpu::Backend::Dx12 => 2,
        wgpu::Backend::Gl => 3,
        _ => 4,
    };
    (device, backend)
}

/// Every adapter wgpu can see, described with the features and limits moeflow uses.
#[cfg(not(target_arch = "wasm32"))]
pub fn adapters() -> Vec<AdapterDescription> {
    pollster::block_on(adapters_async())
}

/// [`adapters`], awaiting wgpu's enumeration instead of blocking on it (in a browser: the one
/// adapter `navigator.gpu` offers, if any).
pub async fn adapters_async() -> Vec<AdapterDescription> {
    wgpu_adapters_async()
        .await
        .iter()
        .map(|a| AdapterDescription::new(&a.get_info(), Capabilities::wanted(a.features()), &a.limits()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_without_compute_shaders_are_left_out() {
        let full = wgpu::DownlevelCapabilities::default();
        assert!(runs_compute(&full));
        let gl_es3 = wgpu::DownlevelCapabilities {
            flags: full.flags.difference(wgpu::DownlevelFlags::COMPUTE_SHADERS),
            ..full.clone()
        };
        assert!(!runs_compute(&gl_es3));
        let no_indirect = wgpu::DownlevelCapabilities {
            flags: full.flags.difference(wgpu::DownlevelFlags::INDIRECT_EXECUTION),
            ..full
        };
        assert!(!runs_compute(&no_indirect));
        // Every adapter moeflow lists can run compute.
        assert!(super::wgpu_adapters().iter().all(|a| runs_compute(&a.get_downlevel_capabilities())));
    }

    #[test]
    fn selector_parses_backend_and_name() {
        let s: AdapterSelector = "vulkan:llvmpipe".parse().unwrap();
        assert_eq!(s.backends, wgpu::Backends::VULKAN);
        assert_eq!(s.name.as_deref(), Some("llvmpipe"));
        let s: AdapterSelector = "GL".parse().unwrap();
        assert_eq!(s.backends, wgpu::Backends::GL);
        assert_eq!(s.name, None);
        let s: AdapterSelector = "nvidia".parse().unwrap();
        assert_eq!(s.backends, wgpu::Backends::all());
        assert_eq!(s.name.as_deref(), Some("nvidia"));
        assert_eq!("".parse::<AdapterSelector>().unwrap(), AdapterSelector::default());
        assert!("vulcan:llvmpipe".parse::<AdapterSelector>().is_err());
    }
}
