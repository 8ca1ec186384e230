//! What a device needs to run a layer: the features and limits an application asks for when
//! it creates the device it will hand to [`Context::from_wgpu`](crate::Context::from_wgpu).
//!
//! The counts (storage buffers, uniform buffers and textures per kernel, workgroup memory,
//! invocations) are read off the kernels the configuration can run on the adapter's kind
//! (their specs and naga's reflection of their WGSL); the sizes are those of every buffer a
//! forward of up to `max_tokens` tokens binds. `tests/requirements.rs` creates a device with
//! exactly these limits on every adapter and checks that it runs the layer with the bits of a
//! device with the adapter's full limits.

use crate::context::{AdapterDescription, Capabilities};
use crate::error::{Error, Result};
use crate::kernels::gemm::{
    AdapterKind, GemmVariant, WINDOW_BYTES, WeightDtype, WeightLoads, candidates, specs_for,
};
use crate::layer::{CallerOutputs, KernelChoice, MoeConfig};
use crate::pipeline::KernelSpec;

/// Features and limits to create a device with (see the module docs).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Requirements {
    /// Optional features moeflow uses where the adapter has them (timestamps, subgroups,
    /// shader-f16, the pipeline cache): no kernel needs one.
    pub features: wgpu::Features,
    /// WebGPU's downlevel limits, raised to what the layer binds and runs. Where the
    /// configuration prefers more than it needs (whole weight tensors in one binding, x
    /// windows, texture copies of the weights), the limit is raised as far as the adapter
    /// allows; with less, the same bits come from split weights and fallback kernels.
    pub limits: wgpu::Limits,
}

/// Bytes of `n` f32 values.
fn f32s(n: u64) -> u64 {
    4 * n
}

impl MoeConfig {
    /// What a device on `adapter` needs to run a layer of this configuration for forwards of
    /// up to `max_tokens` tokens (see [`Requirements`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero tokens; [`Error::LimitExceeded`] naming the first
    /// wgpu limit the adapter cannot raise far enough; [`Error::MissingFeature`] for
    /// cooperative-matrix kernels on an adapter without cooperative matrices.
    pub fn requirements(&self, adapter: &wgpu::Adapter, max_tokens: u32) -> Result<Requirements> {
        if max_tokens == 0 {
            return Err(Error::invalid("requirements need a maximum token count of at least 1"));
        }
        let have = adapter.limits();
        let description = AdapterDescription::new(&adapter.get_info(), adapter.features(), &have);
        let kind = AdapterKind::of(&description);
        let variants: Vec<GemmVariant> = match self.kernels {
            KernelChoice::Tuned | KernelChoice::TunedFor { .. } => candidates(kind),
            _ => {
                let k = self.ffn_kernels(kind);
                vec![k.up, k.down]
            }
        };
        let native_f16 =
            self.weight_dtype == WeightDtype::F16 && adapter.features().contains(wgpu::Features::SHADER_F16);
        let mut specs: Vec<&'static KernelSpec> = Vec::new();
        specs.extend_from_slice(crate::kernels::routing::SPECS);
        specs.extend_from_slice(crate::kernels::dispatch::SPECS);
        specs.extend_from_slice(crate::kernels::combine::SPECS);
        specs.extend_from_slice(crate::kernels::sizing::SPECS);
        specs.extend(specs_for(&variants, self.gemm_order, WeightLoads::of(self.weight_dtype, native_f16)));

        let mut limits = wgpu::Limits {
            // The adapter's own alignments (smaller is better): the window strides follow them.
            min_uniform_buffer_offset_alignment: have.min_uniform_buffer_offset_alignment,
            min_storage_buffer_offset_alignment: have.min_storage_buffer_offset_alignment,
            ..wgpu::Limits::downlevel_defaults()
        };
        for spec in &specs {
            let (storage, uniform, textures) = spec.binding_counts();
            let shape = spec.reflect()?;
            limits.max_storage_buffers_per_shader_stage =
                limits.max_storage_buffers_per_shader_stage.max(storage);
            limits.max_uniform_buffers_per_shader_stage =
                limits.max_uniform_buffers_per_shader_stage.max(uniform);
            limits.max_sampled_textures_per_shader_stage =
                limits.max_sampled_textures_per_shader_stage.max(textures);
            limits.max_compute_workgroup_storage_size =
                limits.max_compute_workgroup_storage_size.max(shape.workgroup_bytes);
            limits.max_compute_invocations_per_workgroup =
                limits.max_compute_invocations_per_workgroup.max(shape.invocations);
            limits.max_compute_workgroup_size_x = limits.max_compute_workgroup_size_x.max(shape.invocations);
        }
        let Bytes { needed, preferred, workspace } = self.binding_bytes(&variants, max_tokens, &have)?;
        limits.max_storage_buffer_binding_size =
            needed.max(preferred.min(have.max_storage_buffer_binding_size));
        // One buffer for the whole workspace where the adapter allows it.
        limits.max_buffer_size = limits
            .max_storage_buffer_binding_size
            .max(limits.max_buffer_size.max(workspace).min(have.max_buffer_size));
        if variants.iter().any(|v| v.reads_windows()) && have.max_uniform_buffer_binding_size >= WINDOW_BYTES
        {
            limits.max_uniform_buffer_binding_size = WINDOW_BYTES;
        }
        if variants.iter().any(|v| matches!(v, GemmVariant::Texture(_))) {
            // The weights' texture copies: one texel row per weight row, rows over layers.
            limits.max_texture_dimension_2d = have.max_texture_dimension_2d;
            limits.max_texture_array_layers = have.max_texture_array_layers;
        }
        let mut features = Capabilities::wanted(adapter.features());
        if variants.iter().any(|v| matches!(v, GemmVariant::CoopF16(_))) {
            // Cooperative-matrix kernels chosen by the caller: the device must be made with
            // wgpu's experimental feature (and `wgpu::ExperimentalFeatures::enabled()`), then
            // told the adapter's configurations (`Context::set_cooperative_matrix`).
            if !adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                return Err(Error::MissingFeature(format!(
                    "{}: cooperative-matrix GEMM kernels were chosen and the adapter has no cooperative matrices",
                    adapter.get_info().name
                )));
            }
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        check_within(&limits, &have)?;
        Ok(Requirements { features, limits })
    }

    /// The largest buffer binding a forward of up to `max_tokens` tokens needs (x and y, the
    /// router, every scratch region of [`Self::workspace_layout`], one weight column), the largest
    /// it prefers (whole weight tensors in one binding, the x windows), and the bytes of its
    /// whole workspace (which [`MoeLayer::plan_in`](crate::layer::MoeLayer::plan_in) binds from
    /// one buffer), on an adapter with `have`.
    fn binding_bytes(&self, variants: &[GemmVariant], max_tokens: u32, have: &wgpu::Limits) -> Result<Bytes> {
        let (m, h, f, e) = (
            u64::from(max_tokens),
            u64::from(self.route.hidden),
            u64::from(self.ffn),
            u64::from(self.route.experts),
        );
        // x and y first: past the adapter's binding limit, that is the error to name (before
        // the scratch's u32 indices).
        let rows = f32s(m * h);
        if rows > have.max_storage_buffer_binding_size {
            let name = "max_storage_buffer_binding_size";
            let what = format!("the layer's need for `{name}` (x and y)");
            return Err(Error::limit(
                what,
                rows,
                have.max_storage_buffer_binding_size,
                format!("{name} of the adapter"),
            ));
        }
        // The largest dispatch tile of the candidates pads the most rows.
        let tile = variants.iter().map(|v| v.block_rows()).max().unwrap_or(1);
        let layout = self.workspace_layout(max_tokens, variants, tile, have, CallerOutputs::default())?;
        let windows = layout.window_bytes().unwrap_or(0);
        let dtype = self.weight_dtype;
        // Weights split by expert, then by output column: one column is the least a binding
        // can hold; whole tensors are preferred.
        let needed = [
            rows,        // x, y
            f32s(e * h), // router
            layout.largest(),
            dtype.packed_bytes(1, h),
            dtype.packed_bytes(1, f),
        ]
        .into_iter()
        .max()
        .unwrap_or(4);
        let mut preferred = vec![dtype.packed_bytes(e * f, h), dtype.packed_bytes(e * h, f), windows];
        if let Some(fs) = self.shared_ffn {
            preferred.push(dtype.packed_bytes(u64::from(fs), h));
        }
        let preferred = preferred.into_iter().max().unwrap_or(4).max(needed);
        Ok(Bytes { needed, preferred, workspace: layout.bytes() })
    }
}

/// What [`MoeConfig::binding_bytes`] finds.
struct Bytes {
    /// The largest binding a forward needs.
    needed: u64,
    /// The largest binding it prefers.
    preferred: u64,
    /// Its workspace's bytes.
    workspace: u64,
}

/// The first limit of `want` past what `have` offers, as an error.
fn check_within(want: &wgpu::Limits, have: &wgpu::Limits) -> Result<()> {
    let mut err = None;
    want.check_limits_with_fail_fn(have, true, |name, wanted, allowed| {
        err = Some(Error::limit(
            format!("the layer's need for `{name}`"),
            wanted,
            allowed,
            format!("{name} of the adapter"),
        ));
    });
    err.map_or(Ok(()), Err)
}
