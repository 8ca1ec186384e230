//! Parity with Hugging Face `transformers`: every fixture under `tests/fixtures/hf/` (tiny
//! random models of each supported family written by `save_pretrained`, their MoE block run by
//! transformers in float32; see `tools/hf_fixtures.py`) runs through the library on every
//! adapter, and one fixture of each family through the `moe_layer` example. Expert ids must match exactly (in moeflow's slot
//! order), outputs within 1e-5 of each row's scale, routing weights within 1e-5 relative.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use moeflow::Error;
use moeflow::kernels::gemm::WeightDtype;
use moeflow::layer::MoeConfig;
use moeflow::reference::layer as reference;
use moeflow::weights::{Checkpoint, LoadOptions, load_checkpoint_layer, load_input, upload_checkpoint_layer};
use safetensors::{Dtype, SafeTensors};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/fixtures/hf exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 14, "expected the committed fixtures, found {}", dirs.len());
    dirs
}

struct Expected {
    y: Vec<f32>,
    ids: Vec<u32>,
    weights: Vec<f32>,
}

fn floats(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("tensor {name}"));
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn ids(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("tensor {name}"));
    match t.dtype() {
        Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|b| u32::try_from(i64::from_le_bytes(b.try_into().unwrap())).unwrap())
            .collect(),
        Dtype::U32 => t.data().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect(),
        d => panic!("{name}: ids as {d:?}"),
    }
}

fn expected(dir: &Path) -> Expected {
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    Expected { y: floats(&st, "output"), ids: ids(&st, "topk_indices"), weights: floats(&st, "topk_weights") }
}

/// Ids exact; outputs within 1e-5 of the row's largest magnitude; weights within 1e-5 relative.
fn check(what: &str, hidden: usize, got: &Expected, want: &Expected) {
    assert_eq!(got.ids, want.ids, "{what}: expert ids");
    for (i, (g, w)) in got.weights.iter().zip(&want.weights).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}: weight {i}: {g} vs transformers {w}");
    }
    assert_eq!(got.y.len(), want.y.len(), "{what}: output length");
    for (t, (g, w)) in got.y.chunks(hidden).zip(want.y.chunks(hidden)).enumerate() {
        let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (c, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{what}: token {t} column {c}: {a} vs transformers {b} (row scale {scale})"
            );
        }
    }
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

/// The checkpoint uploaded as stored (`upload_checkpoint_layer`: quantised experts keep their
/// blocks) on every adapter; and its host load (`load_checkpoint_layer`), whose decoded values
/// run through the CPU reference as f32 weights (with the checkpoint's quantised dtype the
/// reference, like `MoeLayer::new`, would quantise them again by moeflow's own rules).
#[test]
fn every_family_matches_transformers_through_the_library() {
    let ctxs = common::contexts();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let opts = LoadOptions { config: Some(config(&dir)), ..LoadOptions::default() };
        let ckpt = Checkpoint::open(&dir.join("weights.safetensors")).unwrap();
        let (x, _, hidden) = load_input(&std::fs::read(dir.join("x.safetensors")).unwrap(), &name).unwrap();
        let want = expected(&dir);
        let loaded = load_checkpoint_layer(&ckpt, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let host = MoeConfig { weight_dtype: WeightDtype::F32, ..loaded.config };
        let (y, ids, weights) = reference::forward(&host, &loaded.weights, &x).unwrap();
        check(&format!("{name} host load, CPU reference"), hidden, &Expected { y, ids, weights }, &want);
        for ctx in &ctxs {
            let what = format!("{name} on {}", ctx.adapter().slug());
            let layer = match upload_checkpoint_layer(ctx, &ckpt, &opts, |c| c) {
                Ok(l) => l.layer,
                Err(Error::MissingFeature(why)) => {
                    eprintln!("skipped {what}: {why}");
                    continue;
                }
                Err(e) => panic!("{what}: {e}"),
            };
            let out = layer.forward_host(ctx, &x).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = Expected { y: out.y, ids: out.indices, weights: out.weights };
            check(&what, hidden, &got, &want);
        }
    }
}

/// The example CLI (`moe_layer --weights --config --prefix`) on one fixture of each family, on
/// every adapter: the CLI loads through `upload_checkpoint_layer`, which the library test above
/// runs on every fixture, so this checks the CLI's own plumbing (arguments, config, output
/// file) without compiling every fixture's kernels again in a process of its own.
#[test]
fn every_family_matches_transformers_through_the_example() {
    let exe = {
        let test = std::env::current_exe().unwrap();
        let dir = test.parent().and_then(Path::parent).unwrap();
        dir.join("examples").join(format!("moe_layer{}", std::env::consts::EXE_SUFFIX))
    };
    let out_dir = std::env::temp_dir().join(format!("moeflow-parity-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut families = std::collections::BTreeSet::new();
    let one_per_family: Vec<PathBuf> = fixtures()
        .into_iter()
        .filter(|dir| families.insert(config(dir)["model_type"].as_str().unwrap_or_default().to_string()))
        .collect();
    assert!(families.len() >= 7, "fixtures of every family: {families:?}");
    for adapter in common::wgpu_adapters() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        for dir in &one_per_family {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let out = out_dir.join(format!("{name}-{backend}.safetensors"));
            let run = Command::new(&exe)
                .args(["--adapter", &backend, "--prefix", "model.layers.0."])
                .arg("--weights")
                .arg(dir.join("weights.safetensors"))
                .arg("--config")
                .arg(dir.join("config.json"))
                .arg("--input")
                .arg(dir.join("x.safetensors"))
                .arg("--output")
                .arg(&out)
                .output()
                .expect("running moe_layer");
            let stdout = String::from_utf8_lossy(&run.stdout);
            assert!(
                run.status.success(),
                "{name} on {backend}: {stdout}\n{}",
                String::from_utf8_lossy(&run.stderr)
            );
            assert!(
                stdout.contains("layer: ") && stdout.contains(" top-"),
                "{name}: no routing description in\n{stdout}"
            );
            let bytes = std::fs::read(&out).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let got = Expected {
                y: floats(&st, "output"),
                ids: ids(&st, "topk_indices"),
                weights: floats(&st, "topk_weights"),
            };
            let hidden = st.tensor("output").unwrap().shape()[1];
            check(&format!("{name} via moe_layer on {backend}"), hidden, &got, &expected(dir));
        }
    }
    std::fs::remove_dir_all(&out_dir).ok();
}
