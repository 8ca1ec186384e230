//! The moeflow MoE layer on the browser's WebGPU adapter: what `moe_layer` prints for the
//! seeded synthetic layer, as a JSON report the page (`index.html`) shows.
//!
//! [`run_synthetic`] takes the page's options as JSON (`tokens`: one count or several,
//! `hidden`, `ffn`, `experts`, `k`, `shared_ffn`, `dtype`: f32, f16, bf16, q8_0, q4_0, mxfp4
//! or fp8, `seed`, `max_binding_mib`: a cap on the device's storage binding) and returns the
//! report: the adapter and its features, per forward the
//! per-stage GPU times (where the browser grants `timestamp-query`) and the host wall time,
//! tokens/s, the check against the CPU reference (routing equal, outputs within
//! `2e-5 + 2e-5·|row scale|`) and the expert load. Every wait is awaited: the browser's event
//! loop runs the device's callbacks.
//!
//! [`run_file`] runs a user's own layer instead: a safetensors file (with its `config.json`,
//! which decides the routing as `transformers` does) or a GGUF file (its metadata decides),
//! read by the same loaders as natively, from the file's bytes; the input is seeded.
//! [`error_checks`] is the browser test's check that misuse is an `Err` there too.

use moeflow::kernels::gemm::WeightDtype;
use moeflow::layer::{MoeConfig, MoeLayer, MoeWeights};
use moeflow::reference::layer as reference;
use moeflow::synth::Synth;
use moeflow::weights::gguf::Gguf;
use moeflow::weights::{
    Checkpoint, LoadOptions, load_checkpoint_layer, load_gguf_layer, upload_checkpoint_layer_async,
    upload_gguf_layer_async,
};
use moeflow::{Context, Error, Result, Sampler};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use web_time::Instant;

/// The page's choices (every field optional: `moe_layer`'s defaults, smaller).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    tokens: Vec<u32>,
    hidden: u32,
    ffn: u32,
    experts: u32,
    k: u32,
    shared_ffn: u32,
    dtype: String,
    seed: u64,
    /// A cap on the device's storage-binding size, MiB (a browser grants at least WebGPU's
    /// default, 128 MiB): expert weights past it are split across bindings.
    max_binding_mib: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tokens: vec![1, 64],
            hidden: 256,
            ffn: 128,
            experts: 16,
            k: 4,
            shared_ffn: 0,
            dtype: "f32".into(),
            seed: 42,
            max_binding_mib: None,
        }
    }
}

/// The page's choices for a user's file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FileOptions {
    tokens: Vec<u32>,
    /// The MoE layer by index, where the file holds several.
    layer: Option<usize>,
    seed: u64,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { tokens: vec![1, 37], layer: None, seed: 42 }
    }
}

/// What the page shows.
#[derive(Debug, Serialize)]
struct Report {
    adapter: String,
    backend: String,
    device_type: String,
    driver: String,
    timestamps: bool,
    subgroups: bool,
    shader_f16: bool,
    max_storage_binding_mib: u64,
    /// Bindings the routed experts' gate, up and down weights are split across.
    weight_bindings: [usize; 3],
    layer: String,
    runs: Vec<Run>,
    pass: bool,
}

/// One forward at one token count.
#[derive(Debug, Serialize)]
struct Run {
    tokens: u32,
    stages: Vec<Stage>,
    gpu_ms: Option<f64>,
    wall_ms: f64,
    tokens_per_s: f64,
    checked_tokens: usize,
    routing_equal: usize,
    outputs_within: bool,
    worst_of_bound: f32,
    bit_equal: usize,
    values: usize,
    load: Vec<u32>,
    load_mean: f64,
    load_imbalance: f64,
    pass: bool,
}

/// One stage's dispatches and GPU time.
#[derive(Debug, Serialize)]
struct Stage {
    name: String,
    dispatches: usize,
    gpu_ms: Option<f64>,
}

/// Runs the seeded synthetic layer at each token count of `options` (JSON) on the browser's
/// adapter and returns the report as JSON; an error's message where anything fails.
#[wasm_bindgen]
pub async fn run_synthetic(options: String) -> std::result::Result<String, JsValue> {
    std::panic::set_hook(Box::new(|info| web_sys::console::error_1(&info.to_string().into())));
    let opts: Options =
        serde_json::from_str(&options).map_err(|e| JsValue::from_str(&format!("options: {e}")))?;
    let report = synthetic(&opts).await.map_err(|e| JsValue::from_str(&e.to_string()))?;
    serde_json::to_string(&report).map_err(|e| JsValue::from_str(&e.to_string()))
}

/// Runs the MoE layer of a user's file at each token count of `options` (JSON) on the
/// browser's adapter: `name` and `bytes` the file (GGUF by its magic, else safetensors),
/// `config` its `config.json` (safetensors; GGUF files carry theirs). Returns the report as
/// JSON; an error's message where anything fails.
#[wasm_bindgen]
pub async fn run_file(
    name: String,
    bytes: Vec<u8>,
    config: Option<String>,
    options: String,
) -> std::result::Result<String, JsValue> {
    std::panic::set_hook(Box::new(|info| web_sys::console::error_1(&info.to_string().into())));
    let opts: FileOptions =
        serde_json::from_str(&options).map_err(|e| JsValue::from_str(&format!("options: {e}")))?;
    let report = from_file(&name, bytes, config.as_deref(), &opts)
        .await
        .map_err(|e| JsValue::from_str(&e.to_string()))?;
    serde_json::to_string(&report).map_err(|e| JsValue::from_str(&e.to_string()))
}

async fn from_file(name: &str, bytes: Vec<u8>, config: Option<&str>, opts: &FileOptions) -> Result<Report> {
    check_tokens(&opts.tokens)?;
    let config = match config {
        Some(text) => {
            Some(serde_json::from_str(text).map_err(|e| Error::invalid(format!("config.json: {e}")))?)
        }
        None => None,
    };
    let load = LoadOptions { config, layer: opts.layer, ..LoadOptions::default() };
    let max = opts.tokens.iter().copied().max().unwrap_or(1);
    // The host load (exact decoded values) is the CPU reference's; the device gets the stored
    // blocks themselves.
    let (loaded, ctx, layer) = if bytes.starts_with(b"GGUF") {
        let g = Gguf::parse(&bytes, name)?;
        let loaded = load_gguf_layer(&g, &load)?;
        let ctx = open(&loaded.config, max, None).await?;
        let layer = upload_gguf_layer_async(&ctx, &g, &load, |c| c).await?.layer;
        (loaded, ctx, layer)
    } else {
        let ckpt = Checkpoint::from_bytes(name, bytes)?;
        let loaded = load_checkpoint_layer(&ckpt, &load)?;
        let ctx = open(&loaded.config, max, None).await?;
        let layer = upload_checkpoint_layer_async(&ctx, &ckpt, &load, |c| c).await?.layer;
        (loaded, ctx, layer)
    };
    let reference_cfg = MoeConfig { weight_dtype: WeightDtype::F32, ..loaded.config };
    let label = format!("{name} ({}): {}", loaded.prefix, layer.config());
    let x = Synth::new(opts.seed).uniform(max as usize * reference_cfg.route.hidden as usize, 1.0);
    report(&ctx, &layer, &reference_cfg, &loaded.weights, &x, &opts.tokens, label).await
}

/// Misuse in a browser is an `Err` too, as natively: a read-back of a destroyed buffer (the
/// error reaches the device's uncaptured-error handler, since a browser's error scopes answer
/// only through promises, and the read-back's next check returns it). Returns the error's
/// message; an error where the misuse went through.
#[wasm_bindgen]
pub async fn error_checks() -> std::result::Result<String, JsValue> {
    let checks = async {
        let ctx = Context::new_async().await?;
        let buffer = ctx.upload("destroyed", &[1.0f32; 16])?;
        buffer.destroy();
        match ctx.read_back_async::<f32>(&buffer, 16).await {
            Ok(values) => Err(Error::invalid(format!(
                "a read-back of a destroyed buffer gave Ok ({} values)",
                values.len()
            ))),
            Err(e) => Ok(e.to_string()),
        }
    };
    checks.await.map_err(|e: Error| JsValue::from_str(&e.to_string()))
}

fn check_tokens(tokens: &[u32]) -> Result<()> {
    if tokens.is_empty() || tokens.contains(&0) {
        return Err(Error::invalid("tokens: one or more counts, each at least 1"));
    }
    Ok(())
}

fn dtype(name: &str) -> Result<WeightDtype> {
    Ok(match name {
        "f32" => WeightDtype::F32,
        "f16" => WeightDtype::F16,
        "bf16" => WeightDtype::Bf16,
        "q8_0" => WeightDtype::Q8_0,
        "q4_0" => WeightDtype::Q4_0,
        "mxfp4" => WeightDtype::Mxfp4,
        "fp8" => WeightDtype::Fp8,
        other => {
            return Err(Error::invalid(format!(
                "dtype `{other}`: one of f32, f16, bf16, q8_0, q4_0, mxfp4, fp8"
            )));
        }
    })
}

async fn synthetic(opts: &Options) -> Result<Report> {
    check_tokens(&opts.tokens)?;
    let cfg = MoeConfig {
        shared_ffn: (opts.shared_ffn > 0).then_some(opts.shared_ffn),
        weight_dtype: dtype(&opts.dtype)?,
        ..MoeConfig::new(opts.hidden, opts.ffn, opts.experts, opts.k)
    };
    cfg.validate()?;
    let max = opts.tokens.iter().copied().max().unwrap_or(1);
    let ctx = open(&cfg, max, opts.max_binding_mib).await?;
    let mut synth = Synth::new(opts.seed);
    let w = synth.moe_weights(&cfg);
    let x = synth.uniform(max as usize * cfg.route.hidden as usize, 1.0);
    let layer = MoeLayer::new_async(&ctx, cfg, &w).await?;
    report(&ctx, &layer, &cfg, &w, &x, &opts.tokens, cfg.to_string()).await
}

/// Prepares `layer` and runs it at each count of `tokens` on the first rows of `x`, checked
/// against the CPU reference of `reference_cfg` and `w`.
async fn report(
    ctx: &Context,
    layer: &MoeLayer,
    reference_cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    tokens: &[u32],
    label: String,
) -> Result<Report> {
    let (a, caps, e) = (ctx.adapter(), ctx.capabilities(), layer.experts());
    let h = reference_cfg.route.hidden as usize;
    let max = tokens.iter().copied().max().unwrap_or(1) as usize;
    layer.prepare_async(ctx, max as u32).await?;
    let xb = ctx.upload("x", &x[..max * h])?;
    let yb = ctx.zeroed("y", (max * h) as u64 * 4)?;
    let mut runs = Vec::new();
    for &n in tokens {
        runs.push(run(ctx, layer, reference_cfg, w, x, (&xb, &yb), n).await?);
    }
    Ok(Report {
        adapter: if a.name.is_empty() { "(the browser names none)".into() } else { a.name.clone() },
        backend: a.backend.clone(),
        device_type: a.device_type.clone(),
        driver: format!("{} {}", a.driver, a.driver_info).trim().to_string(),
        timestamps: caps.timestamps,
        subgroups: caps.subgroups,
        shader_f16: caps.shader_f16,
        max_storage_binding_mib: ctx.limits().max_storage_buffer_binding_size >> 20,
        weight_bindings: [&e.gate, &e.up, &e.down].map(|w| w.chunk_count()),
        layer: label,
        pass: runs.iter().all(|r| r.pass),
        runs,
    })
}

/// A context on the browser's adapter with the features and limits the layer needs for
/// forwards of up to `max_tokens` tokens ([`MoeConfig::requirements`]), the storage binding
/// capped at `max_binding_mib` where given; where the browser refuses them, an error saying
/// which.
async fn open(cfg: &MoeConfig, max_tokens: u32, max_binding_mib: Option<u64>) -> Result<Context> {
    let adapter = moeflow::wgpu_adapters_async()
        .await
        .into_iter()
        .next()
        .ok_or_else(|| Error::NoAdapter("navigator.gpu offered no adapter".into()))?;
    let mut need = cfg.requirements(&adapter, max_tokens)?;
    if let Some(mib) = max_binding_mib {
        let cap = mib << 20;
        need.limits.max_storage_buffer_binding_size = need.limits.max_storage_buffer_binding_size.min(cap);
    }
    let desc = moeflow::wgpu::DeviceDescriptor {
        label: Some("moeflow web"),
        required_features: need.features,
        required_limits: need.limits.clone(),
        ..Default::default()
    };
    let (device, queue) = adapter.request_device(&desc).await.map_err(|e| {
        Error::MissingFeature(format!(
            "the browser refused a device with the layer's features {:?} and limits {:?}: {e}",
            need.features, need.limits
        ))
    })?;
    Ok(Context::from_wgpu(device, queue))
}

/// Plans, times and checks a forward of the first `tokens` rows of `x`, as `moe_layer` does.
async fn run(
    ctx: &Context,
    layer: &MoeLayer,
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    (xb, yb): (&moeflow::wgpu::Buffer, &moeflow::wgpu::Buffer),
    tokens: u32,
) -> Result<Run> {
    let (m, h, k) = (tokens as usize, cfg.route.hidden as usize, cfg.route.k as usize);
    let plan = layer.plan(ctx, layer.io(xb, yb, tokens)?)?;
    let stages = plan.stages_at(tokens)?;
    let passes: Vec<Vec<&moeflow::Dispatch>> = stages.iter().map(|(_, d)| d.iter().collect()).collect();
    let mut sampler = Sampler::new(ctx, 2 * passes.len() as u32)?;
    sampler.sample_stages_async(&passes).await?; // warm-up
    let start = Instant::now();
    let samples = sampler.sample_stages_async(&passes).await?;
    let wall = start.elapsed().as_secs_f64();
    let gpu = sampler.gpu_seconds_async(&samples).await?;
    let gpu_total: Option<f64> = gpu.iter().copied().sum();
    let stages_out = stages
        .iter()
        .zip(&gpu)
        .map(|((name, ds), t)| Stage {
            name: name.to_string(),
            dispatches: ds.len(),
            gpu_ms: t.map(|t| t * 1e3),
        })
        .collect();

    // The CPU reference on a sample of tokens.
    let y: Vec<f32> = ctx.read_back_async(yb, m * h).await?;
    let idx: Vec<u32> = ctx.read_back_async(plan.indices(), m * k).await?;
    let a = reference::agreement(cfg, w, x, &y, &idx, m)?;
    let load = plan.load_async(ctx, cfg.route.experts).await?;
    let seconds = gpu_total.unwrap_or(wall);
    Ok(Run {
        tokens,
        stages: stages_out,
        gpu_ms: gpu_total.map(|t| t * 1e3),
        wall_ms: wall * 1e3,
        tokens_per_s: m as f64 / seconds,
        checked_tokens: a.tokens,
        routing_equal: a.routing_equal,
        outputs_within: a.within(),
        worst_of_bound: a.worst_of_bound,
        bit_equal: a.bit_equal,
        values: a.values,
        load: load.per_expert.clone(),
        load_mean: load.mean,
        load_imbalance: load.imbalance,
        pass: a.passes(),
    })
}
