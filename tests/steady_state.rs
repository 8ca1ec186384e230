//! An engine's steady state, alone in its process so that its resident-memory figure is its own.

mod common;

use common::contexts;
use moeflow::layer::{MoeConfig, MoeLayer};
use moeflow::synth::Synth;

/// An engine's steady state: one plan, 1,000 forwards at counts that change every call, on
/// the host and the device in turn, allocate nothing on the device (the context's own count)
/// and leave the process's resident memory where the first hundred left it, within 32 MiB:
/// lavapipe and llvmpipe GL grow by nothing, SwiftShader's own pools by about 25 MiB over the
/// first 1,400 forwards, then by about 0.2 KiB a forward (measured); a leak of 40 KiB a
/// forward fails it.
#[test]
fn a_thousand_forwards_at_changing_counts_allocate_nothing() {
    let cfg = MoeConfig { shared_ffn: Some(24), ..MoeConfig::new(48, 40, 8, 2) };
    let max = 64u32;
    for ctx in contexts() {
        let slug = ctx.adapter().slug();
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(41).moe_weights(&cfg)).unwrap();
        let h = u64::from(cfg.route.hidden);
        let xb = ctx.upload("x", &Synth::new(42).uniform((u64::from(max) * h) as usize, 1.0)).unwrap();
        let yb = ctx.zeroed("y", u64::from(max) * h * 4).unwrap();
        let plan = layer.plan(&ctx, layer.io(&xb, &yb, max).unwrap()).unwrap();
        let count = |i: u32| 1 + (i * 37) % max;
        let forward = |i: u32| {
            let mut encoder = ctx.device().create_command_encoder(&Default::default());
            if i.is_multiple_of(2) {
                plan.record(&mut encoder, count(i)).unwrap();
            } else {
                plan.set_live_tokens(&ctx, count(i)).unwrap();
                plan.record_device_count(&mut encoder);
            }
            ctx.submit_and_wait(encoder).unwrap();
        };
        for i in 0..100 {
            forward(i);
        }
        let (allocated, rss) = (ctx.allocations(), resident_bytes());
        for i in 100..1000 {
            forward(i);
        }
        assert_eq!(ctx.allocations(), allocated, "{slug}: device allocations over 900 forwards");
        let grew = resident_bytes().saturating_sub(rss);
        assert!(grew < 32 << 20, "{slug}: resident memory grew {grew} bytes over 900 forwards");
        eprintln!("{slug}: 900 forwards, no device allocation, resident memory +{grew} bytes");
    }
}

/// The process's resident set in bytes (Linux), 0 where it cannot be read.
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()));
    pages.unwrap_or(0) * 4096
}
