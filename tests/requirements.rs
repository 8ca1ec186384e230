//! `MoeConfig::requirements`: a device created with exactly the features and limits it names
//! runs the layer, with the bits of a device with the adapter's full limits; needs past the
//! adapter are errors naming the limit.

mod common;

use common::bits;

use moeflow::prelude::*;
use moeflow::synth::Synth;

#[test]
fn a_device_with_exactly_the_requirements_runs_the_layer_bitwise() {
    let mut shared = MoeConfig::new(64, 96, 8, 2);
    shared.shared_ffn = Some(32);
    let mut bounded = MoeConfig::new(48, 40, 6, 3);
    bounded.capacity =
        Capacity::Bounded { bound: 7, policy: moeflow::kernels::dispatch::OverflowPolicy::Overflow };
    bounded.weight_dtype = WeightDtype::Bf16;
    for adapter in common::wgpu_adapters() {
        let full = Context::from_adapter(&adapter).unwrap();
        let slug = full.adapter().slug();
        for (name, cfg, max_tokens) in [("shared expert", shared, 40u32), ("bounded bf16", bounded, 33)] {
            let req = cfg.requirements(&adapter, max_tokens).unwrap();
            let have = adapter.limits();
            assert!(req.limits.max_storage_buffer_binding_size <= have.max_storage_buffer_binding_size);
            let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("exactly the requirements"),
                required_features: req.features,
                required_limits: req.limits.clone(),
                ..Default::default()
            }))
            .unwrap();
            let small = Context::from_wgpu(device, queue);
            let weights = Synth::new(5).moe_weights(&cfg);
            let on_small = MoeLayer::new(&small, cfg, &weights).unwrap();
            let on_full = MoeLayer::new(&full, cfg, &weights).unwrap();
            on_small.prepare(&small, max_tokens).unwrap();
            for tokens in [1, 2, max_tokens] {
                let x = Synth::new(u64::from(tokens)).uniform((tokens * cfg.route.hidden) as usize, 1.0);
                let want = on_full.forward_host(&full, &x).unwrap().y;
                let got = on_small.forward_host(&small, &x).unwrap().y;
                assert_eq!(bits(&got), bits(&want), "{slug}, {name}, {tokens} tokens");
            }
            eprintln!(
                "{slug}, {name}: storage binding {} B, {} storage buffers, {} B workgroup memory",
                req.limits.max_storage_buffer_binding_size,
                req.limits.max_storage_buffers_per_shader_stage,
                req.limits.max_compute_workgroup_storage_size
            );
        }
    }
}

#[test]
fn needs_past_the_adapter_are_errors_naming_the_limit() {
    for adapter in common::wgpu_adapters() {
        let cfg = MoeConfig::new(4096, 64, 8, 8);
        let err = cfg.requirements(&adapter, 0).unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
        // 2^31 tokens of 4096 values: 32 TiB of x alone.
        let err = cfg.requirements(&adapter, 1 << 31).unwrap_err();
        assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
        assert!(err.to_string().contains("max_storage_buffer_binding_size"), "{err}");
        // Cooperative-matrix kernels need the adapter's cooperative matrices, which no CPU
        // adapter has; where one has them, the device is to be asked for them.
        let mut coop = MoeConfig::new(64, 96, 8, 2);
        let block = moeflow::kernels::gemm::GemmVariant::CoopF16(moeflow::kernels::gemm::CoopBlock::new(
            32, 32, 16, 32,
        ));
        coop.kernels = KernelChoice::Fixed { up: block, down: block };
        let has = adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        match coop.requirements(&adapter, 8) {
            Ok(req) => {
                assert!(has && req.features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX))
            }
            Err(err) => {
                assert!(!has && matches!(err, Error::MissingFeature(_)), "{err}");
                assert!(err.to_string().contains("no cooperative matrices"), "{err}");
            }
        }
    }
}
