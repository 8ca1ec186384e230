//! Fused vs unfused routing at E=256, k=8, H=2048, M in {1, 8, 512}, on the adapter that
//! `MOEFLOW_ADAPTER` names (default: the best found). Each iteration records the plan,
//! submits it and waits for the device: GPU work plus submission overhead, no readback.
//! For local profiling; the benchmark matrix (`examples/bench_matrix.rs`) is the record.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use moeflow::Context;
use moeflow::kernels::routing::{RouteBuffers, RouteConfig, RouteMode, plan_route};
use moeflow::synth::Synth;

fn routing(c: &mut Criterion) {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("routing bench skipped: {e}");
            return;
        }
    };
    let (hidden, experts, k) = (2048u32, 256u32, 8u32);
    let cfg = RouteConfig::new(hidden, experts, k);
    let mut group = c.benchmark_group(format!("routing/{}", ctx.adapter().slug()));
    if ctx.adapter().is_cpu() {
        group.sample_size(10);
    }
    for tokens in [1u32, 8, 512] {
        let (x, gate) = Synth::new(1).routing(tokens as usize, hidden as usize, experts as usize);
        let xb = ctx.upload("x", &x).expect("benchmark buffer");
        let gb = ctx.upload("gate", &gate).expect("benchmark buffer");
        let logits = ctx.zeroed("logits", u64::from(tokens * experts) * 4).expect("benchmark buffer");
        let indices = ctx.zeroed("indices", u64::from(tokens * k) * 4).expect("benchmark buffer");
        let weights = ctx.zeroed("weights", u64::from(tokens * k) * 4).expect("benchmark buffer");
        let bufs = RouteBuffers {
            x: (&xb).into(),
            gate: &gb,
            bias: None,
            logits: Some((&logits).into()),
            indices: (&indices).into(),
            weights: (&weights).into(),
        };
        group.throughput(Throughput::Elements(u64::from(tokens)));
        for (name, mode) in
            [("unfused", RouteMode::Unfused), ("fused", RouteMode::Fused { write_logits: false })]
        {
            let plan = match plan_route(&ctx, &cfg, tokens, &bufs, mode) {
                Ok(p) => p,
                Err(e) => panic!("planning {name} M={tokens}: {e}"),
            };
            group.bench_with_input(BenchmarkId::new(name, tokens), &plan, |b, plan| {
                b.iter(|| ctx.run(&plan.dispatches()).expect("routing run"));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
