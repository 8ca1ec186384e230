//! Runs a MoE layer with moeflow.
//!
//! Without arguments: a seeded synthetic model (H=1024, F=512, E=64, k=8, one shared expert,
//! M=512) on the default adapter; prints the adapter, per-stage GPU times, tokens/s, the
//! expert load, and the check against the CPU reference.
//!
//! With `--weights W.safetensors --input X.safetensors --output Y.safetensors`: runs your
//! layer (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek or gpt-oss tensor names, or a GGUF file's
//! `blk.N.` layer) on `x` and writes `output`, `topk_indices`, `topk_weights` and
//! `expert_counts`.
//!
//! `--cpu-moe` keeps every routed expert in host memory and computes them on the CPU
//! (`--host-experts 0,5,17` a chosen set), as llama.cpp's `--cpu-moe` and `-ot`: the
//! synthetic layer's, or a GGUF file's or safetensors checkpoint's read in place (gpt-oss's
//! MXFP4 as shipped, FP8 with f32 scales); it prints the device and host bytes of
//! the layer's weights (and for the synthetic layer the hybrid forward's times).
//!
//! `cargo run --release --example moe_layer -- --help` lists every option.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use moeflow::bench::Sampler;
use moeflow::host_experts::{HostExperts, HostProjection};
use moeflow::kernels::combine::CombineMode;
use moeflow::kernels::gemm::{ExpertFfn, ExpertPlacement, ExpertWeights, WeightDtype};
use moeflow::kernels::routing::GroupLimit;
use moeflow::kernels::routing::RouteMode;
use moeflow::layer::{ForwardOutput, ForwardPlan, MoeConfig, MoeLayer, MoeWeights, RouterWeights};
use moeflow::reference::layer as reference;
use moeflow::synth::{StoredExperts, Synth};
use moeflow::weights::gguf::GgufFile;
use moeflow::weights::{
    Checkpoint, Family, LoadOptions, OutTensor, PlacedLayer, RoutingFlags, UploadedLayer, check_output_path,
    gguf_moe_layers, load_input, read_file, upload_checkpoint_layer, upload_checkpoint_layer_placed,
    upload_gguf_layer, upload_gguf_layer_placed, write_tensors,
};
use moeflow::{AdapterSelector, Context, Error, Result};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Dtype {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    Mxfp4,
    Fp8,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Route {
    Fused,
    Unfused,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Combine {
    OneLaunch,
    Sequential,
}

#[derive(Parser, Debug)]
#[command(about = "Run a mixture-of-experts layer with moeflow")]
struct Args {
    /// Adapter: `vulkan`, `gl`, `vulkan:llvmpipe`, a name substring (default: MOEFLOW_ADAPTER or the best found).
    #[arg(long)]
    adapter: Option<String>,
    /// List every adapter wgpu finds (selector slug, name, backend, type, driver, the optional
    /// features moeflow uses) and exit; fails when there is none.
    #[arg(long, exclusive = true)]
    list_adapters: bool,
    /// Layer weights: a `.safetensors` file, a sharded checkpoint's
    /// `model.safetensors.index.json`, a directory holding either, or a GGUF file (its
    /// metadata is the configuration); memory-mapped. Without it a seeded synthetic model runs.
    #[arg(long, requires_all = ["input", "output"])]
    weights: Option<PathBuf>,
    /// Tensor-name prefix of the layer in the weights (e.g. `model.layers.3.`).
    #[arg(long, conflicts_with = "layer")]
    prefix: Option<String>,
    /// The MoE layer by index (`model.layers.N.`, GGUF's `blk.N.`) in a checkpoint holding several.
    #[arg(long)]
    layer: Option<usize>,
    /// Every MoE layer of the checkpoint in turn, each on the same input (one layer on the
    /// device at a time, the checkpoint mapped once); outputs are named `layers.N.output` etc.
    #[arg(long, conflicts_with_all = ["prefix", "layer"])]
    all_layers: bool,
    /// Input tensor `x` [tokens, hidden] (safetensors).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Output file (safetensors).
    #[arg(long)]
    output: Option<PathBuf>,
    /// The model's Hugging Face config.json (its `model_type` decides the routing semantics).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Family of the weights file (`mixtral`, `qwen2_moe`, `qwen3_moe`, `olmoe`, `deepseek_v2`,
    /// `deepseek_v3`) when no config.json names it.
    #[arg(long)]
    family: Option<String>,
    /// Experts per token (synthetic model: default 8; weights file: when no config.json says).
    #[arg(long)]
    k: Option<u32>,
    /// `norm_topk_prob`: renormalise the top-k weights (weights file without config.json).
    #[arg(long)]
    norm_topk_prob: Option<bool>,
    /// `n_group` for DeepSeek-V3 group-limited routing (1: none); needs --topk-group.
    #[arg(long, requires = "topk_group")]
    n_group: Option<u32>,
    /// `topk_group`: groups kept per token; needs --n-group.
    #[arg(long, requires = "n_group")]
    topk_group: Option<u32>,
    /// `routed_scaling_factor` (DeepSeek) for a weights file without config.json.
    #[arg(long)]
    routed_scaling_factor: Option<f32>,
    /// Expert weight dtype on the device (default: the file's, or f32 for the synthetic model):
    /// f32, f16, bf16, or quantised q8_0, q4_0, mxfp4, fp8 (f32 weights quantised row by row
    /// along K; see docs/quant.md).
    #[arg(long, value_enum)]
    dtype: Option<Dtype>,
    /// Routing: one fused dispatch or gate matvec + top-k (bit-identical).
    #[arg(long, value_enum, default_value_t = Route::Unfused)]
    route: Route,
    /// Combine: one launch or one dispatch per token and slot (bit-identical).
    #[arg(long, value_enum, default_value_t = Combine::OneLaunch)]
    combine: Combine,
    /// Synthetic model: tokens, or several counts separated by commas (`1,8,512`), each
    /// planned, timed and checked in turn on the one layer.
    #[arg(long, value_delimiter = ',', default_value = "512")]
    tokens: Vec<u32>,
    /// Synthetic model: hidden size.
    #[arg(long, default_value_t = 1024)]
    hidden: u32,
    /// Synthetic model: expert FFN size.
    #[arg(long, default_value_t = 512)]
    ffn: u32,
    /// Synthetic model: experts.
    #[arg(long, default_value_t = 64)]
    experts: u32,
    /// Synthetic model: FFN size of the shared expert (0: none).
    #[arg(long, default_value_t = 512)]
    shared_ffn: u32,
    /// Synthetic model: seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Every routed expert in host memory, computed on the CPU (llama.cpp's `--cpu-moe`);
    /// router, grouping, shared expert and combine stay on the device.
    #[arg(long, conflicts_with = "host_experts")]
    cpu_moe: bool,
    /// These routed experts in host memory, computed on the CPU (as llama.cpp's `-ot`), the
    /// rest on the device: `--host-experts 0,5,17`.
    #[arg(long, value_delimiter = ',')]
    host_experts: Vec<u32>,
    /// Threads of the host experts (one per core when not given).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> ExitCode {
    let _runtime_dir = runtime_dir();
    env_logger::init();
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Error::NoAdapter(why)) => {
            eprintln!("moe_layer: no GPU adapter ({why})");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("moe_layer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Without a usable `XDG_RUNTIME_DIR` (a fresh server or container), Mesa's Vulkan drivers
/// print "error: XDG_RUNTIME_DIR is invalid or not set in the environment." twice while wgpu
/// lists adapters (libwayland-client's complaint; nothing fails). This points the variable at
/// a private folder, removed when the returned guard drops, so the report starts clean; a set
/// and existing folder is left alone.
fn runtime_dir() -> Option<tempfile::TempDir> {
    let set = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| Path::new(&d).is_dir());
    if set {
        return None;
    }
    let dir = tempfile::Builder::new().prefix("moe_layer-runtime-").tempdir().ok()?;
    // SAFETY: called first thing in `main`, before this process starts any other thread.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", dir.path()) };
    Some(dir)
}

fn dtype(d: Dtype) -> WeightDtype {
    match d {
        Dtype::F32 => WeightDtype::F32,
        Dtype::F16 => WeightDtype::F16,
        Dtype::Bf16 => WeightDtype::Bf16,
        Dtype::Q8_0 => WeightDtype::Q8_0,
        Dtype::Q4_0 => WeightDtype::Q4_0,
        Dtype::Mxfp4 => WeightDtype::Mxfp4,
        Dtype::Fp8 => WeightDtype::Fp8,
    }
}

fn apply_modes(cfg: MoeConfig, args: &Args) -> MoeConfig {
    MoeConfig {
        route_mode: match args.route {
            Route::Fused => RouteMode::Fused { write_logits: false },
            Route::Unfused => RouteMode::Unfused,
        },
        combine: match args.combine {
            Combine::OneLaunch => CombineMode::OneLaunch,
            Combine::Sequential => CombineMode::Sequential,
        },
        ..cfg
    }
}

fn run(args: &Args) -> Result<bool> {
    if args.list_adapters {
        let found = moeflow::adapters();
        for a in &found {
            let c = a.capabilities;
            println!(
                "{}: {a}; timestamps={} subgroups={} shader-f16={}",
                a.slug(),
                c.timestamps,
                c.subgroups,
                c.shader_f16
            );
        }
        return Ok(!found.is_empty());
    }
    let ctx = match &args.adapter {
        Some(s) => Context::with_selector(&s.parse::<AdapterSelector>()?)?,
        None => Context::new()?,
    };
    println!("adapter: {}", ctx.adapter());
    let caps = ctx.capabilities();
    println!(
        "features: timestamps={} subgroups={} shader-f16={}",
        caps.timestamps, caps.subgroups, caps.shader_f16
    );
    match &args.weights {
        Some(w) => run_file(&ctx, args, w),
        None => run_synthetic(&ctx, args),
    }
}

fn run_file(ctx: &Context, args: &Args, weights: &Path) -> Result<bool> {
    let on_host = args.cpu_moe || !args.host_experts.is_empty();
    let (input, output) = match (&args.input, &args.output) {
        (Some(i), Some(o)) => (i, o),
        _ => return Err(Error::invalid("--weights needs --input and --output")),
    };
    let source = if GgufFile::is_gguf(weights)? {
        Source::Gguf(GgufFile::open(weights)?)
    } else {
        Source::Safetensors(Checkpoint::open(weights)?)
    };
    let mut inputs = match &source {
        Source::Safetensors(ckpt) => ckpt.files(),
        Source::Gguf(_) => Vec::new(),
    };
    inputs.extend([weights, input.as_path()]);
    if let Some(c) = &args.config {
        inputs.push(c.as_path());
    }
    check_output_path(output, &inputs)?;
    let config = match &args.config {
        Some(p) => Some(
            serde_json::from_slice(&read_file(p)?)
                .map_err(|e| Error::invalid(format!("{} is not valid JSON: {e}", p.display())))?,
        ),
        None => None,
    };
    let routing = RoutingFlags {
        family: args.family.as_deref().map(str::parse::<Family>).transpose()?,
        k: args.k,
        norm_topk_prob: args.norm_topk_prob,
        groups: match (args.n_group, args.topk_group) {
            (Some(n_group), Some(topk_group)) => Some(GroupLimit { n_group, topk_group }),
            _ => None,
        },
        routed_scaling_factor: args.routed_scaling_factor,
    };
    let opts = LoadOptions {
        prefix: args.prefix.clone(),
        layer: args.layer,
        config,
        routing,
        dtype: args.dtype.map(dtype),
    };
    let (x, tokens, hidden) = load_input(&read_file(input)?, &input.display().to_string())?;
    let layers: Vec<Option<usize>> = match args.all_layers {
        true => {
            let found = source.moe_layers()?;
            if found.is_empty() {
                return Err(Error::invalid(format!("{} holds no MoE layer", weights.display())));
            }
            found.keys().map(|&l| Some(l)).collect()
        }
        false => vec![args.layer],
    };
    let mut results = Vec::new();
    for index in layers {
        let opts = LoadOptions { layer: index.or(opts.layer), ..opts.clone() };
        let start = Instant::now();
        let check_x = |cfg: &MoeConfig| match hidden == cfg.route.hidden as usize {
            true => Ok(()),
            false => Err(Error::shape(
                "input x",
                format!("[tokens, {}]", cfg.route.hidden),
                format!("[{tokens}, {hidden}]"),
            )),
        };
        let (out, cfg) = match (&source, on_host) {
            (_, false) => {
                let loaded = source.upload(ctx, &opts, |c| apply_modes(c, args))?;
                let load_s = start.elapsed().as_secs_f64();
                let cfg = *loaded.layer.config();
                println!(
                    "layer: {} at `{}`: {cfg} (loaded in {load_s:.2} s)",
                    loaded.routing.family, loaded.prefix
                );
                check_x(&cfg)?;
                (loaded.layer.forward_host(ctx, &x)?, cfg)
            }
            (Source::Gguf(file), true) => {
                let g = file.parse()?;
                let placed = upload_gguf_layer_placed(
                    ctx,
                    &g,
                    &opts,
                    |e| placement(args, e),
                    |c| apply_modes(c, args),
                )?;
                run_placed(ctx, &placed, &x, start, check_x)?
            }
            (Source::Safetensors(ckpt), true) => {
                let placed = upload_checkpoint_layer_placed(
                    ctx,
                    ckpt,
                    &opts,
                    |e| placement(args, e),
                    |c| apply_modes(c, args),
                )?;
                run_placed(ctx, &placed, &x, start, check_x)?
            }
        };
        let mut counts = vec![0u32; cfg.route.experts as usize];
        for &i in &out.indices {
            counts[i as usize] += 1;
        }
        let name = match (args.all_layers, index) {
            (true, Some(l)) => format!("layers.{l}."),
            _ => String::new(),
        };
        results.push((name, out, counts, cfg.route.k as usize));
    }
    let names: Vec<[String; 4]> = results
        .iter()
        .map(|(p, ..)| ["output", "topk_indices", "topk_weights", "expert_counts"].map(|n| format!("{p}{n}")))
        .collect();
    let shapes: Vec<([usize; 2], [usize; 2], [usize; 1])> =
        results.iter().map(|(_, _, counts, k)| ([tokens, hidden], [tokens, *k], [counts.len()])).collect();
    let mut tensors = Vec::new();
    for (((_, out, counts, _), n), (ys, ks, es)) in results.iter().zip(&names).zip(&shapes) {
        tensors.push(OutTensor::F32(&n[0], ys, &out.y));
        tensors.push(OutTensor::U32(&n[1], ks, &out.indices));
        tensors.push(OutTensor::F32(&n[2], ks, &out.weights));
        tensors.push(OutTensor::U32(&n[3], es, counts));
    }
    write_tensors(output, &tensors)?;
    println!("wrote {} ({tokens} tokens, {} layer(s))", output.display(), results.len());
    if let Some(mib) = peak_host_mib() {
        println!("peak host memory: {mib} MiB (VmHWM; on CPU adapters it includes the device buffers)");
    }
    Ok(true)
}

/// A `--weights` file: a safetensors checkpoint or a GGUF file.
enum Source {
    Safetensors(Checkpoint),
    Gguf(GgufFile),
}

impl Source {
    /// MoE layer indices (with their prefixes).
    fn moe_layers(&self) -> Result<std::collections::BTreeMap<usize, String>> {
        match self {
            Source::Safetensors(ckpt) => Ok(ckpt.moe_layers()),
            Source::Gguf(file) => Ok(gguf_moe_layers(&file.parse()?)),
        }
    }

    fn upload(
        &self,
        ctx: &Context,
        opts: &LoadOptions,
        adjust: impl FnOnce(MoeConfig) -> MoeConfig,
    ) -> Result<UploadedLayer> {
        match self {
            Source::Safetensors(ckpt) => upload_checkpoint_layer(ctx, ckpt, opts, adjust),
            Source::Gguf(file) => upload_gguf_layer(ctx, &file.parse()?, opts, adjust),
        }
    }
}

/// The process's peak resident memory in MiB (Linux `VmHWM`), where the OS reports it.
fn peak_host_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

fn run_synthetic(ctx: &Context, args: &Args) -> Result<bool> {
    let file_only = [
        ("--config", args.config.is_some()),
        ("--family", args.family.is_some()),
        ("--norm-topk-prob", args.norm_topk_prob.is_some()),
        ("--n-group", args.n_group.is_some()),
        ("--routed-scaling-factor", args.routed_scaling_factor.is_some()),
        ("--prefix", args.prefix.is_some()),
        ("--layer", args.layer.is_some()),
        ("--all-layers", args.all_layers),
    ];
    if let Some((flag, _)) = file_only.iter().find(|(_, given)| *given) {
        return Err(Error::invalid(format!(
            "{flag} applies to a weights file (--weights), not the synthetic model"
        )));
    }
    let cfg = apply_modes(
        MoeConfig {
            shared_ffn: (args.shared_ffn > 0).then_some(args.shared_ffn),
            weight_dtype: args.dtype.map_or(WeightDtype::F32, dtype),
            ..MoeConfig::new(args.hidden, args.ffn, args.experts, args.k.unwrap_or(8))
        },
        args,
    );
    cfg.validate()?;
    let h = args.hidden as usize;
    let max = args.tokens.iter().copied().max().unwrap_or(0) as usize;
    if args.tokens.contains(&0) {
        return Err(Error::invalid("--tokens: every count must be at least 1"));
    }
    println!("synthetic layer: M={}, {cfg}, seed {}", join(&args.tokens), args.seed);
    let mut synth = Synth::new(args.seed);
    let w: MoeWeights = synth.moe_weights(&cfg);
    let x = synth.uniform(max * h, 1.0);
    let xb = ctx.upload("x", &x)?;
    let yb = ctx.zeroed("y", (max * h) as u64 * 4)?;
    let mut pass = true;
    let placement = match args.cpu_moe || !args.host_experts.is_empty() {
        true => Some(placement(args, cfg.route.experts)?),
        false => None,
    };
    let Some(placement) = placement else {
        let layer = MoeLayer::new(ctx, cfg, &w)?;
        for &tokens in &args.tokens {
            if args.tokens.len() > 1 {
                println!("M={tokens}:");
            }
            pass &= run_tokens(ctx, &layer, &cfg, &w, &x, (&xb, &yb), tokens)?;
        }
        println!("result: {}", if pass { "PASS" } else { "FAIL" });
        return Ok(pass);
    };
    let (e, f) = (cfg.route.experts as usize, cfg.ffn as usize);
    let stored = [
        StoredExperts::new(cfg.weight_dtype, &w.gate, [e, f, h])?,
        StoredExperts::new(cfg.weight_dtype, &w.up, [e, f, h])?,
        StoredExperts::new(cfg.weight_dtype, &w.down, [e, h, f])?,
    ];
    let (layer, host) = hybrid_layer(ctx, &cfg, &w, &stored, &placement, args.threads)?;
    print_placement(&layer, &host);
    for &tokens in &args.tokens {
        if args.tokens.len() > 1 {
            println!("M={tokens}:");
        }
        pass &= run_hybrid_tokens(ctx, &layer, &host, &cfg, &w, &x, (&xb, &yb), tokens)?;
    }
    println!("result: {}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}

/// Prints a placed layer's load and placement and runs its hybrid forward on `x`.
fn run_placed(
    ctx: &Context,
    placed: &PlacedLayer<'_>,
    x: &[f32],
    start: Instant,
    check_x: impl Fn(&MoeConfig) -> Result<()>,
) -> Result<(ForwardOutput, MoeConfig)> {
    let load_s = start.elapsed().as_secs_f64();
    let (layer, cfg) = (&placed.uploaded.layer, *placed.uploaded.layer.config());
    println!(
        "layer: {} at `{}`: {cfg} (loaded in {load_s:.2} s)",
        placed.uploaded.routing.family, placed.uploaded.prefix
    );
    print_placement(layer, &placed.host);
    check_x(&cfg)?;
    Ok((layer.forward_host_hybrid(ctx, x, &placed.host)?, cfg))
}

/// The placement `--cpu-moe` or `--host-experts` asks for, of `experts` experts.
fn placement(args: &Args, experts: u32) -> Result<ExpertPlacement> {
    match args.cpu_moe {
        true => Ok(ExpertPlacement::all_on_host(experts)),
        false => ExpertPlacement::with_host(experts, &args.host_experts),
    }
}

/// Prints where the routed experts' weights are: the experts on the host, their host bytes,
/// threads and SIMD target, and the device's bytes.
fn print_placement(layer: &MoeLayer, host: &HostExperts<'_>) {
    let device_bytes: u64 =
        [&layer.experts().gate, &layer.experts().up, &layer.experts().down].iter().map(|p| p.bytes()).sum();
    println!(
        "routed expert weights: {} of {} experts on the host, {:.1} MiB in host memory ({} threads, {}); \
         {:.1} MiB on the device",
        host.experts().len(),
        layer.config().route.experts,
        host.bytes() as f64 / (1 << 20) as f64,
        host.threads(),
        HostExperts::simd(),
        device_bytes as f64 / (1 << 20) as f64,
    );
}

/// The synthetic layer with the experts `placement` puts on the host kept there, in their
/// stored form `stored` (gate, up, down), and the others uploaded from it.
fn hybrid_layer<'s>(
    ctx: &Context,
    cfg: &MoeConfig,
    w: &MoeWeights,
    stored: &'s [StoredExperts; 3],
    placement: &ExpertPlacement,
    threads: Option<usize>,
) -> Result<(MoeLayer, HostExperts<'s>)> {
    let dt = cfg.weight_dtype;
    let device = |s: &StoredExperts| {
        ExpertWeights::stream_placed(ctx, dt, s.shape(), placement, |x| Ok(s.expert(x)), |_| {})
    };
    let experts = ExpertFfn::new(device(&stored[0])?, device(&stored[1])?, device(&stored[2])?)?;
    let h = cfg.route.hidden;
    let shared = match (&w.shared, cfg.shared_ffn) {
        (Some((g, u, d)), Some(fs)) => {
            let ew = |v: &[f32], n, k| ExpertWeights::from_f32(ctx, v, dt, 1, n, k);
            Some(ExpertFfn::new(ew(g, fs, h)?, ew(u, fs, h)?, ew(d, h, fs)?)?)
        }
        _ => None,
    };
    let router = RouterWeights {
        router: w.router.clone(),
        bias: w.bias.clone(),
        shared_gate: w.shared_gate.clone(),
        router_bias: w.router_bias.clone(),
    };
    let layer = MoeLayer::with_experts(ctx, *cfg, &router, experts, shared)?;
    let held = placement.host_experts();
    let project = |s: &'s StoredExperts| -> Result<HostProjection<'s>> {
        let mut p = HostProjection::new(s.shape())?;
        for &x in &held {
            p.hold(x, s.expert(x))?;
        }
        Ok(p)
    };
    let mut host = HostExperts::new(
        project(&stored[0])?,
        project(&stored[1])?,
        project(&stored[2])?,
        cfg.gemm_order,
        cfg.activation,
    )?;
    if let Some(t) = threads {
        host = host.with_threads(t)?;
    }
    Ok((layer, host))
}

/// As [`run_tokens`] for a layer with experts on the host: the hybrid forward's times (host
/// wall clock: route and read-back, the host's FFN, the wait for the device's experts after
/// it, and the whole forward to the combine's end; the device's own time for its stages),
/// then the same check.
#[allow(clippy::too_many_arguments)]
fn run_hybrid_tokens(
    ctx: &Context,
    layer: &MoeLayer,
    host: &HostExperts<'_>,
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    (xb, yb): (&wgpu::Buffer, &wgpu::Buffer),
    tokens: u32,
) -> Result<bool> {
    let m = tokens as usize;
    let forward = layer.plan_hybrid(ctx, layer.io(xb, yb, tokens)?, host)?;
    forward.run(ctx, tokens)?; // warm-up
    ctx.submit_and_wait(ctx.encoder("warm-up end"))?;
    let start = Instant::now();
    let times = forward.run(ctx, tokens)?;
    ctx.submit_and_wait(ctx.encoder("forward end"))?;
    let wall = start.elapsed().as_secs_f64();
    println!("hybrid forward (host wall clock; the device's experts run while the host computes):");
    println!("  routed    {:>10.3} ms  (route stage and the read-back of indices and x)", times.routed * 1e3);
    println!("  host      {:>10.3} ms  ({} rows on the host's experts)", times.host * 1e3, times.host_rows);
    println!(
        "  dev wait  {:>10.3} ms  (device experts and shared expert after the host's)",
        times.device_wait * 1e3
    );
    match times.device {
        Some(t) => println!(
            "  device    {:>10.3} ms  (GPU time of the device's stages, beside the host's FFN)",
            t * 1e3
        ),
        None => println!("  device    {:>10}     (no timestamps on this adapter)", "-"),
    }
    println!("  host wall {:>10.3} ms (to the combine's end); {:.0} tokens/s", wall * 1e3, m as f64 / wall);
    check(ctx, cfg, w, x, yb, forward.plan(), m)
}

/// Reads back y and the routing of the first `m` tokens and prints their check against the CPU
/// reference; whether it passed.
fn check(
    ctx: &Context,
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    yb: &wgpu::Buffer,
    plan: &ForwardPlan,
    m: usize,
) -> Result<bool> {
    let y: Vec<f32> = ctx.read_back(yb, m * cfg.route.hidden as usize)?;
    let idx: Vec<u32> = ctx.read_back(plan.indices(), m * cfg.route.k as usize)?;
    let a = reference::agreement(cfg, w, x, &y, &idx, m)?;
    println!("check against the CPU reference on {} tokens:", a.tokens);
    println!("  routing equal   {}/{}", a.routing_equal, a.tokens);
    println!(
        "  outputs within 2e-5 + 2e-5*|row scale|: {} (worst {:.3} of the bound; {}/{} bit-equal)",
        a.within(),
        a.worst_of_bound,
        a.bit_equal,
        a.values
    );
    Ok(a.passes())
}

/// Counts joined by commas, as `--tokens` takes them.
fn join(counts: &[u32]) -> String {
    counts.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Plans, times and checks a forward of the first `tokens` rows of `x` through `layer`;
/// whether it matched the CPU reference.
fn run_tokens(
    ctx: &Context,
    layer: &MoeLayer,
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    (xb, yb): (&wgpu::Buffer, &wgpu::Buffer),
    tokens: u32,
) -> Result<bool> {
    let (m, h) = (tokens as usize, cfg.route.hidden as usize);
    let plan = layer.plan(ctx, layer.io(xb, yb, tokens)?)?;
    let stages = plan.stages_at(tokens)?;
    let passes: Vec<Vec<&moeflow::Dispatch>> = stages.iter().map(|(_, d)| d.iter().collect()).collect();
    let mut sampler = Sampler::new(ctx, 2 * passes.len() as u32)?;
    sampler.sample_stages(&passes)?; // warm-up
    let start = Instant::now();
    let samples = sampler.sample_stages(&passes)?;
    let wall = start.elapsed().as_secs_f64();
    let gpu = sampler.gpu_seconds(&samples)?;
    println!("per-stage GPU time ({} dispatches):", passes.iter().map(Vec::len).sum::<usize>());
    let mut total = 0.0;
    for ((name, ds), t) in stages.iter().zip(&gpu) {
        match t {
            Some(t) => {
                total += t;
                println!("  {name:<9} {:>10.3} ms  ({} dispatches)", t * 1e3, ds.len());
            }
            None => {
                println!("  {name:<9} {:>10} ({} dispatches; no timestamps on this adapter)", "-", ds.len())
            }
        }
    }
    let flops = 6.0 * (m * cfg.route.k as usize) as f64 * (h * cfg.ffn as usize) as f64
        + 6.0 * (m * h * cfg.shared_ffn.unwrap_or(0) as usize) as f64;
    if gpu.iter().all(Option::is_some) {
        println!(
            "  total     {:>10.3} ms GPU; {:.0} tokens/s; {:.2} GFLOP/s",
            total * 1e3,
            m as f64 / total,
            flops / total / 1e9
        );
    }
    println!("  host wall {:>10.3} ms (submit to completion); {:.0} tokens/s", wall * 1e3, m as f64 / wall);

    // Check a sample of tokens against the CPU reference.
    let pass = check(ctx, cfg, w, x, yb, &plan, m)?;

    let load = plan.load(ctx, cfg.route.experts)?;
    println!("expert load (rows per expert; mean {:.1}, max/mean {:.2}):", load.mean, load.imbalance);
    let max = load.max.max(1) as usize;
    for (e, &n) in load.per_expert.iter().enumerate() {
        println!("  {e:>4} {n:>6} {}", "#".repeat((n as usize * 40).div_ceil(max)));
    }
    Ok(pass)
}
