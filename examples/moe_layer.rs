//! Runs moeflow on the default adapter: a seeded synthetic batch is routed on the GPU
//! (fused and unfused), checked against the CPU reference, and the expert load is shown.
//!
//! `cargo run --release --example moe_layer -- --help` lists the options.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use moeflow::kernels::routing::{RouteConfig, RouteMode, route_host};
use moeflow::reference::routing as reference;
use moeflow::synth::Synth;
use moeflow::{AdapterSelector, Context, Error};

#[derive(Parser, Debug)]
#[command(about = "Route a seeded synthetic batch with moeflow and check it against the CPU reference")]
struct Args {
    /// Adapter: `vulkan`, `gl`, `vulkan:llvmpipe`, a name substring... (default: MOEFLOW_ADAPTER or the best found)
    #[arg(long)]
    adapter: Option<String>,
    /// Tokens in the batch (M).
    #[arg(long, default_value_t = 512)]
    tokens: u32,
    /// Hidden size (H).
    #[arg(long, default_value_t = 1024)]
    hidden: u32,
    /// Routed experts (E).
    #[arg(long, default_value_t = 64)]
    experts: u32,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    k: u32,
    /// Seed of the synthetic data.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn main() -> ExitCode {
    env_logger::init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
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

fn run(args: &Args) -> moeflow::Result<()> {
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
    let cfg = RouteConfig { renormalize: true, ..RouteConfig::new(args.hidden, args.experts, args.k) };
    cfg.validate()?;
    let (m, h, e, k) = (args.tokens as usize, args.hidden as usize, args.experts as usize, args.k as usize);
    println!("routing: M={m} H={h} E={e} k={k}, softmax, renormalised, seed {}", args.seed);
    let (x, gate) = Synth::new(args.seed).routing(m, h, e);

    let mut outputs = Vec::new();
    for mode in [RouteMode::Unfused, RouteMode::Fused { write_logits: true }] {
        route_host(&ctx, &cfg, &x, &gate, None, mode)?; // warm-up: pipeline build
        let start = Instant::now();
        let out = route_host(&ctx, &cfg, &x, &gate, None, mode)?;
        println!(
            "  {:<32} {:>9.2} ms host wall (upload + run + readback)",
            format!("{mode:?}"),
            start.elapsed().as_secs_f64() * 1e3
        );
        outputs.push(out);
    }
    let (unfused, fused) = (&outputs[0], &outputs[1]);
    let same_bits = unfused.indices == fused.indices
        && unfused.weights.iter().zip(&fused.weights).all(|(a, b)| a.to_bits() == b.to_bits());

    let logits = reference::gate_logits(&x, &gate, h);
    let (ref_idx, ref_w) = reference::topk(&cfg, &logits, None);
    let idx_equal = fused.indices.iter().zip(&ref_idx).filter(|(a, b)| a == b).count();
    let mut worst = 0.0f32;
    let mut bit_equal = 0;
    for (g, r) in fused.weights.iter().zip(&ref_w) {
        worst = worst.max((g - r).abs() / (2e-5 + 2e-5 * r.abs()));
        bit_equal += usize::from(g.to_bits() == r.to_bits());
    }
    let pass = idx_equal == ref_idx.len() && worst <= 1.0 && same_bits;
    println!("check against the CPU reference:");
    println!("  indices equal        {idx_equal}/{}", ref_idx.len());
    println!(
        "  weights within bound {} (worst error {worst:.3} of 2e-5 + 2e-5*|ref|), {bit_equal}/{} bit-equal",
        worst <= 1.0,
        ref_w.len()
    );
    println!("  fused == unfused     {same_bits} (bitwise)");

    let mut load = vec![0usize; e];
    for &i in &fused.indices {
        load[i as usize] += 1;
    }
    let mean = (m * k) as f64 / e as f64;
    let max = load.iter().copied().max().unwrap_or(0);
    println!("expert load (tokens per expert; mean {mean:.1}, max/mean {:.2}):", max as f64 / mean);
    for (i, n) in load.iter().enumerate() {
        let bar = "#".repeat((*n * 40).div_ceil(max.max(1)));
        println!("  {i:>4} {n:>6} {bar}");
    }
    println!("result: {}", if pass { "PASS" } else { "FAIL" });
    if pass {
        Ok(())
    } else {
        Err(Error::InvalidArgument("GPU results disagree with the reference (see above)".into()))
    }
}
