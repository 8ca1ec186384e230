//! The GEMM tuner: it times candidates and picks one per projection, its cache survives a
//! restart (a second call reads the file and times nothing), and a corrupt or stale cache is
//! ignored, never an error or a wrong kernel.

mod common;

use moeflow::kernels::gemm::{
    AdapterKind, ExpertFfn, ExpertWeights, FfnKernels, GemmOrder, GemmVariant, LaneBlock,
    TUNE_DEFAULT_MARGIN, TileBlock, TuneOptions, WeightDtype, tune,
};
use moeflow::layer::{KernelChoice, MoeConfig, MoeLayer};
use moeflow::synth::Synth;

fn small_candidates() -> Vec<GemmVariant> {
    vec![
        GemmVariant::Direct(LaneBlock::new(4, 2, 8)),
        GemmVariant::Direct(LaneBlock::new(8, 4, 8)),
        GemmVariant::Tile(TileBlock::tiled(2)),
    ]
}

#[test]
fn the_tuner_picks_a_candidate_and_its_cache_survives_a_restart() {
    for ctx in common::contexts() {
        let what = ctx.adapter().slug();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("tune.json");
        let w = |n: u32, k: u32| {
            let data = Synth::new(u64::from(n * k)).uniform((2 * n * k) as usize, 0.1);
            ExpertWeights::from_f32(&ctx, &data, WeightDtype::F32, 2, n, k).unwrap()
        };
        let ffn = ExpertFfn::new(w(48, 64), w(48, 64), w(64, 48)).unwrap();
        let opts =
            TuneOptions { candidates: small_candidates(), rows: 32, rounds: 3, cache: Some(path.clone()) };
        let first = tune(&ctx, &ffn, GemmOrder::Fast, &opts).unwrap();
        assert!(!first.from_cache, "{what}: nothing cached yet");
        assert_eq!(first.timings.len(), 3, "{what}: every candidate timed");
        assert!(first.timings.iter().all(|t| t.1 > 0.0 && t.2 > 0.0), "{what}: {:?}", first.timings);
        assert!(
            small_candidates().contains(&first.kernels.up)
                && small_candidates().contains(&first.kernels.down)
        );
        assert_eq!(first.kernels.order, GemmOrder::Fast);
        // A restart: nothing in memory, the file decides.
        let again = tune(&ctx, &ffn, GemmOrder::Fast, &opts).unwrap();
        assert!(again.from_cache, "{what}: the second call reads the cache");
        assert_eq!(again.kernels, first.kernels);
        // Another order is another key.
        assert!(!tune(&ctx, &ffn, GemmOrder::Strict, &opts).unwrap().from_cache);
        // A corrupt file is ignored (and rewritten), never an error.
        std::fs::write(&path, b"{ this is not json").unwrap();
        let fresh = tune(&ctx, &ffn, GemmOrder::Fast, &opts).unwrap();
        assert!(!fresh.from_cache, "{what}: a corrupt cache is ignored");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok(), "{what}: the cache was rewritten");
        // A stale entry naming a variant that is no candidate is ignored, not run. Every
        // entry is doctored to name one (whichever candidates the timings above picked).
        let mut doctored: serde_json::Value = serde_json::from_str(&text).unwrap();
        let stale = serde_json::to_value(GemmVariant::Direct(LaneBlock::new(2, 2, 8))).unwrap();
        for entry in doctored["entries"].as_object_mut().unwrap().values_mut() {
            entry["up"] = stale.clone();
            entry["down"] = stale.clone();
        }
        std::fs::write(&path, doctored.to_string()).unwrap();
        let only_tiled =
            TuneOptions { candidates: vec![GemmVariant::Tile(TileBlock::tiled(2))], ..opts.clone() };
        let t = tune(&ctx, &ffn, GemmOrder::Fast, &only_tiled).unwrap();
        assert_eq!(
            t.kernels.up,
            GemmVariant::Tile(TileBlock::tiled(2)),
            "{what}: only candidates are chosen"
        );
        assert!(!t.from_cache);
        // No candidates: an error, not a panic.
        let none = TuneOptions { candidates: Vec::new(), cache: None, ..opts };
        assert!(
            tune(&ctx, &ffn, GemmOrder::Fast, &none)
                .unwrap_err()
                .to_string()
                .contains("at least one candidate")
        );
    }
}

#[test]
fn a_tuned_layer_runs_the_cached_choice_and_gives_the_default_bits() {
    let ctxs = common::contexts();
    let Some(ctx) = ctxs.first() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tune.json");
    let cfg = MoeConfig { gemm_order: GemmOrder::Fast, ..MoeConfig::new(32, 24, 4, 2) };
    let w = Synth::new(4).moe_weights(&cfg);
    // Seed the cache with the tuner's own file for this layer's experts (small candidates),
    // then make the layer with `Tuned`: it must find the entry, time nothing, and give the
    // default kernels' bits.
    let experts = {
        let ew = |d: &[f32], n, k| ExpertWeights::from_f32(ctx, d, WeightDtype::F32, 4, n, k).unwrap();
        ExpertFfn::new(ew(&w.gate, 24, 32), ew(&w.up, 24, 32), ew(&w.down, 32, 24)).unwrap()
    };
    // The cache key of this layer's experts (nothing written), then an entry under it that
    // names the first of the adapter's candidates.
    let probe = TuneOptions {
        candidates: small_candidates(),
        rounds: 1,
        cache: None,
        ..TuneOptions::for_context(ctx)
    };
    let key = tune(ctx, &experts, GemmOrder::Fast, &probe).unwrap().key;
    assert_eq!((key.rows, key.order, key.experts), (probe.rows, GemmOrder::Fast, 4), "{key}");
    let key = key.to_string();
    let choice =
        moeflow::kernels::gemm::candidates(moeflow::kernels::gemm::AdapterKind::of(ctx.adapter()))[0];
    let entry = serde_json::json!({"up": choice, "down": choice, "timings": []});
    std::fs::write(&path, serde_json::json!({"entries": {key.clone(): entry.clone()}}).to_string()).unwrap();
    // SAFETY: this test binary sets the variable in this one test only, before any tuning reads it.
    unsafe { std::env::set_var("MOEFLOW_TUNE_CACHE", &path) };
    let x = Synth::new(5).uniform(40 * 32, 1.0);
    let tuned = MoeLayer::new(ctx, MoeConfig { kernels: KernelChoice::Tuned, ..cfg }, &w).unwrap();
    let default = MoeLayer::new(ctx, cfg, &w).unwrap();
    let (a, b) = (tuned.forward_host(ctx, &x).unwrap(), default.forward_host(ctx, &x).unwrap());
    assert_eq!(common::bits(&a.y), common::bits(&b.y), "tuned and default kernels give the same bits");
    assert_eq!(tuned.dispatch_tile(ctx), choice.block_rows(), "the tuned layer runs the cached choice");
    // TunedFor { tokens: 256 } tunes on 256 * 2 / 4 = 128 rows per expert: its own cache key,
    // whose entry names the candidate of the most block rows (not the first one's).
    let rows = cfg.expected_rows_per_expert(256);
    assert_eq!(rows, 128);
    let key128 =
        tune(ctx, &experts, GemmOrder::Fast, &TuneOptions { rows, ..probe }).unwrap().key.to_string();
    assert_ne!(key128, key, "the rows are part of the cache key");
    let kind = moeflow::kernels::gemm::AdapterKind::of(ctx.adapter());
    let tallest =
        moeflow::kernels::gemm::candidates(kind).into_iter().max_by_key(|v| v.block_rows()).unwrap();
    assert_ne!(tallest.block_rows(), choice.block_rows());
    let tall = serde_json::json!({"up": tallest, "down": tallest, "timings": []});
    std::fs::write(&path, serde_json::json!({"entries": {key: entry, key128: tall}}).to_string()).unwrap();
    let tuned_for = MoeConfig { kernels: KernelChoice::TunedFor { tokens: 256 }, ..cfg };
    let long = MoeLayer::new(ctx, tuned_for, &w).unwrap();
    assert_eq!(long.dispatch_tile(ctx), tallest.block_rows(), "TunedFor ran the choice for its rows");
    let c = long.forward_host(ctx, &x).unwrap();
    assert_eq!(common::bits(&c.y), common::bits(&b.y), "kernels tuned for long prefills give the same bits");
    let zero = MoeConfig { kernels: KernelChoice::TunedFor { tokens: 0 }, ..cfg };
    let err = MoeLayer::new(ctx, zero, &w).unwrap_err().to_string();
    assert!(err.contains("TunedFor needs at least 1 token"), "{err}");
}

#[test]
fn the_default_stays_unless_a_candidate_beats_it_by_the_margin() {
    for ctx in common::contexts() {
        let what = ctx.adapter().slug();
        let w = |n: u32, k: u32| {
            let data = Synth::new(u64::from(n + k)).uniform((2 * n * k) as usize, 0.1);
            ExpertWeights::from_f32(&ctx, &data, WeightDtype::F32, 2, n, k).unwrap()
        };
        let ffn = ExpertFfn::new(w(40, 48), w(40, 48), w(48, 40)).unwrap();
        let default = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Fast);
        let mut candidates = small_candidates();
        candidates.extend([default.up, default.down]);
        let opts = TuneOptions { candidates, rows: 16, rounds: 3, cache: None };
        let t = tune(&ctx, &ffn, GemmOrder::Fast, &opts).unwrap();
        for (chosen, fixed, time) in [
            (t.kernels.up, default.up, (|x: &(GemmVariant, f64, f64)| x.1) as fn(&_) -> f64),
            (t.kernels.down, default.down, |x: &(GemmVariant, f64, f64)| x.2),
        ] {
            let of = |v: GemmVariant| t.timings.iter().find(|x| x.0 == v).map(time).unwrap();
            let fastest = t.timings.iter().map(time).fold(f64::INFINITY, f64::min);
            if chosen == fixed {
                assert!(fastest * (1.0 + TUNE_DEFAULT_MARGIN) >= of(fixed), "{what}: {:?}", t.timings);
            } else {
                assert_eq!(of(chosen), fastest, "{what}: {:?}", t.timings);
                assert!(of(chosen) * (1.0 + TUNE_DEFAULT_MARGIN) < of(fixed), "{what}: {:?}", t.timings);
            }
        }
    }
}
