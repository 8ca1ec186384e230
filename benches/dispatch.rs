//! Device dispatch (stable padded grouping) at E in {64, 330}, k=8, M in {64, 4096}, on the
//! adapter `MOEFLOW_ADAPTER` names. Each iteration records the plan, submits and waits.
//! For local profiling; the benchmark matrix is the record.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use moeflow::Context;
use moeflow::bench::dispatch::skewed_indices;
use moeflow::kernels::dispatch::{DispatchConfig, DispatchLayout};

fn dispatch(c: &mut Criterion) {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("dispatch bench skipped: {e}");
            return;
        }
    };
    let mut group = c.benchmark_group(format!("dispatch/{}", ctx.adapter().slug()));
    if ctx.adapter().is_cpu() {
        group.sample_size(10);
    }
    for experts in [64u32, 330] {
        for tokens in [64u32, 4096] {
            let idx =
                ctx.upload("indices", &skewed_indices(1, tokens, experts, 8)).expect("benchmark buffer");
            let layout = DispatchLayout::new(&ctx, DispatchConfig { experts, k: 8, tile: 32 }, tokens, 0)
                .expect("dispatch layout");
            let plan = layout.plan(&ctx, &idx).expect("dispatch plan");
            let plan: Vec<_> = plan.iter().collect();
            group.throughput(Throughput::Elements(u64::from(tokens)));
            group.bench_function(BenchmarkId::new(format!("E={experts}"), tokens), |b| {
                b.iter(|| ctx.run(&plan).expect("dispatch run"));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
