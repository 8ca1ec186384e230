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
                ("unfused routing", MoeConfig { route_mode: RouteMode::Unfused, ..cfg }),
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
