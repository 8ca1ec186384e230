//! Expert FFN (grouped path) and combine throughput, and the whole layer, on the adapter
//! `MOEFLOW_ADAPTER` names. Each iteration records the plan, submits and waits. Sizes shrink
//! on CPU adapters. For local profiling; the benchmark matrix is the record.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use moeflow::Context;
use moeflow::kernels::combine::{CombineBuffers, CombineMode, plan_combine};
use moeflow::layer::{MoeConfig, MoeLayer};
use moeflow::synth::Synth;

fn layer(c: &mut Criterion) {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("layer bench skipped: {e}");
            return;
        }
    };
    let cpu = ctx.adapter().is_cpu();
    let (h, f, e, k) = if cpu { (256u32, 128u32, 16u32, 4u32) } else { (1024, 512, 64, 8) };
    let mut group = c.benchmark_group(format!("layer/{}", ctx.adapter().slug()));
    if cpu {
        group.sample_size(10);
    }
    let cfg = MoeConfig { shared_ffn: Some(f), ..MoeConfig::new(h, f, e, k) };
    let layer = MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)).expect("layer");
    for tokens in if cpu { [1u32, 64] } else { [1, 512] } {
        let x =
            ctx.upload("x", &Synth::new(2).uniform((tokens * h) as usize, 1.0)).expect("benchmark buffer");
        let y = ctx.zeroed("y", u64::from(tokens * h) * 4).expect("benchmark buffer");
        let plan = layer.plan(&ctx, layer.io(&x, &y, tokens).expect("io")).expect("layer plan");
        let forward = plan.dispatches_at(tokens).expect("layer plan");
        let flops = 6.0 * f64::from(tokens) * f64::from(h) * f64::from(f) * f64::from(k + 1);
        group.throughput(Throughput::Elements(flops as u64));
        group.bench_function(BenchmarkId::new("forward (flops)", tokens), |b| {
            b.iter(|| ctx.run(&forward.iter().collect::<Vec<_>>()).expect("forward"));
        });
        let weights = ctx
            .upload("weights", &Synth::new(3).uniform((tokens * k) as usize, 1.0))
            .expect("benchmark buffer");
        let partial = ctx
            .upload("partial", &Synth::new(4).uniform((tokens * k * h) as usize, 1.0))
            .expect("benchmark buffer");
        let bufs = CombineBuffers {
            weights: (&weights).into(),
            partial: (&partial).into(),
            shared: None,
            y: (&y).into(),
        };
        let combine = plan_combine(&ctx, tokens, h, k, &bufs, CombineMode::OneLaunch).expect("combine plan");
        let combine: Vec<_> = combine.iter().collect();
        group.throughput(Throughput::Bytes(u64::from(tokens * k * h + tokens * h) * 4));
        group.bench_function(BenchmarkId::new("combine (bytes)", tokens), |b| {
            b.iter(|| ctx.run(&combine).expect("combine"));
        });
    }
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
