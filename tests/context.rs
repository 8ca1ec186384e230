//! Adapter listing and selection on the adapters this machine has.

mod common;

use moeflow::{AdapterSelector, Context, adapters};

#[test]
fn adapters_are_listed_with_features_and_limits() {
    let contexts = common::contexts();
    let listed = adapters();
    assert_eq!(listed.len(), contexts.len(), "one description per adapter");
    for (d, ctx) in listed.iter().zip(&contexts) {
        assert!(["vulkan", "metal", "dx12", "gl"].contains(&d.backend.as_str()), "{d:?}");
        assert!(
            d.limits.max_storage_buffer_binding_size > 0 && d.limits.max_compute_workgroups_per_dimension > 0
        );
        assert_eq!(d.name, ctx.adapter().name);
        // A context enables exactly what the adapter offers of the features moeflow uses.
        assert_eq!(d.capabilities, ctx.capabilities(), "{}", d.slug());
        assert!(d.slug().starts_with(&d.backend));
    }
}

#[test]
fn selectors_pick_the_named_backend_or_say_what_exists() {
    let contexts = common::contexts();
    for ctx in &contexts {
        let backend = ctx.adapter().backend.clone();
        let picked = Context::with_selector(&backend.parse::<AdapterSelector>().unwrap()).unwrap();
        assert_eq!(picked.adapter().backend, backend);
        let by_name = format!("{backend}:{}", ctx.adapter().name.split_whitespace().next().unwrap_or(""));
        let picked = Context::with_selector(&by_name.parse::<AdapterSelector>().unwrap()).unwrap();
        assert_eq!(picked.adapter().backend, backend, "{by_name}");
    }
    if !contexts.is_empty() {
        let err =
            Context::with_selector(&"no-such-adapter-name".parse::<AdapterSelector>().unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("none matches") && msg.contains("found:"), "{msg}");
    }
}

/// A waker that sends on a channel when woken.
struct ChannelWaker(std::sync::Mutex<std::sync::mpsc::Sender<()>>);

impl std::task::Wake for ChannelWaker {
    fn wake(self: std::sync::Arc<Self>) {
        // The test waits on the receiver; a send error only means it is gone already.
        let _ = self.0.lock().map(|tx| tx.send(()));
    }
}

/// Polls `fut` until it is ready, waiting for its waker between polls; the first poll must be
/// pending (the wait runs on a thread of its own, not the polling one).
fn poll_woken<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let waker = std::task::Waker::from(std::sync::Arc::new(ChannelWaker(std::sync::Mutex::new(tx))));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    assert!(fut.as_mut().poll(&mut cx).is_pending(), "{what}: the first poll must not wait");
    loop {
        rx.recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{what}: never woken"));
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// The async waits (device creation, submission, read-back, the tuner, prepare, a layer's host
/// forward) give what the blocking ones give, and never wait on the polling thread: their first
/// poll is pending and they finish when their waker is woken.
#[test]
fn async_waits_give_the_blocking_results_without_blocking_the_poller() {
    // One thread per adapter, so that the adapters' shader compiles (most of this test's time
    // on CPU adapters, whose drivers compile at a pipeline's first dispatch) run side by side.
    let adapters = moeflow::wgpu_adapters();
    std::thread::scope(|s| {
        for adapter in &adapters {
            s.spawn(move || async_waits_on(adapter));
        }
    });
}

/// [`async_waits_give_the_blocking_results_without_blocking_the_poller`] on one adapter.
fn async_waits_on(adapter: &wgpu::Adapter) {
    use moeflow::kernels::gemm::{
        AdapterKind, ExpertFfn, ExpertWeights, FfnKernels, GemmOrder, GemmVariant, TuneOptions, WeightDtype,
        tune_async,
    };
    use moeflow::layer::{MoeConfig, MoeLayer};
    use moeflow::synth::Synth;
    let ctx = pollster::block_on(Context::from_adapter_async(adapter)).unwrap();
    let slug = ctx.adapter().slug();
    assert_eq!(ctx.adapter().name, adapter.get_info().name);
    let data = ctx.upload("data", &[7u32, 8, 9, 10]).unwrap();
    let got: Vec<u32> = poll_woken(&slug, ctx.read_back_async(&data, 3)).unwrap();
    assert_eq!(got, [7, 8, 9], "{slug}");
    poll_woken(&slug, ctx.submit_async(ctx.encoder("empty"))).unwrap();

    let cfg = MoeConfig { shared_ffn: Some(24), ..MoeConfig::new(48, 40, 8, 2) };
    let weights = Synth::new(51).moe_weights(&cfg);
    let layer = pollster::block_on(MoeLayer::new_async(&ctx, cfg, &weights)).unwrap();

    let report = poll_woken(&slug, layer.prepare_async(&ctx, 9)).unwrap();
    assert_eq!(report.pipelines_built, report.pipelines_total, "{slug}: the first prepare builds all");
    // The tuner's timed runs are awaited (no cache: it times every candidate).
    let ew = |d: &[f32], n, k| ExpertWeights::from_f32(&ctx, d, WeightDtype::F32, 8, n, k).unwrap();
    let experts =
        ExpertFfn::new(ew(&weights.gate, 40, 48), ew(&weights.up, 40, 48), ew(&weights.down, 48, 40));
    // The adapter's default (the layer above built it) and a narrow direct block: what is
    // checked is the awaiting, not the choice.
    let default = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict).up;
    let two = vec![default, GemmVariant::Direct(common::narrow_block(16))];
    let opts = TuneOptions { candidates: two, rounds: 1, cache: None, ..TuneOptions::for_context(&ctx) };
    let tuned = poll_woken(&slug, tune_async(&ctx, &experts.unwrap(), GemmOrder::Strict, &opts)).unwrap();
    assert!(!tuned.from_cache, "{slug}");
    assert!(opts.candidates.contains(&tuned.kernels.up), "{slug}: the tuner picks a candidate");
    assert!(tuned.timings.iter().any(|t| t.1.is_finite()), "{slug}: candidates were timed");
    for tokens in [1usize, 9] {
        let x = Synth::new(52).uniform(tokens * 48, 1.0);
        let want = layer.forward_host(&ctx, &x).unwrap();
        let got = poll_woken(&slug, layer.forward_host_async(&ctx, &x)).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.y), bits(&want.y), "{slug}: y of {tokens} tokens");
        assert_eq!(got.indices, want.indices, "{slug}: indices of {tokens} tokens");
        assert_eq!(bits(&got.weights), bits(&want.weights), "{slug}: weights of {tokens} tokens");
    }
    uploads_awaited(&ctx);
}

/// Checkpoint loading awaits its uploads (a safetensors checkpoint with a shared expert, a GGUF
/// file with Q8_0 experts): the first poll is pending, and the layer gives the blocking load's
/// bits.
fn uploads_awaited(ctx: &Context) {
    use moeflow::weights::gguf::{GgmlType, Gguf};
    use moeflow::weights::{
        Checkpoint, LoadOptions, upload_checkpoint_layer, upload_checkpoint_layer_async, upload_gguf_layer,
        upload_gguf_layer_async,
    };
    let slug = ctx.adapter().slug();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let same = |what: &str, a: &moeflow::layer::MoeLayer, b: &moeflow::layer::MoeLayer, h: usize| {
        let x = moeflow::synth::Synth::new(53).uniform(5 * h, 1.0);
        let (a, b) = (a.forward_host(ctx, &x).unwrap(), b.forward_host(ctx, &x).unwrap());
        assert_eq!((bits(&a.y), &a.indices), (bits(&b.y), &b.indices), "{slug}: {what}");
    };

    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2_moe_bf16_t5_norm");
    let config = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let opts = LoadOptions { config: Some(config), ..LoadOptions::default() };
    let ckpt = Checkpoint::open(&dir.join("weights.safetensors")).unwrap();
    let want = upload_checkpoint_layer(ctx, &ckpt, &opts, |c| c).unwrap().layer;
    let what = format!("{slug}: checkpoint upload");
    let got = poll_woken(&what, upload_checkpoint_layer_async(ctx, &ckpt, &opts, |c| c)).unwrap().layer;
    assert!(got.config().shared_ffn.is_some(), "{what}: the fixture has a shared expert");
    same("checkpoint upload", &got, &want, got.config().route.hidden as usize);

    let (h, f, e) = (64u64, 32u64, 4u64);
    let q8 = |n: u64| {
        moeflow::quant::q8_0_quantize(&moeflow::synth::Synth::new(n).uniform((h * f * e) as usize, 1.0))
            .unwrap()
    };
    let router = moeflow::synth::Synth::new(54).uniform((h * e) as usize, 1.0);
    let file = common::qwen2moe_gguf(
        [h, f, e, 2],
        &router,
        [(GgmlType::Q8_0, q8(55)), (GgmlType::Q8_0, q8(56)), (GgmlType::Q8_0, q8(57))],
    );
    let g = Gguf::parse(&file, "layer.gguf").unwrap();
    let opts = LoadOptions::default();
    let want = upload_gguf_layer(ctx, &g, &opts, |c| c).unwrap().layer;
    let what = format!("{slug}: GGUF upload");
    let got = poll_woken(&what, upload_gguf_layer_async(ctx, &g, &opts, |c| c)).unwrap().layer;
    same("GGUF upload", &got, &want, h as usize);
}
