//! The whole layer on every adapter: against the CPU reference layer, bit-identical across
//! fused/unfused routing and one-launch/sequential combine, and bad weights.

mod common;

use common::{assert_rows_close, bits, contexts};
use moeflow::kernels::combine::CombineMode;
use moeflow::kernels::dispatch::OverflowPolicy;
use moeflow::kernels::gemm::WeightDtype;
use moeflow::kernels::routing::{Gating, GroupLimit, RouteMode};
use moeflow::layer::{Capacity, MoeConfig, MoeLayer};
use moeflow::reference::layer as reference;
use moeflow::synth::Synth;

fn configs() -> Vec<(&'static str, MoeConfig)> {
    let mixtral = MoeConfig::new(48, 40, 8, 2);
    let deepseek = MoeConfig {
        gating: Gating::Sigmoid,
        bias: true,
        scale: 2.5,
        groups: Some(GroupLimit { n_group: 4, topk_group: 2 }),
        shared_ffn: Some(24),
        weight_dtype: WeightDtype::Bf16,
        ..MoeConfig::new(40, 20, 16, 4)
    };
    let qwen = MoeConfig {
        renormalize: false,
        shared_ffn: Some(36),
        shared_gate: true,
        weight_dtype: WeightDtype::F16,
        ..MoeConfig::new(36, 28, 12, 4)
    };
    let overflow =
        MoeConfig { capacity: Capacity::Bounded { bound: 3, policy: OverflowPolicy::Overflow }, ..mixtral };
    let drop = MoeConfig { capacity: Capacity::Bounded { bound: 3, policy: OverflowPolicy::Drop }, ..qwen };
    vec![
        ("mixtral", mixtral),
        ("deepseek", deepseek),
        ("qwen2", qwen),
        ("bounded-overflow", overflow),
        ("bounded-drop", drop),
    ]
}

#[test]
fn layer_matches_the_reference_layer() {
    for ctx in contexts() {
        for (name, cfg) in configs() {
            let w = Synth::new(1).moe_weights(&cfg);
            let layer = MoeLayer::new(&ctx, cfg, &w).unwrap();
            for tokens in [1usize, 5, 100] {
                let x = Synth::new(tokens as u64).uniform(tokens * cfg.hidden as usize, 1.0);
                let got = layer.forward_host(&ctx, &x).unwrap();
                let (y, idx, wts) = reference::forward(&cfg, &w, &x);
                let what = format!("{} {name} M={tokens}", ctx.adapter().slug());
                assert_eq!(got.indices, idx, "{what}: indices");
                common::assert_close(&format!("{what} weights"), &got.weights, &wts);
                let n = assert_rows_close(&what, &got.y, &y, cfg.hidden as usize);
                eprintln!("{what}: {n}/{} outputs bit-equal to the reference", y.len());
            }
        }
    }
}

#[test]
fn routing_and_combine_variants_are_bit_identical() {
    for ctx in contexts() {
        for (name, cfg) in configs() {
            let w = Synth::new(2).moe_weights(&cfg);
            let x = Synth::new(3).uniform(37 * cfg.hidden as usize, 1.0);
            let base = MoeLayer::new(&ctx, cfg, &w).unwrap().forward_host(&ctx, &x).unwrap();
            for (variant, c) in [
                ("fused routing", MoeConfig { route_mode: RouteMode::Fused { write_logits: false }, ..cfg }),
                (
                    "fused routing with logits",
                    MoeConfig { route_mode: RouteMode::Fused { write_logits: true }, ..cfg },
                ),
                ("sequential combine", MoeConfig { combine: CombineMode::Sequential, ..cfg }),
            ] {
                let other = MoeLayer::new(&ctx, c, &w).unwrap().forward_host(&ctx, &x).unwrap();
                let what = format!("{} {name}: {variant}", ctx.adapter().slug());
                assert_eq!(other.indices, base.indices, "{what}");
                assert_eq!(bits(&other.weights), bits(&base.weights), "{what}");
                assert_eq!(bits(&other.y), bits(&base.y), "{what}");
            }
        }
    }
}

#[test]
fn mismatched_weights_are_an_error_naming_the_tensor() {
    for ctx in contexts() {
        let cfg = MoeConfig { shared_ffn: Some(8), ..MoeConfig::new(16, 12, 4, 2) };
        let good = Synth::new(4).moe_weights(&cfg);
        let mut w = good.clone();
        w.down.pop();
        let err = MoeLayer::new(&ctx, cfg, &w).unwrap_err().to_string();
        assert!(err.contains("`experts down`") && err.contains("[4, 16, 12]"), "{err}");
        let mut w = good.clone();
        w.shared = None;
        let err = MoeLayer::new(&ctx, cfg, &w).unwrap_err().to_string();
        assert!(err.contains("shared"), "{err}");
        let err = MoeLayer::new(&ctx, MoeConfig { bias: true, ..cfg }, &good).unwrap_err().to_string();
        assert!(err.contains("bias"), "{err}");
        let err = MoeLayer::new(&ctx, MoeConfig { k: 5, ..cfg }, &good).unwrap_err().to_string();
        assert!(err.contains("k = 5"), "{err}");
        let layer = MoeLayer::new(&ctx, cfg, &good).unwrap();
        let err = layer.forward_host(&ctx, &[0.0; 15]).unwrap_err().to_string();
        assert!(err.contains("`x`"), "{err}");
    }
}

/// A layer whose projections (routed and shared) are past the device's storage-binding limit
/// runs split, and gives the unsplit layer's bits on the same adapter, at decode and prefill
/// token counts.
#[test]
fn a_layer_past_the_binding_limit_gives_the_unsplit_bits() {
    for adapter in common::wgpu_adapters() {
        let whole = moeflow::Context::from_adapter(&adapter).unwrap();
        for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
            let cfg = MoeConfig {
                shared_ffn: Some(300),
                shared_gate: true,
                weight_dtype: dtype,
                ..MoeConfig::new(64, 96, 8, 2)
            };
            let w = Synth::new(71).moe_weights(&cfg);
            // Two f32 experts (24 KiB each) per chunk; the f32 shared expert (75 KiB) in column runs.
            let limit = 64 << 10;
            let limits = wgpu::Limits { max_storage_buffer_binding_size: limit, ..adapter.limits() };
            let (device, queue) =
                pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                    required_limits: limits,
                    ..Default::default()
                }))
                .unwrap();
            let split = moeflow::Context::from_wgpu(device, queue);
            let (a, b) = (MoeLayer::new(&whole, cfg, &w).unwrap(), MoeLayer::new(&split, cfg, &w).unwrap());
            for tokens in [3usize, 21] {
                let x = Synth::new(72).uniform(tokens * 64, 1.0);
                let (ya, yb) = (a.forward_host(&whole, &x).unwrap(), b.forward_host(&split, &x).unwrap());
                assert_eq!(ya.indices, yb.indices);
                assert_eq!(bits(&ya.y), bits(&yb.y), "{dtype:?}, {tokens} tokens");
            }
        }
    }
}
