//! `MoeLayer::prepare` builds every pipeline a forward can use up front, and the driver
//! pipeline cache persists across devices: saved, loaded on a new device, ignored when its
//! data is not wgpu's.

mod common;

use common::bits;

use moeflow::prelude::*;
use moeflow::synth::Synth;

/// A layer with a shared expert, so every stage has kernels; E=8, k=2: one token takes the
/// decode path, two or more the grouped path.
fn config() -> MoeConfig {
    let mut cfg = MoeConfig::new(64, 96, 8, 2);
    cfg.shared_ffn = Some(32);
    cfg
}

fn x(tokens: usize) -> Vec<f32> {
    Synth::new(7).uniform(tokens * 64, 1.0)
}

#[test]
fn prepare_builds_every_pipeline_a_forward_uses() {
    for adapter in common::wgpu_adapters() {
        // A device of its own: pipelines are counted per context.
        let ctx = Context::from_adapter(&adapter).unwrap();
        let cfg = config();
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(3).moe_weights(&cfg)).unwrap();
        let err = layer.prepare(&ctx, 0).unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
        let report = layer.prepare(&ctx, 40).unwrap();
        eprintln!("{}: {report:?}", ctx.adapter().slug());
        assert!(report.pipelines_built > 0, "prepare built nothing");
        assert_eq!(report.pipelines_total, ctx.pipeline_count());
        assert_eq!(layer.prepare(&ctx, 40).unwrap().pipelines_built, 0, "a second prepare built pipelines");
        for tokens in [1u32, 2, 3, 8, 17, 40] {
            let y = layer.forward_host(&ctx, &x(tokens as usize)).unwrap();
            assert_eq!(y.y.len(), tokens as usize * 64);
            assert_eq!(
                ctx.pipeline_count(),
                report.pipelines_total,
                "{}: a forward of {tokens} tokens built a pipeline that prepare did not",
                ctx.adapter().slug()
            );
        }
    }
}

#[test]
fn the_driver_pipeline_cache_survives_a_new_device_and_ignores_foreign_data() {
    let dir = tempfile::tempdir().unwrap();
    for (i, adapter) in common::wgpu_adapters().iter().enumerate() {
        let path = dir.path().join(format!("adapter{i}/pipelines.bin"));
        let ctx = Context::from_adapter(adapter).unwrap();
        let cfg = config();
        let weights = Synth::new(3).moe_weights(&cfg);
        let slug = ctx.adapter().slug();
        if !ctx.capabilities().pipeline_cache {
            eprintln!("{slug}: no driver pipeline cache (wgpu offers one on Vulkan only)");
            // SAFETY: no file is read on a device without the feature.
            assert!(!unsafe { ctx.load_pipeline_cache(&path) }.unwrap());
            assert!(!ctx.save_pipeline_cache(&path).unwrap());
            assert!(!path.exists());
            continue;
        }
        // No file yet: an empty cache, filled by the builds and saved.
        // SAFETY: the path holds no file, or one save_pipeline_cache wrote.
        assert!(unsafe { ctx.load_pipeline_cache(&path) }.unwrap());
        let layer = MoeLayer::new(&ctx, cfg, &weights).unwrap();
        layer.prepare(&ctx, 17).unwrap();
        let want = layer.forward_host(&ctx, &x(17)).unwrap().y;
        assert!(ctx.save_pipeline_cache(&path).unwrap());
        let saved = std::fs::metadata(&path).unwrap().len();
        eprintln!("{slug}: {saved} bytes of pipeline cache");
        assert!(saved > 0);

        // A new device starts from the saved cache, with the same results.
        let again = Context::from_adapter(adapter).unwrap();
        // SAFETY: the file is the one save_pipeline_cache just wrote.
        assert!(unsafe { again.load_pipeline_cache(&path) }.unwrap());
        let layer = MoeLayer::new(&again, cfg, &weights).unwrap();
        layer.prepare(&again, 17).unwrap();
        assert_eq!(
            bits(&layer.forward_host(&again, &x(17)).unwrap().y),
            bits(&want),
            "{slug}: cached pipelines"
        );

        // Data that is not wgpu's fails its header check and the cache starts empty.
        std::fs::write(&path, vec![0xa5u8; 4096]).unwrap();
        let foreign = Context::from_adapter(adapter).unwrap();
        // SAFETY: wgpu rejects data whose header is not its own before the driver sees it.
        assert!(unsafe { foreign.load_pipeline_cache(&path) }.unwrap());
        let layer = MoeLayer::new(&foreign, cfg, &weights).unwrap();
        assert_eq!(
            bits(&layer.forward_host(&foreign, &x(17)).unwrap().y),
            bits(&want),
            "{slug}: foreign data"
        );

        // A path that cannot be read as a file is an error naming it.
        let folder = dir.path().join(format!("adapter{i}"));
        // SAFETY: reading a folder fails before any data reaches wgpu.
        match unsafe { foreign.load_pipeline_cache(&folder) } {
            Err(Error::Io { path, .. }) => assert!(path.contains(&format!("adapter{i}")), "{path}"),
            other => panic!("{slug}: reading a folder as a cache gave {other:?}"),
        }
    }
}
