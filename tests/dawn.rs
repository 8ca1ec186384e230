//! Kernel runs captured for replay under Dawn, the WebGPU implementation in Chromium (its WGSL
//! compiler is Tint): routing (unfused and fused), the dispatch layout, the grouped GEMM (the
//! tiled kernel and the adapter's default) and whole layers (one-launch and sequential combine).
//!
//! Each case is planned through moeflow's public API, every buffer its dispatches bind is read
//! back before the run, the dispatches run here through wgpu, and the outputs are checked
//! against the CPU reference. With `MOEFLOW_DAWN_CASES=DIR`, each case is also written under
//! `DIR` (buffers, WGSL, dispatches, expected outputs and the bound to hold them to), and
//! `node tools/tint/replay.mjs DIR` runs the same dispatches under Dawn and applies the same
//! checks (see docs/portability.md). Without it the cases run and are checked here only.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{rng, uniform};
use moeflow::kernels::combine::CombineMode;
use moeflow::kernels::dispatch::{DispatchConfig, DispatchLayout};
use moeflow::kernels::gemm::{
    Activation, AdapterKind, ExpertFfn, ExpertWeights, FfnBuffers, FfnKernels, FfnRouting, GemmOrder,
    GemmVariant, TileBlock, WeightDtype, plan_ffn,
};
use moeflow::kernels::routing::{Gating, GroupLimit, RouteBuffers, RouteConfig, RouteMode, plan_route};
use moeflow::layer::{MoeConfig, MoeLayer};
use moeflow::pipeline::Access;
use moeflow::reference;
use moeflow::reference::dispatch::NONE;
use moeflow::synth::Synth;
use moeflow::{BufferView, Context, Dispatch};
use serde_json::{Value, json};

/// Environment variable naming the folder the cases are written to.
const CASES: &str = "MOEFLOW_DAWN_CASES";

/// A context per adapter whose device has no optional feature and WebGPU's default limits (those moeflow reads, each
/// capped by the adapter's own), as a browser's device has unless it asks for more: plans
/// made on it bind at offsets and sizes every WebGPU implementation accepts.
fn contexts() -> Vec<Context> {
    let webgpu = wgpu::Limits::default();
    common::wgpu_adapters()
        .iter()
        .map(|adapter| {
            let a = adapter.limits();
            // Each limit named here: WebGPU's default, capped by the adapter's own.
            macro_rules! capped {
                ($($field:ident),*) => {
                    wgpu::Limits { $($field: webgpu.$field.min(a.$field),)* ..a.clone() }
                };
            }
            let limits = wgpu::Limits {
                min_uniform_buffer_offset_alignment: webgpu.min_uniform_buffer_offset_alignment,
                min_storage_buffer_offset_alignment: webgpu.min_storage_buffer_offset_alignment,
                ..capped!(
                    max_storage_buffers_per_shader_stage,
                    max_uniform_buffer_binding_size,
                    max_storage_buffer_binding_size,
                    max_buffer_size,
                    max_compute_workgroup_storage_size,
                    max_compute_invocations_per_workgroup
                )
            };
            // No optional features: the replay's device has none either.
            let desc = wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() };
            let (device, queue) = pollster::block_on(adapter.request_device(&desc)).expect("a device");
            Context::from_wgpu(device, queue)
        })
        .collect()
}

/// How a checked output is compared with its expected values.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// Every 32-bit word equal.
    Exact,
    /// |got - want| <= 2e-5 + 2e-5 * |want|; NaN only where NaN; infinities equal.
    Close,
    /// |got - want| <= 2e-5 + 2e-5 * max |want| over the row of `width` values (sums whose
    /// terms cancel).
    Rows(usize),
}

impl Bound {
    fn holds(self, got: &[u32], want: &[u32]) -> Result<(), String> {
        let f = |w: u32| f32::from_bits(w);
        match self {
            Bound::Exact => match got.iter().zip(want).position(|(g, w)| g != w) {
                Some(i) => Err(format!("word {i}: got {:#x}, want {:#x}", got[i], want[i])),
                None => Ok(()),
            },
            Bound::Close => match got.iter().zip(want).position(|(&g, &w)| !common::close(f(g), f(w))) {
                Some(i) => Err(format!("element {i}: got {:e}, want {:e}", f(got[i]), f(want[i]))),
                None => Ok(()),
            },
            Bound::Rows(width) => {
                let floats = |words: &[u32]| words.iter().map(|&w| f(w)).collect::<Vec<f32>>();
                common::rows_close(&floats(got), &floats(want), width).map(|_| ())
            }
        }
    }

    fn to_json(self) -> Value {
        match self {
            Bound::Exact => json!({"kind": "exact"}),
            Bound::Close => json!({"kind": "close"}),
            Bound::Rows(width) => json!({"kind": "rows", "width": width}),
        }
    }
}

/// A planned run: the dispatches, every buffer they bind with its contents before the run,
/// and the checks of its outputs.
struct Capture {
    name: String,
    buffers: Vec<wgpu::Buffer>,
    initial: Vec<Vec<u8>>,
    textures: Vec<wgpu::Texture>,
    /// Each texture's texels before the run, rows `TEXTURE_ROW_ALIGN`-padded.
    texels: Vec<Vec<u8>>,
    dispatches: Vec<Dispatch>,
    /// What, buffer index, byte offset, expected words, bound.
    checks: Vec<(String, usize, u64, Vec<u32>, Bound)>,
}

impl Capture {
    /// Reads back every buffer and texture `dispatches` bind (their state before the run), then
    /// runs them.
    fn run(ctx: &Context, name: &str, dispatches: Vec<Dispatch>) -> Self {
        let mut textures: Vec<wgpu::Texture> = Vec::new();
        for t in dispatches.iter().flat_map(|d| d.textures()) {
            if !textures.contains(&t.texture) {
                textures.push(t.texture.clone());
            }
        }
        let texels = textures.iter().map(|t| read_texture(ctx, t)).collect();
        let mut buffers: Vec<wgpu::Buffer> = Vec::new();
        for b in dispatches.iter().flat_map(|d| d.bindings()) {
            if !buffers.contains(&b.buffer) {
                buffers.push(b.buffer.clone());
            }
        }
        let initial = buffers
            .iter()
            .map(|b| ctx.read_back::<u8>(b, b.size() as usize).expect("reading a bound buffer back"))
            .collect();
        ctx.run(&dispatches.iter().collect::<Vec<_>>()).expect("running the case on wgpu");
        let name = format!("{}-{name}", ctx.adapter().slug());
        Capture { name, buffers, initial, textures, texels, dispatches, checks: Vec::new() }
    }

    /// Checks the first `want.len()` words of `view` here and records the check for Dawn.
    fn check<'b>(
        &mut self,
        ctx: &Context,
        what: &str,
        view: impl Into<BufferView<'b>>,
        want: Vec<u32>,
        bound: Bound,
    ) {
        let view = view.into();
        let index = self.buffers.iter().position(|b| b == view.buffer).expect("the checked buffer is bound");
        let got: Vec<u32> = ctx.read_back(view, want.len()).expect("reading an output back");
        if let Err(e) = bound.holds(&got, &want) {
            panic!("{} {what} under wgpu: {e}", self.name);
        }
        self.checks.push((what.to_string(), index, view.offset, want, bound));
    }

    fn check_f32<'b>(
        &mut self,
        ctx: &Context,
        what: &str,
        view: impl Into<BufferView<'b>>,
        want: &[f32],
        bound: Bound,
    ) {
        self.check(ctx, what, view, common::bits(want), bound);
    }

    /// Writes the case under `dir/name/`: `case.json`, one `.bin` per buffer and expected
    /// output, one `.wgsl` per module.
    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let at = dir.join(&self.name);
        std::fs::create_dir_all(&at)?;
        let mut modules: BTreeMap<&str, String> = BTreeMap::new();
        let mut dispatches = Vec::new();
        for d in &self.dispatches {
            let shader = d.shader();
            let file = format!("{}.wgsl", shader.name.replace('/', "__"));
            if !modules.contains_key(shader.name) {
                std::fs::write(at.join(&file), shader.compose())?;
                modules.insert(shader.name, file.clone());
            }
            let bindings: Vec<Value> = d
                .bindings()
                .iter()
                .map(|b| {
                    json!({
                        "binding": b.binding,
                        "access": match b.access {
                            Access::Uniform => "uniform",
                            Access::Read => "read-only-storage",
                            Access::ReadWrite => "storage",
                            other => unreachable!("{other:?} is not a buffer binding"),
                        },
                        "buffer": self.buffers.iter().position(|x| *x == b.buffer),
                        "offset": b.offset,
                        "size": b.size,
                    })
                })
                .collect();
            let textures: Vec<Value> = d
                .textures()
                .iter()
                .map(|t| {
                    json!({
                        "binding": t.binding,
                        "texture": self.textures.iter().position(|x| *x == t.texture),
                    })
                })
                .collect();
            let constants: serde_json::Map<String, Value> =
                d.constants().iter().map(|&(k, v)| (k.to_string(), json!(v))).collect();
            dispatches.push(json!({
                "module": file,
                "entry": d.entry(),
                "constants": constants,
                "bindings": bindings,
                "textures": textures,
                "workgroups": d.workgroups(),
            }));
        }
        let mut buffers = Vec::new();
        for (i, bytes) in self.initial.iter().enumerate() {
            let file = format!("buffer{i}.bin");
            std::fs::write(at.join(&file), bytes)?;
            buffers.push(json!({"file": file, "size": bytes.len()}));
        }
        let mut textures = Vec::new();
        for (i, (t, bytes)) in self.textures.iter().zip(&self.texels).enumerate() {
            let file = format!("texture{i}.bin");
            std::fs::write(at.join(&file), bytes)?;
            let format = match t.format() {
                wgpu::TextureFormat::Rgba32Uint => "rgba32uint",
                wgpu::TextureFormat::Rg32Uint => "rg32uint",
                other => panic!("{}: no replay for {other:?} textures", self.name),
            };
            let size = t.size();
            textures.push(json!({
                "file": file,
                "format": format,
                "size": [size.width, size.height, size.depth_or_array_layers],
                "bytesPerRow": texture_pitch(t),
            }));
        }
        let mut checks = Vec::new();
        for (i, (what, buffer, offset, want, bound)) in self.checks.iter().enumerate() {
            let file = format!("expected{i}.bin");
            std::fs::write(at.join(&file), bytemuck::cast_slice::<u32, u8>(want))?;
            checks.push(json!({
                "what": what,
                "buffer": buffer,
                "offset": offset,
                "words": want.len(),
                "expected": file,
                "bound": bound.to_json(),
            }));
        }
        let case = json!({
            "name": self.name,
            "buffers": buffers,
            "textures": textures,
            "dispatches": dispatches,
            "checks": checks,
        });
        std::fs::write(at.join("case.json"), serde_json::to_string_pretty(&case)?)
    }

    /// Writes the case when `MOEFLOW_DAWN_CASES` names a folder.
    fn finish(self) {
        assert!(!self.checks.is_empty(), "{}: a case checks something", self.name);
        if let Some(dir) = std::env::var_os(CASES) {
            self.write(Path::new(&dir)).unwrap_or_else(|e| panic!("writing case {}: {e}", self.name));
            eprintln!("wrote case {} ({} dispatches)", self.name, self.dispatches.len());
        }
    }
}

/// Bytes per row of `texture`'s texels as captured: whole rows padded to the copy alignment.
fn texture_pitch(texture: &wgpu::Texture) -> u32 {
    let texel = texture.format().block_copy_size(None).expect("an uncompressed colour format");
    (texture.width() * texel).next_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT)
}

/// Every layer of `texture`, rows padded to [`texture_pitch`].
fn read_texture(ctx: &Context, texture: &wgpu::Texture) -> Vec<u8> {
    let pitch = texture_pitch(texture);
    let size = texture.size();
    let bytes = u64::from(pitch) * u64::from(size.height) * u64::from(size.depth_or_array_layers);
    let staging = ctx.zeroed("texture readback", bytes).unwrap();
    let mut encoder = ctx.encoder("texture readback");
    encoder.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &staging,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(pitch),
                rows_per_image: Some(size.height),
            },
        },
        size,
    );
    ctx.submit_and_wait(encoder).unwrap();
    ctx.read_back(&staging, bytes as usize).unwrap()
}

/// DeepSeek-style scoring with group-limited selection: sigmoid, bias, renormalised top-k.
fn grouped_route_config() -> RouteConfig {
    RouteConfig {
        gating: Gating::Sigmoid,
        bias: true,
        renormalize: true,
        scale: 2.5,
        groups: Some(GroupLimit { n_group: 6, topk_group: 3 }),
        ..RouteConfig::new(64, 60, 4)
    }
}

/// Routing unfused (matvec, then top-k) and fused, softmax and grouped sigmoid scoring.
#[test]
fn routing_cases() {
    for ctx in contexts() {
        let tokens = 37u32;
        for (name, cfg) in [("softmax", RouteConfig::new(64, 60, 4)), ("grouped", grouped_route_config())] {
            for (mode_name, mode) in
                [("unfused", RouteMode::Unfused), ("fused", RouteMode::Fused { write_logits: true })]
            {
                let mut r = rng(11);
                let x = uniform(&mut r, (tokens * cfg.hidden) as usize, 1.0);
                let gate = uniform(&mut r, (cfg.experts * cfg.hidden) as usize, 0.5);
                let bias = cfg.bias.then(|| uniform(&mut r, cfg.experts as usize, 0.05));
                let (xb, gb) = (ctx.upload("x", &x).unwrap(), ctx.upload("gate", &gate).unwrap());
                let bb = bias.as_ref().map(|b| ctx.upload("bias", b).unwrap());
                let entries = u64::from(tokens * cfg.k) * 4;
                let logits = ctx.zeroed("logits", u64::from(tokens * cfg.experts) * 4).unwrap();
                let (ib, wb) =
                    (ctx.zeroed("indices", entries).unwrap(), ctx.zeroed("weights", entries).unwrap());
                let bufs = RouteBuffers {
                    x: (&xb).into(),
                    gate: &gb,
                    bias: bb.as_ref(),
                    logits: Some((&logits).into()),
                    indices: (&ib).into(),
                    weights: (&wb).into(),
                };
                let plan = plan_route(&ctx, &cfg, tokens, &bufs, mode).unwrap();
                let mut cap =
                    Capture::run(&ctx, &format!("route-{name}-{mode_name}"), plan.into_dispatches());
                let want_logits = reference::routing::gate_logits(&x, &gate, cfg.hidden as usize);
                let (idx, w) = reference::routing::topk(&cfg, &want_logits, bias.as_deref());
                cap.check_f32(&ctx, "logits", &logits, &want_logits, Bound::Close);
                cap.check(&ctx, "indices", &ib, idx, Bound::Exact);
                cap.check_f32(&ctx, "weights", &wb, &w, Bound::Close);
                cap.finish();
            }
        }
    }
}

/// The dispatch layout (count, scan, stable permutation, tile map): every word exactly.
#[test]
fn dispatch_layout_case() {
    for ctx in contexts() {
        let (tokens, experts, k, tile) = (300u32, 60u32, 4u32, 16u32);
        let idx = common::routes(5, tokens, experts, k, true);
        let ib = ctx.upload("indices", &idx).unwrap();
        let layout = DispatchLayout::new(&ctx, DispatchConfig { experts, k, tile }, tokens, 0).unwrap();
        let mut cap = Capture::run(&ctx, "dispatch-layout", layout.plan(&ctx, &ib).unwrap());
        let want = reference::dispatch::layout(&idx, experts, tile, 0);
        let mut tile_map = want.tile_expert.clone();
        tile_map.resize(layout.max_tiles() as usize, NONE);
        cap.check(&ctx, "counts", layout.counts(), want.counts, Bound::Exact);
        cap.check(&ctx, "offsets", layout.offsets(), want.offsets, Bound::Exact);
        cap.check(&ctx, "padded offsets", layout.padded_offsets(), want.padded, Bound::Exact);
        cap.check(&ctx, "perm", layout.perm(), want.perm, Bound::Exact);
        cap.check(&ctx, "inverse", layout.inverse(), want.inverse, Bound::Exact);
        cap.check(&ctx, "tile map", layout.tile_expert(), tile_map, Bound::Exact);
        cap.check(&ctx, "meta", layout.meta(), want.meta.to_words().to_vec(), Bound::Exact);
        cap.finish();
    }
}

/// The grouped expert FFN (layout, gate/up, down) with the tiled kernel and with the adapter's
/// default kernels, bf16 weights; K = 70 and F = 45 are no multiple of four and 37 tokens no
/// multiple of any block.
#[test]
fn grouped_gemm_cases() {
    for ctx in contexts() {
        let (e, h, f, k, tokens) = (8u32, 70u32, 45u32, 2u32, 37u32);
        let dtype = WeightDtype::Bf16;
        let mut r = rng(21);
        let n = (e * h * f) as usize;
        let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (f as f32).sqrt());
        let gate = dtype.round(&uniform(&mut r, n, sh), h as usize).unwrap();
        let up = dtype.round(&uniform(&mut r, n, sh), h as usize).unwrap();
        let down = dtype.round(&uniform(&mut r, n, sf), f as usize).unwrap();
        let x = uniform(&mut r, (tokens * h) as usize, 1.0);
        let idx = common::routes(22, tokens, e, k, true);
        let default = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
        let tiled = GemmVariant::Tile(TileBlock::tiled(2));
        for (name, kernels) in
            [("tiled", FfnKernels { up: tiled, down: tiled, ..default }), ("default", default)]
        {
            let w = |d: &[f32], n, k| ExpertWeights::from_f32(&ctx, d, dtype, e, n, k).unwrap();
            let ffn = ExpertFfn::new(w(&gate, f, h), w(&up, f, h), w(&down, h, f))
                .unwrap()
                .with_kernels(kernels)
                .unwrap();
            let (xb, ib) = (ctx.upload("x", &x).unwrap(), ctx.upload("indices", &idx).unwrap());
            let partial = ctx.zeroed("partial", u64::from(tokens * k * h) * 4).unwrap();
            let layout =
                DispatchLayout::new(&ctx, DispatchConfig { experts: e, k, tile: 32 }, tokens, 0).unwrap();
            let mut ds = layout.plan(&ctx, &ib).unwrap();
            let bufs = FfnBuffers { x: (&xb).into(), indices: (&ib).into(), partial: (&partial).into() };
            ds.extend(
                plan_ffn(&ctx, &ffn, tokens, k, &bufs, FfnRouting::Grouped(&layout))
                    .unwrap()
                    .into_dispatches(),
            );
            let mut cap = Capture::run(&ctx, &format!("grouped-gemm-{name}"), ds);
            let weights = reference::gemm::FfnWeights {
                gate: &gate,
                up: &up,
                down: &down,
                hidden: h as usize,
                ffn: f as usize,
                order: GemmOrder::Strict,
                activation: Activation::Swiglu,
                bias: None,
                f16_operands: false,
            };
            let want = reference::gemm::expert_ffn(&x, &idx, k as usize, &weights);
            cap.check_f32(&ctx, "partial", &partial, &want, Bound::Rows(h as usize));
            cap.finish();
        }
    }
}

/// Whole layers (route, dispatch, grouped GEMM, combine): unfused routing with the one-launch
/// combine, and fused routing with a gated shared expert and the sequential combine.
#[test]
fn layer_cases() {
    for ctx in contexts() {
        let mixtral = MoeConfig { route_mode: RouteMode::Unfused, ..MoeConfig::new(48, 40, 8, 2) };
        let qwen = MoeConfig {
            route: RouteConfig { renormalize: false, ..MoeConfig::new(36, 28, 12, 4).route },
            shared_ffn: Some(36),
            shared_gate: true,
            route_mode: RouteMode::Fused { write_logits: false },
            combine: CombineMode::Sequential,
            ..MoeConfig::new(36, 28, 12, 4)
        };
        for (name, cfg, tokens) in
            [("mixtral-unfused", mixtral, 29usize), ("qwen2-fused-sequential", qwen, 13)]
        {
            let w = Synth::new(1).moe_weights(&cfg);
            let layer = MoeLayer::new(&ctx, cfg, &w).unwrap();
            let x = Synth::new(tokens as u64).uniform(tokens * cfg.route.hidden as usize, 1.0);
            let xb = ctx.upload("x", &x).unwrap();
            let y = ctx.zeroed("y", (x.len() * 4) as u64).unwrap();
            let plan = layer.plan(&ctx, layer.io(&xb, &y, tokens as u32).unwrap()).unwrap();
            let (ib, wb) = (plan.indices(), plan.weights());
            let mut cap =
                Capture::run(&ctx, &format!("layer-{name}"), plan.dispatches_at(tokens as u32).unwrap());
            let (want_y, idx, wts) = reference::layer::forward(&cfg, &w, &x).unwrap();
            cap.check(&ctx, "indices", ib, idx, Bound::Exact);
            cap.check_f32(&ctx, "weights", wb, &wts, Bound::Close);
            cap.check_f32(&ctx, "y", &y, &want_y, Bound::Rows(cfg.route.hidden as usize));
            cap.finish();
        }
    }
}
