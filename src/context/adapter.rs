//! What an adapter is and can do: its description ([`AdapterDescription`]), the features
//! moeflow uses ([`Capabilities`]) and the limits it reads ([`KeyLimits`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Optional features moeflow enables when the adapter has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Timestamp queries around passes (`TIMESTAMP_QUERY`).
    pub timestamps: bool,
    /// Timestamp writes inside passes and encoders.
    pub timestamps_inside_passes: bool,
    /// Subgroup operations in shaders (`SUBGROUP`).
    pub subgroups: bool,
    /// `f16` in shaders (`SHADER_F16`).
    pub shader_f16: bool,
    /// A driver pipeline cache that can be saved and loaded (`PIPELINE_CACHE`, Vulkan only;
    /// see [`Context::save_pipeline_cache`](super::Context::save_pipeline_cache)).
    #[serde(default)]
    pub pipeline_cache: bool,
    /// wgpu's experimental cooperative matrices (`EXPERIMENTAL_COOPERATIVE_MATRIX`), enabled
    /// only on request ([`COOPERATIVE_MATRIX_ENV`](super::COOPERATIVE_MATRIX_ENV)).
    #[serde(default)]
    pub cooperative_matrix: bool,
}

impl Capabilities {
    fn from_features(f: wgpu::Features) -> Self {
        Capabilities {
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_inside_passes: f.contains(
                wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
                    | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS,
            ),
            subgroups: f.contains(wgpu::Features::SUBGROUP),
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            pipeline_cache: f.contains(wgpu::Features::PIPELINE_CACHE),
            cooperative_matrix: f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
        }
    }

    /// The wgpu features that moeflow asks for, as far as `available` has them.
    pub(crate) fn wanted(available: wgpu::Features) -> wgpu::Features {
        let wanted = wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SHADER_F16
            | wgpu::Features::PIPELINE_CACHE;
        available & wanted
    }
}

/// The limits that bound moeflow's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KeyLimits {
    /// Largest storage-buffer binding, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// Workgroup memory per workgroup, in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations per workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Storage buffers visible to one compute shader.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Largest uniform-buffer binding, in bytes (0 in records older than this field).
    #[serde(default)]
    pub max_uniform_buffer_binding_size: u64,
    /// Alignment of a uniform binding's offset, in bytes (0 in records older than this field).
    #[serde(default)]
    pub min_uniform_buffer_offset_alignment: u32,
    /// Sampled textures visible to one compute shader (0 in records older than this field).
    #[serde(default)]
    pub max_sampled_textures_per_shader_stage: u32,
    /// Largest width and height of a 2-D texture, in texels (0 in older records).
    #[serde(default)]
    pub max_texture_dimension_2d: u32,
    /// Most layers of a 2-D texture array (0 in older records).
    #[serde(default)]
    pub max_texture_array_layers: u32,
}

impl From<&wgpu::Limits> for KeyLimits {
    fn from(l: &wgpu::Limits) -> Self {
        KeyLimits {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            max_uniform_buffer_binding_size: l.max_uniform_buffer_binding_size,
            min_uniform_buffer_offset_alignment: l.min_uniform_buffer_offset_alignment,
            max_sampled_textures_per_shader_stage: l.max_sampled_textures_per_shader_stage,
            max_texture_dimension_2d: l.max_texture_dimension_2d,
            max_texture_array_layers: l.max_texture_array_layers,
        }
    }
}

/// One adapter as `moeflow::adapters()` and the benchmark records describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AdapterDescription {
    /// Backend name: `vulkan`, `metal`, `dx12` or `gl`.
    pub backend: String,
    /// Adapter name as the driver reports it.
    pub name: String,
    /// Driver name.
    pub driver: String,
    /// Driver version or build details.
    pub driver_info: String,
    /// PCI vendor id (0 where the backend has none).
    pub vendor: u32,
    /// PCI device id (0 where the backend has none).
    pub device: u32,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    /// Features moeflow would enable (or, for a [`Context`](super::Context), did enable).
    pub capabilities: Capabilities,
    /// Limits moeflow checks against.
    pub limits: KeyLimits,
    /// The smallest and largest subgroup the adapter may run (`[0, 0]` in older records).
    #[serde(default)]
    pub subgroup_sizes: [u32; 2],
    /// The sizes `n` of the square `n × n × n` cooperative-matrix multiply-adds with f16 inputs and
    /// f32 accumulators the adapter reports (subgroup scope), ascending; empty where cooperative
    /// matrices are not enabled (see
    /// [`Context::set_cooperative_matrix`](super::Context::set_cooperative_matrix)).
    #[serde(default)]
    pub cooperative_f16_sizes: Vec<u32>,
}

impl AdapterDescription {
    pub(crate) fn new(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
        AdapterDescription {
            backend: backend_name(info.backend).to_string(),
            name: info.name.clone(),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
            device_type: format!("{:?}", info.device_type),
            capabilities: Capabilities::from_features(features),
            limits: KeyLimits::from(limits),
            subgroup_sizes: [info.subgroup_min_size, info.subgroup_max_size],
            cooperative_f16_sizes: Vec::new(),
        }
    }

    /// True for adapters that run shaders on the CPU (lavapipe, llvmpipe, WARP).
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
    }

    /// A short file-name-safe label such as `vulkan-llvmpipe`.
    pub fn slug(&self) -> String {
        let name: String = self
            .name
            .chars()
            .take_while(|c| *c != '(')
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect();
        let name = name.trim_matches('-').split('-').filter(|s| !s.is_empty()).collect::<Vec<_>>().join("-");
        format!("{}-{}", self.backend, name)
    }
}

impl fmt::Display for AdapterDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} ({}, {})", self.name, self.backend, self.device_type, self.driver_info)
    }
}

pub(super) fn backend_name(b: wgpu::Backend) -> &'static str {
    match b {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        wgpu::Backend::Noop => "noop",
    }
}

/// The sizes `n` of the `n × n × n` f16 × f16 → f32 configurations among `configurations`
/// with `n` 8 or 16 (the cooperative-matrix sizes WGSL has), ascending, once each.
pub(super) fn square_f16_f32_sizes(configurations: &[wgpu::CooperativeMatrixProperties]) -> Vec<u32> {
    use wgpu::CooperativeScalarType::{F16, F32};
    let mut sizes: Vec<u32> = configurations
        .iter()
        .filter(|c| c.ab_type == F16 && c.cr_type == F32)
        .filter(|c| c.m_size == c.n_size && c.n_size == c.k_size && matches!(c.m_size, 8 | 16))
        .map(|c| c.m_size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooperative_sizes_are_the_square_f16_into_f32_ones() {
        use wgpu::CooperativeScalarType::{F16, F32, I32};
        let c = |m, n, k, ab, cr| wgpu::CooperativeMatrixProperties {
            m_size: m,
            n_size: n,
            k_size: k,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: false,
        };
        let reported = [
            c(16, 16, 16, F16, F16),
            c(16, 8, 16, F16, F32),
            c(16, 16, 16, F16, F32),
            c(8, 8, 8, F32, F32),
            c(16, 16, 16, I32, I32),
            c(8, 8, 8, F16, F32),
            c(16, 16, 16, F16, F32),
        ];
        assert_eq!(square_f16_f32_sizes(&reported), vec![8, 16]);
        assert!(square_f16_f32_sizes(&reported[..2]).is_empty());
    }
}
