//! The `moe_layer` example as a user runs it: with no arguments, and on small safetensors
//! models written with each naming scheme (Mixtral, Qwen2-MoE, OLMoE, DeepSeek-V3), checked
//! against the CPU reference layer; sharded, memory-mapped checkpoints and GGUF files through
//! the library and the CLI. Also the loader's errors for missing or mis-shaped tensors and broken checkpoints.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use moeflow::kernels::gemm::{Activation, WeightDtype};
use moeflow::kernels::routing::{Gating, GroupLimit, RouteConfig};
use moeflow::layer::{ExpertBiasValues, MoeConfig, MoeLayer, MoeWeights};
use moeflow::reference::layer as reference;
use moeflow::synth::Synth;
use moeflow::weights::{
    Checkpoint, Family, LoadOptions, LoadedLayer, RoutingFlags, load_checkpoint_layer, load_layer,
    upload_checkpoint_layer,
};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

/// The `moe_layer` example binary.
fn example() -> PathBuf {
    example_named("moe_layer")
}

/// An example binary, built by `cargo test` next to this test's directory.
fn example_named(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target profile directory");
    dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moeflow-example-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// The 32-bit words (f32 or u32, little-endian) of tensor `name` in a file the example wrote.
fn words<'a>(st: &'a SafeTensors<'_>, name: &str) -> impl Iterator<Item = u32> + 'a {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    assert_eq!(t.dtype().bitsize(), 32, "tensor {name}");
    let data = t.data();
    data.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F16 => values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
        Dtype::BF16 => values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn write(path: &Path, tensors: Vec<NamedTensor>, dtype: Dtype) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, encode(&v, dtype))).collect();
    let views: Vec<(String, TensorView<'_>)> =
        bytes.iter().map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// Runs the example on every adapter with `--weights weights`, `extra` arguments and
/// `dir/x.safetensors` as input: it must succeed and print each of `expect`, route exactly as
/// `ridx`, and give outputs within the bound of `ry` (rows of `h`).
fn example_matches_reference(
    dir: &Path,
    weights: &Path,
    extra: &[&std::ffi::OsStr],
    expect: &[&str],
    (ry, ridx): (&[f32], &[u32]),
    h: usize,
) {
    for adapter in common::wgpu_adapters() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        let out = Command::new(example())
            .arg("--weights")
            .arg(weights)
            .args(extra)
            .arg("--input")
            .arg(dir.join("x.safetensors"))
            .arg("--output")
            .arg(dir.join("y.safetensors"))
            .args(["--adapter", &backend])
            .output()
            .expect("running the example");
        let what = format!("{} {backend}", weights.display());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for e in expect {
            assert!(stdout.contains(e), "{what}: `{e}` not in {stdout}");
        }
        let bytes = std::fs::read(dir.join("y.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let y = words(&st, "output").map(f32::from_bits).collect::<Vec<_>>();
        assert_eq!(words(&st, "topk_indices").collect::<Vec<_>>(), ridx, "{what}: routing");
        common::assert_rows_close(&what, &y, ry, h);
    }
}

/// `base` routed as DeepSeek-V3 (sigmoid scores, a selection bias, 4 groups of which 2 are
/// kept, renormalised, × 2.5) with one shared expert of `base.ffn`.
fn deepseek_v3(base: MoeConfig) -> MoeConfig {
    MoeConfig {
        route: RouteConfig {
            gating: Gating::Sigmoid,
            bias: true,
            scale: 2.5,
            groups: Some(GroupLimit { n_group: 4, topk_group: 2 }),
            ..base.route
        },
        shared_ffn: Some(base.ffn),
        ..base
    }
}

/// A tensor to write: name, shape, values.
type NamedTensor = (String, Vec<usize>, Vec<f32>);

#[derive(Clone, Copy, Debug)]
enum Scheme {
    Mixtral,
    Qwen2,
    Olmoe,
    DeepSeek,
}

/// Tensors of one layer under `prefix` with `scheme`'s names.
fn tensors(scheme: Scheme, prefix: &str, cfg: &MoeConfig, w: &MoeWeights) -> Vec<NamedTensor> {
    let (h, f, e) = (cfg.route.hidden as usize, cfg.ffn as usize, cfg.route.experts as usize);
    let mut out = Vec::new();
    let router = match scheme {
        Scheme::Mixtral => "block_sparse_moe.gate.weight",
        _ => "mlp.gate.weight",
    };
    out.push((format!("{prefix}{router}"), vec![e, h], w.router.clone()));
    for i in 0..e {
        let names = match scheme {
            Scheme::Mixtral => {
                ["w1", "w3", "w2"].map(|p| format!("{prefix}block_sparse_moe.experts.{i}.{p}.weight"))
            }
            _ => ["gate_proj", "up_proj", "down_proj"].map(|p| format!("{prefix}mlp.experts.{i}.{p}.weight")),
        };
        let [g, u, d] = names;
        out.push((g, vec![f, h], w.gate[i * f * h..(i + 1) * f * h].to_vec()));
        out.push((u, vec![f, h], w.up[i * f * h..(i + 1) * f * h].to_vec()));
        out.push((d, vec![h, f], w.down[i * h * f..(i + 1) * h * f].to_vec()));
    }
    if let Some(b) = &w.bias {
        out.push((format!("{prefix}mlp.gate.e_score_correction_bias"), vec![e], b.clone()));
    }
    if let Some((g, u, d)) = &w.shared {
        let base = match scheme {
            Scheme::DeepSeek => "mlp.shared_experts.",
            _ => "mlp.shared_expert.",
        };
        let fs = g.len() / h;
        out.push((format!("{prefix}{base}gate_proj.weight"), vec![fs, h], g.clone()));
        out.push((format!("{prefix}{base}up_proj.weight"), vec![fs, h], u.clone()));
        out.push((format!("{prefix}{base}down_proj.weight"), vec![h, fs], d.clone()));
    }
    if let Some(g) = &w.shared_gate {
        out.push((format!("{prefix}mlp.shared_expert_gate.weight"), vec![1, h], g.clone()));
    }
    out
}

fn case(scheme: Scheme) -> (MoeConfig, Dtype, Option<serde_json::Value>, Vec<&'static str>) {
    let base = MoeConfig::new(32, 24, 8, 2);
    match scheme {
        Scheme::Mixtral => (base, Dtype::F32, None, vec!["--k", "2"]),
        Scheme::Qwen2 => (
            MoeConfig {
                route: RouteConfig { renormalize: false, ..base.route },
                shared_ffn: Some(40),
                shared_gate: true,
                weight_dtype: WeightDtype::Bf16,
                ..base
            },
            Dtype::BF16,
            Some(
                serde_json::json!({"model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false}),
            ),
            vec![],
        ),
        Scheme::Olmoe => (
            MoeConfig {
                route: RouteConfig { renormalize: false, ..base.route },
                weight_dtype: WeightDtype::F16,
                ..base
            },
            Dtype::F16,
            Some(
                serde_json::json!({"model_type": "olmoe", "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false}),
            ),
            vec![],
        ),
        Scheme::DeepSeek => (
            MoeConfig {
                route: RouteConfig {
                    k: 3,
                    gating: Gating::Sigmoid,
                    bias: true,
                    scale: 2.5,
                    groups: Some(GroupLimit { n_group: 4, topk_group: 2 }),
                    ..base.route
                },
                shared_ffn: Some(24),
                ..base
            },
            Dtype::F32,
            Some(serde_json::json!({
                "model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 3, "scoring_func": "sigmoid",
                "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": true
            })),
            vec![],
        ),
    }
}

#[test]
fn example_runs_a_users_layer_for_every_naming_scheme() {
    let adapters = common::wgpu_adapters();
    if adapters.is_empty() {
        return;
    }
    for scheme in [Scheme::Mixtral, Scheme::Qwen2, Scheme::Olmoe, Scheme::DeepSeek] {
        let dir = scratch(&format!("{scheme:?}"));
        let (cfg, file_dtype, config, extra) = case(scheme);
        let mut w = Synth::new(7).moe_weights(&cfg);
        // What the file holds is what the layer sees: round to the file's dtype first.
        // A file's float dtype rounds value by value (rows of one).
        let r = |v: &mut Vec<f32>| *v = cfg.weight_dtype.round(v, 1).expect("a float dtype");
        for v in [&mut w.gate, &mut w.up, &mut w.down, &mut w.router] {
            r(v);
        }
        if let Some(b) = w.bias.as_mut() {
            r(b);
        }
        if let Some((g, u, d)) = w.shared.as_mut() {
            r(g);
            r(u);
            r(d);
        }
        if let Some(g) = w.shared_gate.as_mut() {
            r(g);
        }
        let prefix = "model.layers.3.";
        write(&dir.join("w.safetensors"), tensors(scheme, prefix, &cfg, &w), file_dtype);
        let tokens = 11usize;
        let x = Synth::new(8).uniform(tokens * cfg.route.hidden as usize, 1.0);
        write(
            &dir.join("x.safetensors"),
            vec![("x".into(), vec![tokens, cfg.route.hidden as usize], x.clone())],
            Dtype::F32,
        );
        let mut cmd = Command::new(example());
        cmd.arg("--weights").arg(dir.join("w.safetensors"));
        cmd.arg("--input").arg(dir.join("x.safetensors"));
        cmd.arg("--output").arg(dir.join("y.safetensors"));
        cmd.args(&extra);
        if let Some(c) = &config {
            std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
            cmd.arg("--config").arg(dir.join("config.json"));
        }
        if matches!(scheme, Scheme::Olmoe) {
            // The adapter flag, naming the last adapter's backend (GL where it is listed).
            let backend = format!("{:?}", adapters[adapters.len() - 1].get_info().backend).to_lowercase();
            cmd.args(["--adapter", &backend, "--prefix", prefix]);
        }
        let out = cmd.output().expect("running the example");
        assert!(
            out.status.success(),
            "{scheme:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes = std::fs::read(dir.join("y.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let y = words(&st, "output").map(f32::from_bits).collect::<Vec<_>>();
        let idx = words(&st, "topk_indices").collect::<Vec<_>>();
        assert_eq!(st.tensor("topk_weights").unwrap().shape(), &[tokens, cfg.route.k as usize]);
        let counts = st.tensor("expert_counts").unwrap();
        assert_eq!(counts.shape(), &[cfg.route.experts as usize]);
        let (ry, ridx, _) = reference::forward(&cfg, &w, &x).unwrap();
        assert_eq!(idx, ridx, "{scheme:?}: routing");
        common::assert_rows_close(&format!("{scheme:?}"), &y, &ry, cfg.route.hidden as usize);
        if matches!(scheme, Scheme::Mixtral) {
            // An empty batch (x of shape [0, H], as a serving loop meets): empty outputs.
            let h = cfg.route.hidden as usize;
            write(&dir.join("x.safetensors"), vec![("x".into(), vec![0, h], Vec::new())], Dtype::F32);
            let out = cmd.output().expect("running the example");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "empty batch: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(stdout.contains("(0 tokens, 1 layer(s))"), "{stdout}");
            let bytes = std::fs::read(dir.join("y.safetensors")).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(st.tensor("output").unwrap().shape(), &[0, h]);
            assert_eq!(st.tensor("topk_indices").unwrap().shape(), &[0, cfg.route.k as usize]);
            assert!(words(&st, "expert_counts").all(|c| c == 0), "empty batch: expert counts");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn example_runs_without_arguments() {
    if common::wgpu_adapters().is_empty() {
        return;
    }
    // As on a fresh machine: no XDG_RUNTIME_DIR, and no loader complaint about it on either
    // stream.
    let out = Command::new(example()).env_remove("XDG_RUNTIME_DIR").output().expect("running the example");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for needle in ["adapter:", "per-stage GPU time", "tokens/s", "expert load", "result: PASS"] {
        assert!(stdout.contains(needle), "missing `{needle}` in:\n{stdout}");
    }
    assert!(!stderr.contains("XDG_RUNTIME_DIR") && !stdout.contains("XDG_RUNTIME_DIR"), "{stderr}");
}

/// `--tokens` takes several counts: one layer, each count planned, timed and checked in turn
/// (decode, a few tokens, a prefill), one PASS over all; a zero count is refused by name.
#[test]
fn example_runs_several_token_counts_on_one_layer() {
    for adapter in common::wgpu_adapters() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        let run = |tokens: &str| {
            Command::new(example())
                .args(["--adapter", &backend, "--tokens", tokens, "--hidden", "64", "--ffn", "48"])
                .args(["--experts", "8", "--k", "2", "--shared-ffn", "0", "--dtype", "bf16"])
                .output()
                .expect("running the example")
        };
        let out = run("1,7,70");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{backend}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("synthetic layer: M=1,7,70,"), "{backend}: {stdout}");
        for (count, checked) in [(1, 1), (7, 7), (70, 32)] {
            assert!(stdout.contains(&format!("M={count}:\n")), "{backend}: no block for {count}:\n{stdout}");
            assert!(
                stdout.contains(&format!("check against the CPU reference on {checked} tokens")),
                "{backend}: {count} tokens not checked:\n{stdout}"
            );
        }
        assert_eq!(stdout.matches("routing equal").count(), 3, "{backend}: {stdout}");
        assert!(stdout.contains("result: PASS"), "{backend}: {stdout}");
        let out = run("4,0");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{backend}: a zero count ran");
        assert!(stderr.contains("--tokens: every count must be at least 1"), "{backend}: {stderr}");
    }
}

/// `--dtype` takes every quantised format: the synthetic layer quantises its weights and the
/// check against the CPU reference (on the quantised values) passes. Each format runs on one
/// adapter, the formats spread over the adapters found (every format on every adapter with
/// `MOEFLOW_FULL_SWEEPS=1`): the kernels of each format run on every adapter in tests/gemm.rs
/// and tests/layer.rs; here it is the command line's path that is checked.
#[test]
fn example_runs_every_quantised_dtype() {
    let adapters = common::wgpu_adapters();
    for (a, adapter) in adapters.iter().enumerate() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        let dtypes = ["q8_0", "q4_0", "mxfp4", "fp8"];
        let mine = (0..dtypes.len()).filter(|i| common::full_sweeps() || i % adapters.len() == a);
        for dtype in mine.map(|i| dtypes[i]) {
            let out = Command::new(example())
                .args(["--adapter", &backend, "--dtype", dtype, "--tokens", "19", "--hidden", "96"])
                .args(["--ffn", "80", "--experts", "8", "--k", "2", "--shared-ffn", "48"])
                .output()
                .expect("running the example");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{backend} {dtype}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains("result: PASS"), "{backend} {dtype}: {stdout}");
        }
    }
}

#[test]
fn dag_example_runs_every_executor_on_every_adapter() {
    for adapter in common::wgpu_adapters() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        let out = Command::new(example_named("dag"))
            .args(["--adapter", &backend, "--rows", "8", "--cols", "160", "--workers", "3", "--runs", "2"])
            .output()
            .expect("running the dag example");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for needle in
            ["queue probe:", "plan Neighbours:", "staged vs CPU oracle", "fused (3 passes)", "result: PASS"]
        {
            assert!(stdout.contains(needle), "missing `{needle}` in:\n{stdout}");
        }
    }
}

#[test]
fn dag_example_runs_the_moe_layer_on_every_executor() {
    for adapter in common::wgpu_adapters() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        let out = Command::new(example_named("dag"))
            .args(["--adapter", &backend, "--moe", "--tokens", "9", "--hidden", "32", "--ffn", "48"])
            .args(["--experts", "6", "--k", "2", "--shared-ffn", "16", "--workers", "2", "--runs", "1"])
            .output()
            .expect("running the dag example");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for needle in ["MoE layer: M=9", "Staged", "passes: [route]", "identical to MoeLayer", "result: PASS"]
        {
            assert!(stdout.contains(needle), "missing `{needle}` in:\n{stdout}");
        }
        assert!(!stdout.contains("DIFFERENT"), "{stdout}");
        // Where the probe allows a queue, it runs the layer as MoE tasks.
        // (or says why the layer has no task form on this device), with the two workers asked
        // for or the probe's bound if lower (a busy machine can lower it to 1).
        if let Some(bound) = stdout.split("queue probe: Allowed { max_workers: ").nth(1) {
            let max: u32 = bound.split(' ').next().and_then(|n| n.parse().ok()).expect("the probe's bound");
            assert!(stdout.contains(&format!("Queue({} workers", max.min(2))), "{stdout}");
            for tasks in ["fine tasks: ", "coarse tasks: "] {
                assert!(stdout.contains(tasks) || stdout.contains("no task form"), "{stdout}");
            }
        }
    }
}

#[test]
fn loader_errors_name_the_tensor_and_its_expected_shape() {
    let cfg = MoeConfig::new(16, 12, 4, 2);
    let w = Synth::new(1).moe_weights(&cfg);
    let dir = scratch("loader");
    let mut t = tensors(Scheme::Mixtral, "", &cfg, &w);
    t.retain(|(n, _, _)| n != "block_sparse_moe.experts.2.w3.weight");
    write(&dir.join("missing.safetensors"), t, Dtype::F32);
    let opts = LoadOptions {
        routing: RoutingFlags { k: Some(2), ..RoutingFlags::default() },
        ..LoadOptions::default()
    };
    let err = load_layer(&std::fs::read(dir.join("missing.safetensors")).unwrap(), "missing", &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("block_sparse_moe.experts.2.w3.weight") && err.contains("[12, 16]"), "{err}");
    let mut t = tensors(Scheme::Olmoe, "", &cfg, &w);
    for (n, s, v) in t.iter_mut() {
        if n == "mlp.experts.1.down_proj.weight" {
            *s = vec![12, 16];
            v.truncate(12 * 16);
        }
    }
    write(&dir.join("shape.safetensors"), t, Dtype::F32);
    let err = load_layer(&std::fs::read(dir.join("shape.safetensors")).unwrap(), "shape", &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("mlp.experts.1.down_proj.weight") && err.contains("[16, 12]"), "{err}");
    write(&dir.join("good.safetensors"), tensors(Scheme::Olmoe, "", &cfg, &w), Dtype::F32);
    let good = std::fs::read(dir.join("good.safetensors")).unwrap();
    let err = load_layer(&good, "good", &LoadOptions::default()).unwrap_err().to_string();
    assert!(err.contains("fit several families"), "{err}");
    let err = load_layer(&good, "good", &opts).unwrap_err().to_string();
    assert!(err.contains("fit several families"), "{err}");
    let olmoe = RoutingFlags { family: Some(Family::Olmoe), ..opts.routing.clone() };
    let err = load_layer(&good, "good", &LoadOptions { routing: olmoe.clone(), ..LoadOptions::default() })
        .unwrap_err()
        .to_string();
    assert!(err.contains("depends on norm_topk_prob"), "{err}");
    let routing = RoutingFlags { norm_topk_prob: Some(true), ..olmoe };
    assert!(load_layer(&good, "good", &LoadOptions { routing, ..LoadOptions::default() }).is_ok());
    std::fs::remove_dir_all(&dir).ok();
}

/// A two-layer OLMoE-named checkpoint in three f16 shards with an index, plus tensors that are
/// not the MoE block's; layer 1's experts straddle shards 2 and 3. Returns the directory, the
/// config, and each layer's weights (rounded to f16).
fn sharded(name: &str) -> (PathBuf, MoeConfig, serde_json::Value, [MoeWeights; 2]) {
    let dir = scratch(name);
    let cfg = MoeConfig {
        route: RouteConfig { renormalize: false, ..MoeConfig::new(32, 24, 8, 2).route },
        weight_dtype: WeightDtype::F16,
        ..MoeConfig::new(32, 24, 8, 2)
    };
    let config = serde_json::json!({
        "model_type": "olmoe", "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false,
        "hidden_size": 32, "num_hidden_layers": 2, "rope_theta": 10000.0
    });
    let layer = |seed| {
        let mut w = Synth::new(seed).moe_weights(&cfg);
        for v in [&mut w.gate, &mut w.up, &mut w.down, &mut w.router] {
            *v = cfg.weight_dtype.round(v, 1).expect("a float dtype");
        }
        w
    };
    let ws = [layer(11), layer(12)];
    let other = |n: &str| (n.to_string(), vec![4, 32], vec![0.5f32; 128]);
    let l0 = tensors(Scheme::Olmoe, "model.layers.0.", &cfg, &ws[0]);
    let mut l1 = tensors(Scheme::Olmoe, "model.layers.1.", &cfg, &ws[1]);
    let l1b = l1.split_off(l1.len() / 2);
    let mut shards = vec![l0, l1, l1b];
    shards[0].push(other("model.embed_tokens.weight"));
    shards[0].push(other("model.layers.0.self_attn.q_proj.weight"));
    shards[2].push(other("lm_head.weight"));
    write_shards(&dir, shards, Dtype::F16);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    (dir, cfg, config, ws)
}

/// Writes `shards` as `model-0000i-of-0000n.safetensors` with a `model.safetensors.index.json`.
fn write_shards(dir: &Path, shards: Vec<Vec<NamedTensor>>, dtype: Dtype) {
    let count = shards.len();
    let mut map = serde_json::Map::new();
    for (i, s) in shards.into_iter().enumerate() {
        let file = format!("model-{:05}-of-{count:05}.safetensors", i + 1);
        for (n, _, _) in &s {
            map.insert(n.clone(), file.clone().into());
        }
        write(&dir.join(&file), s, dtype);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// For every naming scheme: a two-layer checkpoint in four shards (tensors dealt round-robin,
/// so each layer spans every shard) loads each layer exactly as the same tensors in one file.
#[test]
fn every_naming_scheme_loads_the_same_from_shards_as_from_one_file() {
    for scheme in [Scheme::Mixtral, Scheme::Qwen2, Scheme::Olmoe, Scheme::DeepSeek] {
        let dir = scratch(&format!("schemes-{scheme:?}"));
        let (cfg, dtype, config, _) = case(scheme);
        let config = config.unwrap_or_else(
            || serde_json::json!({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}),
        );
        let mut all = Vec::new();
        for (l, seed) in [(0, 21), (1, 22)] {
            let w = Synth::new(seed).moe_weights(&cfg);
            all.extend(tensors(scheme, &format!("model.layers.{l}."), &cfg, &w));
        }
        write(&dir.join("one.safetensors"), all.clone(), dtype);
        let sharded = dir.join("sharded");
        std::fs::create_dir_all(&sharded).unwrap();
        let mut shards = vec![Vec::new(); 4];
        for (i, t) in all.into_iter().enumerate() {
            shards[i % 4].push(t);
        }
        write_shards(&sharded, shards, dtype);
        let (one, many) =
            (Checkpoint::open(&dir.join("one.safetensors")).unwrap(), Checkpoint::open(&sharded).unwrap());
        assert_eq!(many.moe_layers(), one.moe_layers(), "{scheme:?}");
        for l in 0..2 {
            let module = match scheme {
                Scheme::Mixtral => "block_sparse_moe.",
                _ => "mlp.",
            };
            for (prefix, layer) in [(None, Some(l)), (Some(format!("model.layers.{l}.{module}")), None)] {
                let opts =
                    LoadOptions { prefix, layer, config: Some(config.clone()), ..LoadOptions::default() };
                let a = load_checkpoint_layer(&one, &opts).unwrap();
                let b = load_checkpoint_layer(&many, &opts).unwrap();
                assert_eq!(b.prefix, format!("model.layers.{l}."));
                assert_eq!(a.config, b.config, "{scheme:?}");
                assert_eq!(a.config.shared_ffn, cfg.shared_ffn, "{scheme:?}");
                assert!(a.weights == b.weights, "{scheme:?} layer {l}: weights differ");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

fn same_layer(a: &LoadedLayer, cfg: &MoeConfig, w: &MoeWeights) {
    assert_eq!(a.config.to_string(), cfg.to_string());
    assert_eq!(a.config.weight_dtype, WeightDtype::F16);
    for (got, want) in [
        (&a.weights.router, &w.router),
        (&a.weights.gate, &w.gate),
        (&a.weights.up, &w.up),
        (&a.weights.down, &w.down),
    ] {
        // Raw bits, NaN payloads included: a load copies the stored values and computes
        // nothing, so the bit-identity contract's NaN allowance does not apply.
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn sharded_checkpoints_load_by_index_directory_prefix_or_layer() {
    let (dir, cfg, config, ws) = sharded("sharded");
    let opts = |prefix: Option<&str>, layer| LoadOptions {
        prefix: prefix.map(str::to_string),
        layer,
        config: Some(config.clone()),
        ..LoadOptions::default()
    };
    for root in [dir.clone(), dir.join("model.safetensors.index.json")] {
        let ckpt = Checkpoint::open(&root).unwrap();
        assert_eq!(ckpt.moe_layers().keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(
            ckpt.files().iter().filter(|p| p.extension().is_some_and(|e| e == "safetensors")).count(),
            3
        );
        for (l, w) in ws.iter().enumerate() {
            let by_layer = load_checkpoint_layer(&ckpt, &opts(None, Some(l))).unwrap();
            assert_eq!(by_layer.prefix, format!("model.layers.{l}."));
            same_layer(&by_layer, &cfg, w);
            for p in [format!("model.layers.{l}."), format!("model.layers.{l}.mlp.")] {
                same_layer(&load_checkpoint_layer(&ckpt, &opts(Some(&p), None)).unwrap(), &cfg, w);
            }
        }
        let err = load_checkpoint_layer(&ckpt, &opts(None, None)).unwrap_err().to_string();
        assert!(err.contains("several MoE layers") && err.contains("--layer"), "{err}");
        let err = load_checkpoint_layer(&ckpt, &opts(None, Some(5))).unwrap_err().to_string();
        assert!(err.contains("layer 5 is not a MoE layer") && err.contains("0, 1"), "{err}");
        let err =
            load_checkpoint_layer(&ckpt, &opts(Some("model.layers.1."), Some(1))).unwrap_err().to_string();
        assert!(err.contains("not both"), "{err}");
        let err = load_checkpoint_layer(&ckpt, &opts(Some("model.layer.1."), None)).unwrap_err().to_string();
        assert!(
            err.contains("missing tensor `model.layer.1.mlp.gate.weight`")
                && err.contains("model.layers.1.mlp.gate.weight"),
            "{err}"
        );
    }
    // One shard file alone is a checkpoint of the tensors it holds.
    let one = Checkpoint::open(&dir.join("model-00001-of-00003.safetensors")).unwrap();
    same_layer(&load_checkpoint_layer(&one, &opts(None, None)).unwrap(), &cfg, &ws[0]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn broken_checkpoints_are_errors_naming_the_problem() {
    let (dir, _, _, _) = sharded("broken");
    let index_path = dir.join("model.safetensors.index.json");
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let open_with = |name: &str, index: &serde_json::Value| {
        let p = dir.join(name);
        std::fs::write(&p, index.to_string()).unwrap();
        Checkpoint::open(&p).unwrap_err().to_string()
    };
    let mut missing = index.clone();
    missing["weight_map"]["lm_head.weight"] = "model-00009-of-00003.safetensors".into();
    let err = open_with("missing.index.json", &missing);
    assert!(err.contains("names the shard model-00009-of-00003.safetensors"), "{err}");
    let mut misplaced = index.clone();
    misplaced["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors".into();
    let err = open_with("misplaced.index.json", &misplaced);
    assert!(
        err.contains("places `lm_head.weight` in model-00001-of-00003.safetensors, which does not hold it"),
        "{err}"
    );
    let err = open_with("nomap.index.json", &serde_json::json!({"metadata": {}}));
    assert!(err.contains("is not a safetensors index"), "{err}");
    std::fs::write(dir.join("bad.index.json"), b"{ not json").unwrap();
    let err = Checkpoint::open(&dir.join("bad.index.json")).unwrap_err().to_string();
    assert!(err.contains("is not a safetensors index"), "{err}");

    // A tensor held by two shards.
    let dup = scratch("dup");
    let t = |n: &str| vec![(n.to_string(), vec![2, 2], vec![1.0f32; 4])];
    write(&dup.join("a.safetensors"), [t("x"), t("y")].concat(), Dtype::F32);
    write(&dup.join("b.safetensors"), t("y"), Dtype::F32);
    std::fs::write(
        dup.join("model.safetensors.index.json"),
        serde_json::json!({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}).to_string(),
    )
    .unwrap();
    let err = Checkpoint::open(&dup).unwrap_err().to_string();
    assert!(err.contains("tensor `y` is in two shards"), "{err}");
    // A directory with two files and no index; with none at all.
    std::fs::remove_file(dup.join("model.safetensors.index.json")).unwrap();
    let err = Checkpoint::open(&dup).unwrap_err().to_string();
    assert!(err.contains("holds 2 .safetensors files and no model.safetensors.index.json"), "{err}");
    let empty = scratch("empty");
    let err = Checkpoint::open(&empty).unwrap_err().to_string();
    assert!(err.contains("holds neither model.safetensors.index.json nor a .safetensors file"), "{err}");
    // A truncated shard; a path that does not exist.
    let bytes = std::fs::read(dup.join("a.safetensors")).unwrap();
    std::fs::write(dup.join("a.safetensors"), &bytes[..bytes.len() - 3]).unwrap();
    let err = Checkpoint::open(&dup.join("a.safetensors")).unwrap_err().to_string();
    assert!(err.contains("is not a readable safetensors file"), "{err}");
    let err = Checkpoint::open(&dup.join("nothing.safetensors")).unwrap_err().to_string();
    assert!(err.contains("nothing.safetensors"), "{err}");
    // Headers whose byte ranges disagree with dtype and shape, or overlap.
    let raw = |name: &str, header: serde_json::Value, data: usize| {
        let h = header.to_string().into_bytes();
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend(h);
        bytes.extend(vec![0u8; data]);
        std::fs::write(dup.join(name), bytes).unwrap();
        Checkpoint::open(&dup.join(name)).unwrap_err().to_string()
    };
    let err = raw(
        "short.safetensors",
        serde_json::json!({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}),
        12,
    );
    assert!(err.contains("short.safetensors is not a readable safetensors file"), "{err}");
    let err = raw(
        "overlap.safetensors",
        serde_json::json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}),
        24,
    );
    assert!(err.contains("overlap.safetensors is not a readable safetensors file"), "{err}");
    // A shard holding an expert tensor of a dtype moeflow does not read.
    let (ints, _, config, _) = sharded("ints");
    let shard = ints.join("model-00003-of-00003.safetensors");
    let st_bytes = std::fs::read(&shard).unwrap();
    let st = SafeTensors::deserialize(&st_bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec(), t.dtype(), t.data().to_vec()))
        .collect();
    let victim = owned.iter_mut().find(|t| t.0.contains("down_proj")).unwrap();
    victim.2 = Dtype::I16;
    let victim_name = victim.0.clone();
    let views: Vec<(String, TensorView<'_>)> =
        owned.iter().map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(&shard, safetensors::serialize(views, None).unwrap()).unwrap();
    let ckpt = Checkpoint::open(&ints).unwrap();
    let opts = LoadOptions { layer: Some(1), config: Some(config), ..LoadOptions::default() };
    let err = load_checkpoint_layer(&ckpt, &opts).unwrap_err().to_string();
    assert!(err.contains(&format!("`{victim_name}` is I16")), "{err}");
    std::fs::remove_dir_all(&ints).ok();
    for d in [dir, dup, empty] {
        std::fs::remove_dir_all(&d).ok();
    }
}

#[test]
fn example_runs_one_layer_of_a_sharded_checkpoint() {
    let adapters = common::wgpu_adapters();
    if adapters.is_empty() {
        return;
    }
    let (dir, cfg, _, ws) = sharded("cli");
    let tokens = 9usize;
    let x = Synth::new(3).uniform(tokens * cfg.route.hidden as usize, 1.0);
    write(
        &dir.join("x.safetensors"),
        vec![("x".into(), vec![tokens, cfg.route.hidden as usize], x.clone())],
        Dtype::F32,
    );
    let run = |output: &Path| {
        Command::new(example())
            .arg("--weights")
            .arg(&dir)
            .args(["--layer", "1", "--config"])
            .arg(dir.join("config.json"))
            .arg("--input")
            .arg(dir.join("x.safetensors"))
            .arg("--output")
            .arg(output)
            .output()
            .expect("running the example")
    };
    let out = run(&dir.join("y.safetensors"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("at `model.layers.1.`"), "{stdout}");
    let bytes = std::fs::read(dir.join("y.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let y = words(&st, "output").map(f32::from_bits).collect::<Vec<_>>();
    let (ry, _, _) = reference::forward(&cfg, &ws[1], &x).unwrap();
    common::assert_rows_close("layer 1", &y, &ry, cfg.route.hidden as usize);
    // Every layer in turn, from one mapping.
    let out = Command::new(example())
        .arg("--weights")
        .arg(&dir)
        .args(["--all-layers", "--config"])
        .arg(dir.join("config.json"))
        .arg("--input")
        .arg(dir.join("x.safetensors"))
        .arg("--output")
        .arg(dir.join("all.safetensors"))
        .output()
        .expect("running the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.matches("loaded in").count(), 2, "{stdout}");
    assert!(stdout.contains("2 layer(s)") && stdout.contains("peak host memory"), "{stdout}");
    let bytes = std::fs::read(dir.join("all.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for (l, w) in ws.iter().enumerate() {
        let y = words(&st, &format!("layers.{l}.output")).map(f32::from_bits).collect::<Vec<_>>();
        let (ry, _, _) = reference::forward(&cfg, w, &x).unwrap();
        common::assert_rows_close(&format!("layer {l}"), &y, &ry, cfg.route.hidden as usize);
        assert_eq!(
            st.tensor(&format!("layers.{l}.expert_counts")).unwrap().shape(),
            &[cfg.route.experts as usize]
        );
    }
    // The output may not overwrite a shard.
    let shard = dir.join("model-00002-of-00003.safetensors");
    let before = std::fs::read(&shard).unwrap();
    let out = run(&shard);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is the same file as the input"), "{stderr}");
    assert_eq!(std::fs::read(&shard).unwrap(), before);
    std::fs::remove_dir_all(&dir).ok();
}

/// Streaming a checkpoint layer to the device gives the layer that loading it to host f32 and
/// uploading gives, bit for bit: in the stored dtype, converted to another, with a shared
/// expert, and with shapes whose expert sizes are odd numbers of halves.
#[test]
fn streamed_checkpoint_layers_match_host_loaded_ones_bitwise() {
    let ctxs = common::contexts();
    let (dir, cfg, config, _) = sharded("stream");
    // A single-file DeepSeek-V3 layer in bf16 with a shared expert and odd H*F.
    let ds = MoeConfig {
        route: RouteConfig {
            k: 3,
            gating: Gating::Sigmoid,
            bias: true,
            scale: 2.5,
            groups: Some(GroupLimit { n_group: 4, topk_group: 2 }),
            ..MoeConfig::new(33, 13, 8, 3).route
        },
        shared_ffn: Some(9),
        weight_dtype: WeightDtype::Bf16,
        ..MoeConfig::new(33, 13, 8, 3)
    };
    let ds_config = serde_json::json!({"model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 3,
        "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": true});
    let w = Synth::new(5).moe_weights(&ds);
    write(&dir.join("ds.safetensors"), tensors(Scheme::DeepSeek, "model.layers.2.", &ds, &w), Dtype::BF16);
    let cases = [
        (dir.clone(), Some(1), config.clone(), None, cfg.route.hidden),
        (dir.clone(), Some(0), config.clone(), Some(WeightDtype::Bf16), cfg.route.hidden),
        (dir.clone(), Some(0), config, Some(WeightDtype::F32), cfg.route.hidden),
        (dir.join("ds.safetensors"), None, ds_config.clone(), None, ds.route.hidden),
        (dir.join("ds.safetensors"), None, ds_config, Some(WeightDtype::F16), ds.route.hidden),
    ];
    for ctx in &ctxs {
        for (path, layer, config, dtype, h) in &cases {
            let ckpt = Checkpoint::open(path).unwrap();
            let opts = LoadOptions {
                layer: *layer,
                config: Some(config.clone()),
                dtype: *dtype,
                ..LoadOptions::default()
            };
            let host = load_checkpoint_layer(&ckpt, &opts).unwrap();
            let a = MoeLayer::new(ctx, host.config, &host.weights).unwrap();
            let b = upload_checkpoint_layer(ctx, &ckpt, &opts, |c| c).unwrap();
            assert_eq!(b.prefix, host.prefix);
            assert_eq!(b.layer.config(), a.config());
            let x = Synth::new(9).uniform(37 * *h as usize, 1.0);
            let (ya, yb) = (a.forward_host(ctx, &x).unwrap(), b.layer.forward_host(ctx, &x).unwrap());
            assert_eq!(ya.indices, yb.indices, "{path:?} {dtype:?}");
            assert_eq!(common::bits(&ya.y), common::bits(&yb.y), "{path:?} {dtype:?}");
            assert_eq!(common::bits(&ya.weights), common::bits(&yb.weights), "{path:?} {dtype:?}");
            // The modes may change; what the checkpoint fixed may not.
            let err = upload_checkpoint_layer(ctx, &ckpt, &opts, |c| MoeConfig {
                route: RouteConfig { k: c.route.k + 1, ..c.route },
                ..c
            })
            .unwrap_err();
            assert!(err.to_string().contains("changes what the checkpoint fixed"), "{err}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Rows of `row` values taken alternately (gpt-oss's interleaved gate/up): (even, odd).
fn split_rows<T: Copy>(v: &[T], row: usize) -> (Vec<T>, Vec<T>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (i, r) in v.chunks(row).enumerate() {
        if i % 2 == 0 { a.extend_from_slice(r) } else { b.extend_from_slice(r) }
    }
    (a, b)
}

/// A gpt-oss-shaped layer written as gpt-oss ships it (MXFP4 `gate_up_proj_blocks` with gate and
/// up rows interleaved, `down_proj_blocks`, their E8M0 scales, bf16 router and biases, and a
/// config.json with gpt-oss's keys), run through the example CLI and checked against the CPU
/// reference on the decoded values: routing exactly, outputs within the bound. The library's
/// host load gives the same decoded weights, and a dense (bf16 `gate_up_proj [E, H, 2F]`) copy
/// of the same layer loads to the same values.
#[test]
fn example_runs_a_gpt_oss_mxfp4_layer() {
    let adapters = common::wgpu_adapters();
    if adapters.is_empty() {
        return;
    }
    let (e, h, f, k, tokens) = (8usize, 64usize, 32usize, 4u32, 13usize);
    let mut s = Synth::new(31);
    // Interleaved gate/up rows [E, 2F, H] and down [E, H, F], quantised as shipped.
    let gate_up = s.uniform(e * 2 * f * h, 0.3);
    let down = s.uniform(e * h * f, 0.3);
    let (gu_codes, gu_scales) = moeflow::quant::mxfp4_quantize(&gate_up).unwrap();
    let (d_codes, d_scales) = moeflow::quant::mxfp4_quantize(&down).unwrap();
    let gate_up = moeflow::quant::mxfp4_dequantize(&gu_codes, &gu_scales).unwrap();
    let down = moeflow::quant::mxfp4_dequantize(&d_codes, &d_scales).unwrap();
    let stored = (gu_codes.clone(), gu_scales.clone(), d_codes.clone(), d_scales.clone());
    let bf = |v: Vec<f32>| v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect::<Vec<f32>>();
    let router = bf(s.uniform(e * h, 0.2));
    let router_bias = bf(s.uniform(e, 0.5));
    // Biases up to ±10 reach the clamp at ±7.
    let gate_up_bias = bf(s.uniform(e * 2 * f, 10.0));
    let down_bias = bf(s.uniform(e * h, 0.5));
    let x = s.uniform(tokens * h, 1.0);

    let dir = scratch("gpt-oss");
    let p = "model.layers.0.mlp.";
    let u8_tensor =
        |name: &str, shape: Vec<usize>, data: Vec<u8>| (format!("{p}{name}"), shape, data, Dtype::U8);
    let bf_tensor = |name: &str, shape: Vec<usize>, v: &[f32]| {
        (format!("{p}{name}"), shape, encode(v, Dtype::BF16), Dtype::BF16)
    };
    let tensors = [
        bf_tensor("router.weight", vec![e, h], &router),
        bf_tensor("router.bias", vec![e], &router_bias),
        u8_tensor("experts.gate_up_proj_blocks", vec![e, 2 * f, h / 32, 16], gu_codes),
        u8_tensor("experts.gate_up_proj_scales", vec![e, 2 * f, h / 32], gu_scales),
        bf_tensor("experts.gate_up_proj_bias", vec![e, 2 * f], &gate_up_bias),
        u8_tensor("experts.down_proj_blocks", vec![e, h, f / 32, 16], d_codes),
        u8_tensor("experts.down_proj_scales", vec![e, h, f / 32], d_scales),
        bf_tensor("experts.down_proj_bias", vec![e, h], &down_bias),
    ];
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, sh, b, d)| (n.clone(), TensorView::new(*d, sh.clone(), b).unwrap()))
        .collect();
    std::fs::write(dir.join("w.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let config = serde_json::json!({
        "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_local_experts": e,
        "num_experts_per_tok": k, "experts_per_token": k, "hidden_size": h, "intermediate_size": f,
        "swiglu_limit": 7.0, "hidden_act": "silu", "num_hidden_layers": 1, "head_dim": 64,
        "sliding_window": 128, "quantization_config": {"quant_method": "mxfp4"}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    write(&dir.join("x.safetensors"), vec![("x".into(), vec![tokens, h], x.clone())], Dtype::F32);

    // The reference on the decoded values, built here from the blocks.
    let (gate, up) = split_rows(&gate_up, h);
    let (gate_b, up_b) = split_rows(&gate_up_bias, 1);
    let cfg = MoeConfig {
        route: RouteConfig { router_bias: true, ..MoeConfig::new(h as u32, f as u32, e as u32, k).route },
        activation: Activation::GPT_OSS,
        expert_bias: true,
        weight_dtype: WeightDtype::Mxfp4,
        ..MoeConfig::new(h as u32, f as u32, e as u32, k)
    };
    let w = MoeWeights {
        router,
        gate,
        up,
        down,
        router_bias: Some(router_bias),
        expert_bias: Some(ExpertBiasValues { gate: gate_b, up: up_b, down: down_bias }),
        ..MoeWeights::default()
    };
    let (ry, ridx, _) = reference::forward(&cfg, &w, &x).unwrap();

    // The library's host load decodes to the same weights and configuration.
    let opts = LoadOptions { config: Some(config.clone()), ..LoadOptions::default() };
    let loaded =
        load_checkpoint_layer(&Checkpoint::open(&dir.join("w.safetensors")).unwrap(), &opts).unwrap();
    assert_eq!(loaded.routing.family, Family::GptOss);
    assert_eq!(loaded.config, cfg);
    assert!(loaded.weights == w, "host load differs from the blocks' decoding");

    let config_path = dir.join("config.json");
    let with_config: [&std::ffi::OsStr; 2] = ["--config".as_ref(), config_path.as_os_str()];
    let expect = ["gpt_oss", "Mxfp4"];
    example_matches_reference(&dir, &dir.join("w.safetensors"), &with_config, &expect, (&ry, &ridx), h);
    // Every routed expert left in the checkpoint as shipped and computed on the CPU.
    let on_host: [&std::ffi::OsStr; 3] = ["--config".as_ref(), config_path.as_os_str(), "--cpu-moe".as_ref()];
    let expect_on_host = ["gpt_oss", "Mxfp4", "8 of 8 experts on the host"];
    example_matches_reference(&dir, &dir.join("w.safetensors"), &on_host, &expect_on_host, (&ry, &ridx), h);

    // The same layer as llama.cpp converts it to GGUF: gate and up apart, ggml's MXFP4 blocks
    // (code 8, -0, is +0 there: the reference's values up to the sign of zero).
    {
        use moeflow::quant::mxfp4_to_ggml;
        use moeflow::weights::gguf::{GgmlType, GgufValue, GgufWriter};
        let (gate_c, up_c) = split_rows(&stored.0, h / 32 * 16);
        let (gate_s, up_s) = split_rows(&stored.1, h / 32);
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let b = w.expert_bias.as_ref().unwrap();
        let (hu, fu, eu) = (h as u64, f as u64, e as u64);
        let file = GgufWriter::default()
            .metadata("general.architecture", GgufValue::Str("gpt-oss".into()))
            .metadata("gpt-oss.expert_count", GgufValue::U32(e as u32))
            .metadata("gpt-oss.expert_used_count", GgufValue::U32(k))
            .metadata("gpt-oss.expert_feed_forward_length", GgufValue::U32(f as u32))
            .metadata("gpt-oss.embedding_length", GgufValue::U32(h as u32))
            .tensor("blk.0.ffn_gate_inp.weight", &[hu, eu], GgmlType::F32, f32_bytes(&w.router))
            .tensor(
                "blk.0.ffn_gate_inp.bias",
                &[eu],
                GgmlType::F32,
                f32_bytes(w.router_bias.as_ref().unwrap()),
            )
            .tensor(
                "blk.0.ffn_gate_exps.weight",
                &[hu, fu, eu],
                GgmlType::Mxfp4,
                mxfp4_to_ggml(&gate_c, &gate_s).unwrap(),
            )
            .tensor(
                "blk.0.ffn_up_exps.weight",
                &[hu, fu, eu],
                GgmlType::Mxfp4,
                mxfp4_to_ggml(&up_c, &up_s).unwrap(),
            )
            .tensor(
                "blk.0.ffn_down_exps.weight",
                &[fu, hu, eu],
                GgmlType::Mxfp4,
                mxfp4_to_ggml(&stored.2, &stored.3).unwrap(),
            )
            .tensor("blk.0.ffn_gate_exps.bias", &[fu, eu], GgmlType::F32, f32_bytes(&b.gate))
            .tensor("blk.0.ffn_up_exps.bias", &[fu, eu], GgmlType::F32, f32_bytes(&b.up))
            .tensor("blk.0.ffn_down_exps.bias", &[hu, eu], GgmlType::F32, f32_bytes(&b.down));
        std::fs::write(dir.join("model.gguf"), file.to_bytes()).unwrap();
        example_matches_reference(&dir, &dir.join("model.gguf"), &[], &expect, (&ry, &ridx), h);
        // ggml's MXFP4 blocks and the biases read on the host, for a set of experts.
        let some: [&std::ffi::OsStr; 2] = ["--host-experts".as_ref(), "0,3,7".as_ref()];
        let on_host = ["gpt_oss", "Mxfp4", "3 of 8 experts on the host"];
        example_matches_reference(&dir, &dir.join("model.gguf"), &some, &on_host, (&ry, &ridx), h);
    }

    // The same layer dense: bf16 `gate_up_proj [E, H, 2F]` and `down_proj [E, F, H]` (in x out).
    let dense_dir = scratch("gpt-oss-dense");
    let transpose = |v: &[f32], [a, b, c]: [usize; 3]| {
        let mut out = vec![0.0f32; v.len()];
        for x in 0..a {
            for i in 0..b {
                for j in 0..c {
                    out[(x * c + j) * b + i] = v[(x * b + i) * c + j];
                }
            }
        }
        out
    };
    let mut dense = vec![
        bf_tensor("router.weight", vec![e, h], &w.router),
        bf_tensor("router.bias", vec![e], w.router_bias.as_deref().unwrap_or_default()),
        bf_tensor("experts.gate_up_proj", vec![e, h, 2 * f], &transpose(&gate_up, [e, 2 * f, h])),
        bf_tensor("experts.gate_up_proj_bias", vec![e, 2 * f], &gate_up_bias),
        bf_tensor("experts.down_proj", vec![e, f, h], &transpose(&w.down, [e, h, f])),
    ];
    dense.push(bf_tensor("experts.down_proj_bias", vec![e, h], &w.expert_bias.as_ref().unwrap().down));
    let views: Vec<(String, TensorView<'_>)> =
        dense.iter().map(|(n, sh, b, d)| (n.clone(), TensorView::new(*d, sh.clone(), b).unwrap())).collect();
    std::fs::write(dense_dir.join("w.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let opts = LoadOptions { config: Some(config), ..LoadOptions::default() };
    let dense =
        load_checkpoint_layer(&Checkpoint::open(&dense_dir.join("w.safetensors")).unwrap(), &opts).unwrap();
    assert_eq!(dense.config, MoeConfig { weight_dtype: WeightDtype::Bf16, ..cfg });
    assert!(dense.weights == w, "dense load differs from the MXFP4 layer's values");
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&dense_dir).ok();
}

/// A small gpt-oss layer's tensors as shipped (MXFP4 experts, bf16 router and biases), with
/// `change` applied to the list before writing: safetensors bytes.
fn gpt_oss_file(change: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<u8>, Dtype)>)) -> Vec<u8> {
    let (e, h, f) = (4usize, 32usize, 32usize);
    let p = "model.layers.0.mlp.";
    let zeros = |n: usize| vec![0u8; n];
    let bf = |n: usize| encode(&vec![0.5f32; n], Dtype::BF16);
    let mut tensors = vec![
        (format!("{p}router.weight"), vec![e, h], bf(e * h), Dtype::BF16),
        (format!("{p}router.bias"), vec![e], bf(e), Dtype::BF16),
        (
            format!("{p}experts.gate_up_proj_blocks"),
            vec![e, 2 * f, h / 32, 16],
            zeros(e * 2 * f * h / 2),
            Dtype::U8,
        ),
        (
            format!("{p}experts.gate_up_proj_scales"),
            vec![e, 2 * f, h / 32],
            vec![127; e * 2 * f * h / 32],
            Dtype::U8,
        ),
        (format!("{p}experts.gate_up_proj_bias"), vec![e, 2 * f], bf(e * 2 * f), Dtype::BF16),
        (format!("{p}experts.down_proj_blocks"), vec![e, h, f / 32, 16], zeros(e * h * f / 2), Dtype::U8),
        (format!("{p}experts.down_proj_scales"), vec![e, h, f / 32], vec![127; e * h * f / 32], Dtype::U8),
        (format!("{p}experts.down_proj_bias"), vec![e, h], bf(e * h), Dtype::BF16),
    ];
    change(&mut tensors);
    let views: Vec<(String, TensorView<'_>)> =
        tensors.iter().map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize(views, None).unwrap()
}

/// gpt-oss files and configs that cannot be run as written are errors naming the tensor or key.
#[test]
fn gpt_oss_checkpoint_errors_name_the_problem() {
    let config = |extra: serde_json::Value| {
        let mut c = serde_json::json!({
            "model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2,
            "intermediate_size": 32, "hidden_size": 32
        });
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let load = |bytes: &[u8], cfg: serde_json::Value| {
        load_layer(bytes, "gpt-oss.safetensors", &LoadOptions { config: Some(cfg), ..LoadOptions::default() })
    };
    // The well-formed file loads, with gpt-oss's routing and constants.
    let ok = load(&gpt_oss_file(|_| {}), config(serde_json::json!({}))).unwrap();
    assert_eq!(ok.routing.family, Family::GptOss);
    assert_eq!(ok.config.activation, Activation::GPT_OSS);
    assert!(ok.config.route.router_bias && ok.config.expert_bias && ok.config.route.renormalize);
    let cases: Vec<(Vec<u8>, serde_json::Value, &str)> = vec![
        (gpt_oss_file(|t| t[2].1 = vec![4, 64, 2, 8]), config(serde_json::json!({})), "gate_up_proj_blocks"),
        (gpt_oss_file(|t| t[3].3 = Dtype::I8), config(serde_json::json!({})), "are u8"),
        (gpt_oss_file(|t| drop(t.remove(1))), config(serde_json::json!({})), "mlp.router.bias"),
        (gpt_oss_file(|t| t[7].1 = vec![4, 16, 2]), config(serde_json::json!({})), "down_proj_bias"),
        (gpt_oss_file(|_| {}), config(serde_json::json!({"swiglu_limit": -1.0})), "clamped SwiGLU"),
        (gpt_oss_file(|_| {}), config(serde_json::json!({"norm_topk_prob": false})), "norm_topk_prob"),
        (gpt_oss_file(|_| {}), config(serde_json::json!({"num_local_experts": 8})), "num_local_experts"),
        (gpt_oss_file(|_| {}), config(serde_json::json!({"model_type": "mixtral"})), "names"),
    ];
    for (i, (bytes, cfg, needle)) in cases.into_iter().enumerate() {
        let err = load(&bytes, cfg).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(needle), "case {i}: `{needle}` not in: {err}");
    }
}

/// A GGUF file as llama.cpp writes a MoE model (ggml dims innermost first, `blk.N.` names, the
/// architecture's metadata, a dense block before the MoE one, keys the layer does not use)
/// runs through the example with its experts as stored, against the CPU reference on the
/// decoded values: Qwen2-MoE with Q4_0 experts and a gated shared expert; DeepSeek-V3
/// (sigmoid, selection bias, 4 groups keep 2, renormalised, × 2.5) with Q8_0 experts.
#[test]
fn example_runs_gguf_layers_as_stored() {
    use moeflow::weights::gguf::{GgmlType, Gguf, GgufValue, GgufWriter};
    use moeflow::weights::load_gguf_layer;
    let adapters = common::wgpu_adapters();
    if adapters.is_empty() {
        return;
    }
    let (h, f, e, k, tokens) = (64usize, 32usize, 8u32, 2u32, 9usize);
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (arch, ty) in [("qwen2moe", GgmlType::Q4_0), ("deepseek2", GgmlType::Q8_0)] {
        let base = MoeConfig::new(h as u32, f as u32, e, k);
        let cfg = match arch {
            "qwen2moe" => MoeConfig {
                route: RouteConfig { renormalize: false, ..base.route },
                shared_ffn: Some(f as u32),
                shared_gate: true,
                ..base
            },
            _ => deepseek_v3(base),
        };
        let mut w = Synth::new(41).moe_weights(&cfg);
        // The blocks as stored; the weights become their decoded values.
        let mut stored = |v: &mut Vec<f32>| -> Vec<u8> {
            use moeflow::quant::{q4_0_dequantize, q4_0_quantize, q8_0_dequantize, q8_0_quantize};
            let (q, d) = match ty {
                GgmlType::Q4_0 => {
                    let q = q4_0_quantize(v).unwrap();
                    let d = q4_0_dequantize(&q).unwrap();
                    (q, d)
                }
                _ => {
                    let q = q8_0_quantize(v).unwrap();
                    let d = q8_0_dequantize(&q).unwrap();
                    (q, d)
                }
            };
            *v = d;
            q
        };
        let [gate, up, down] = [&mut w.gate, &mut w.up, &mut w.down].map(&mut stored);
        let shared = w.shared.as_mut().unwrap();
        let [sg, su, sd] = [&mut shared.0, &mut shared.1, &mut shared.2].map(&mut stored);
        let (hu, fu, eu) = (h as u64, f as u64, u64::from(e));
        let a = |key: &str| format!("{arch}.{key}");
        let mut file = GgufWriter::default()
            .metadata("general.architecture", GgufValue::Str(arch.into()))
            .metadata(&a("block_count"), GgufValue::U32(2))
            .metadata(&a("embedding_length"), GgufValue::U32(h as u32))
            .metadata(&a("expert_count"), GgufValue::U32(e))
            .metadata(&a("expert_used_count"), GgufValue::U32(k))
            .metadata(&a("expert_feed_forward_length"), GgufValue::U32(f as u32))
            .metadata("tokenizer.ggml.tokens", GgufValue::Array(vec![GgufValue::Str("a".into()); 3]))
            .tensor("blk.0.ffn_gate.weight", &[hu, 4], GgmlType::F32, f32_bytes(&[0.5; 256]))
            .tensor("blk.1.ffn_gate_inp.weight", &[hu, eu], GgmlType::F32, f32_bytes(&w.router))
            .tensor("blk.1.ffn_gate_exps.weight", &[hu, fu, eu], ty, gate)
            .tensor("blk.1.ffn_up_exps.weight", &[hu, fu, eu], ty, up)
            .tensor("blk.1.ffn_down_exps.weight", &[fu, hu, eu], ty, down)
            .tensor("blk.1.ffn_gate_shexp.weight", &[hu, fu], ty, sg)
            .tensor("blk.1.ffn_up_shexp.weight", &[hu, fu], ty, su)
            .tensor("blk.1.ffn_down_shexp.weight", &[fu, hu], ty, sd);
        file = match arch {
            "qwen2moe" => {
                file.metadata(&a("expert_shared_feed_forward_length"), GgufValue::U32(f as u32)).tensor(
                    "blk.1.ffn_gate_inp_shexp.weight",
                    &[hu],
                    GgmlType::F32,
                    f32_bytes(w.shared_gate.as_ref().unwrap()),
                )
            }
            _ => file
                .metadata(&a("expert_gating_func"), GgufValue::U32(2))
                .metadata(&a("expert_weights_norm"), GgufValue::Bool(true))
                .metadata(&a("expert_weights_scale"), GgufValue::F32(2.5))
                .metadata(&a("expert_shared_count"), GgufValue::U32(1))
                .metadata(&a("expert_group_count"), GgufValue::U32(4))
                .metadata(&a("expert_group_used_count"), GgufValue::U32(2))
                .tensor("blk.1.exp_probs_b.bias", &[eu], GgmlType::F32, f32_bytes(w.bias.as_ref().unwrap())),
        };
        let dir = scratch(&format!("gguf-{arch}"));
        let bytes = file.to_bytes();
        std::fs::write(dir.join("model.gguf"), &bytes).unwrap();
        let x = Synth::new(42).uniform(tokens * h, 1.0);
        write(&dir.join("x.safetensors"), vec![("x".into(), vec![tokens, h], x.clone())], Dtype::F32);

        // The host load: the metadata's routing, the stored type, the decoded values.
        let loaded = load_gguf_layer(&Gguf::parse(&bytes, "model.gguf").unwrap(), &LoadOptions::default())
            .unwrap_or_else(|err| panic!("{arch}: {err}"));
        let dtype = if ty == GgmlType::Q4_0 { WeightDtype::Q4_0 } else { WeightDtype::Q8_0 };
        assert_eq!(loaded.config, MoeConfig { weight_dtype: dtype, ..cfg }, "{arch}");
        assert_eq!(loaded.prefix, "blk.1.");
        assert!(loaded.weights == w, "{arch}: host load differs from the blocks' decoding");
        let (ry, ridx, _) = reference::forward(&cfg, &w, &x).unwrap();

        let expect = [format!("{dtype:?}"), "blk.1.".to_string()];
        let expect: Vec<&str> = expect.iter().map(String::as_str).collect();
        example_matches_reference(&dir, &dir.join("model.gguf"), &[], &expect, (&ry, &ridx), h);
        // Every routed expert left in the file and computed on the CPU (`--cpu-moe`), and a set.
        let on_host = [format!("{dtype:?}"), "8 of 8 experts on the host".to_string()];
        let on_host: Vec<&str> = on_host.iter().map(String::as_str).collect();
        example_matches_reference(
            &dir,
            &dir.join("model.gguf"),
            &["--cpu-moe".as_ref()],
            &on_host,
            (&ry, &ridx),
            h,
        );
        let some = ["--host-experts".as_ref(), "1,6".as_ref()];
        example_matches_reference(
            &dir,
            &dir.join("model.gguf"),
            &some,
            &["2 of 8 experts on the host"],
            (&ry, &ridx),
            h,
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// A DeepSeek-V3 layer as its FP8 checkpoints ship it: e4m3 routed and shared experts, each
/// with an f32 `weight_scale_inv` per 128 × 128 tile (H = 160 and F = 136 end mid-tile, so
/// both edges hold partial tiles), e4m3 subnormal and ±0 codes and an all-zero tile with a zero
/// scale; f32 router and selection bias. Returns (file bytes, the layer with its decoded
/// weights, config.json).
fn fp8_deepseek_file(
    change: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<u8>, Dtype)>),
) -> (Vec<u8>, MoeConfig, MoeWeights, serde_json::Value) {
    use moeflow::quant::{fp8_block_dequantize, fp8_block_quantize};
    let (h, f, e) = (160usize, 136usize, 8u32);
    let cfg = deepseek_v3(MoeConfig::new(h as u32, f as u32, e, 3));
    let mut w = Synth::new(43).moe_weights(&cfg);
    let tiles = |n: usize, k: usize| vec![n.div_ceil(128), k.div_ceil(128)];
    let mut out: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = Vec::new();
    // Quantises `v` ([n, k] per matrix) in place to its decoded values; pushes the tensors.
    let mut fp8 = |names: Vec<String>, v: &mut [f32], [n, k]: [usize; 2], twist: bool| {
        for (i, name) in names.into_iter().enumerate() {
            let m = &mut v[i * n * k..(i + 1) * n * k];
            let (mut bytes, mut scales) = fp8_block_quantize(m, [n, k], [128, 128]).unwrap();
            if twist && i == 0 {
                bytes[..8].copy_from_slice(&[0x01, 0x02, 0x07, 0x81, 0x87, 0x00, 0x80, 0x08]);
                // The last tile all zero codes under a zero scale.
                let last = scales.len() - 1;
                scales[last] = 0.0;
                for (j, b) in bytes.iter_mut().enumerate() {
                    if j / k >= 128 && j % k >= 128 {
                        *b = 0;
                    }
                }
            }
            m.copy_from_slice(&fp8_block_dequantize(&bytes, &scales, [n, k], [128, 128]).unwrap());
            let scale_name = name.replace(".weight", ".weight_scale_inv");
            out.push((name, vec![n, k], bytes, Dtype::F8_E4M3));
            out.push((scale_name, tiles(n, k), encode(&scales, Dtype::F32), Dtype::F32));
        }
    };
    let p = "model.layers.3.mlp.";
    let experts = |part: &str| (0..e).map(|i| format!("{p}experts.{i}.{part}.weight")).collect::<Vec<_>>();
    fp8(experts("gate_proj"), &mut w.gate, [f, h], true);
    fp8(experts("up_proj"), &mut w.up, [f, h], false);
    fp8(experts("down_proj"), &mut w.down, [h, f], true);
    let shared = w.shared.as_mut().unwrap();
    fp8(vec![format!("{p}shared_experts.gate_proj.weight")], &mut shared.0, [f, h], false);
    fp8(vec![format!("{p}shared_experts.up_proj.weight")], &mut shared.1, [f, h], false);
    fp8(vec![format!("{p}shared_experts.down_proj.weight")], &mut shared.2, [h, f], true);
    out.push((format!("{p}gate.weight"), vec![e as usize, h], encode(&w.router, Dtype::F32), Dtype::F32));
    let bias = w.bias.as_ref().unwrap();
    out.push((
        format!("{p}gate.e_score_correction_bias"),
        vec![e as usize],
        encode(bias, Dtype::F32),
        Dtype::F32,
    ));
    change(&mut out);
    let views: Vec<(String, TensorView<'_>)> =
        out.iter().map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let config = serde_json::json!({
        "model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 3, "scoring_func": "sigmoid",
        "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
        "hidden_size": h, "moe_intermediate_size": f, "n_shared_experts": 1, "topk_method": "noaux_tc",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]}
    });
    (safetensors::serialize(views, None).unwrap(), cfg, w, config)
}

/// An FP8 DeepSeek-V3 layer ([`fp8_deepseek_file`]) runs through the example with its experts
/// as stored, against the CPU reference on the decoded values (routing exactly, outputs within
/// the bound); the library's host load gives those decoded values, with the tile inferred
/// when config.json gives none; streamed and converted to f16 it gives the host-loaded layer's
/// bits.
#[test]
fn example_runs_an_fp8_block_scaled_checkpoint() {
    let (bytes, cfg, w, config) = fp8_deepseek_file(|_| {});
    let opts = LoadOptions { config: Some(config.clone()), ..LoadOptions::default() };
    let loaded = load_layer(&bytes, "fp8.safetensors", &opts).unwrap();
    assert_eq!(loaded.config, MoeConfig { weight_dtype: WeightDtype::Fp8, ..cfg });
    assert!(loaded.weights == w, "host load differs from the tiles' decoding");
    let mut plain = config.clone();
    plain.as_object_mut().unwrap().remove("quantization_config");
    let inferred =
        load_layer(&bytes, "fp8.safetensors", &LoadOptions { config: Some(plain), ..opts.clone() });
    assert!(inferred.unwrap().weights == w, "128 x 128 tiles inferred from the scales' shapes");

    let (tokens, h) = (9usize, cfg.route.hidden as usize);
    let dir = scratch("fp8");
    std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let x = Synth::new(44).uniform(tokens * h, 1.0);
    write(&dir.join("x.safetensors"), vec![("x".into(), vec![tokens, h], x.clone())], Dtype::F32);
    let (ry, ridx, _) = reference::forward(&cfg, &w, &x).unwrap();
    let config_path = dir.join("config.json");
    let with_config: [&std::ffi::OsStr; 2] = ["--config".as_ref(), config_path.as_os_str()];
    example_matches_reference(&dir, &dir.join("model.safetensors"), &with_config, &["Fp8"], (&ry, &ridx), h);
    let ckpt = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
    for ctx in &common::contexts() {
        let opts = LoadOptions { dtype: Some(WeightDtype::F16), ..opts.clone() };
        let host = load_checkpoint_layer(&ckpt, &opts).unwrap();
        let a = MoeLayer::new(ctx, host.config, &host.weights).unwrap();
        let b = upload_checkpoint_layer(ctx, &ckpt, &opts, |c| c).unwrap();
        assert_eq!(b.layer.config(), a.config());
        let (ya, yb) = (a.forward_host(ctx, &x).unwrap(), b.layer.forward_host(ctx, &x).unwrap());
        assert_eq!(ya.indices, yb.indices);
        assert_eq!(common::bits(&ya.y), common::bits(&yb.y), "fp8 streamed as f16");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// FP8 checkpoints that cannot be read as written are errors naming the tensor or key.
#[test]
fn fp8_checkpoint_errors_name_the_problem() {
    let scale = "model.layers.3.mlp.experts.2.up_proj.weight_scale_inv";
    let find = |t: &Vec<(String, Vec<usize>, Vec<u8>, Dtype)>| t.iter().position(|x| x.0 == scale).unwrap();
    let cases: Vec<(Vec<u8>, serde_json::Value, &str)> = {
        let config = fp8_deepseek_file(|_| {}).3;
        let with = |key: &str, v: serde_json::Value| {
            let mut c = config.clone();
            c["quantization_config"][key] = v;
            c
        };
        vec![
            (fp8_deepseek_file(|t| drop(t.remove(find(t)))).0, config.clone(), "has no scale tensor"),
            (
                fp8_deepseek_file(|t| {
                    let i = find(t);
                    t[i].1 = vec![2, 1];
                    t[i].2.truncate(8);
                })
                .0,
                config.clone(),
                scale,
            ),
            (fp8_deepseek_file(|_| {}).0, with("fmt", "e5m2".into()), "fmt"),
            (fp8_deepseek_file(|_| {}).0, with("activation_scheme", "static".into()), "activation_scheme"),
            (
                fp8_deepseek_file(|_| {}).0,
                with("weight_block_size", serde_json::json!([128])),
                "weight_block_size",
            ),
            (
                fp8_deepseek_file(|_| {}).0,
                with("weight_block_size", serde_json::json!([64, 64])),
                "weight_block_size",
            ),
            (
                fp8_deepseek_file(|t| {
                    let i = find(t);
                    t[i].3 = Dtype::I32;
                })
                .0,
                config.clone(),
                scale,
            ),
        ]
    };
    for (i, (bytes, cfg, needle)) in cases.into_iter().enumerate() {
        let opts = LoadOptions { config: Some(cfg), ..LoadOptions::default() };
        let err = load_layer(&bytes, "fp8.safetensors", &opts).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(needle), "case {i}: `{needle}` not in: {err}");
    }
}
