//! Parity with Hugging Face `transformers`: every fixture under `tests/fixtures/hf/` (tiny
//! random models of each supported family written by `save_pretrained`, their MoE block run by
//! transformers in float32; see `tools/hf_fixtures.py`) runs through the library and through
//! the `moe_layer` example on every adapter. Expert ids must match exactly (in moeflow's slot
//! order), outputs within 1e-5 of each row's scale, routing weights within 1e-5 relative.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use moeflow::Error;
use moeflow::layer::MoeLayer;
use moeflow::weights::{LoadOptions, load_input, load_layer};
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

#[test]
fn every_family_matches_transformers_through_the_library() {
    let ctxs = common::contexts();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let opts = LoadOptions { config: Some(config(&dir)), ..LoadOptions::default() };
        let loaded = load_layer(&std::fs::read(dir.join("weights.safetensors")).unwrap(), &name, &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (x, _, hidden) = load_input(&std::fs::read(dir.join("x.safetensors")).unwrap(), &name).unwrap();
        let want = expected(&dir);
        for ctx in &ctxs {
            let what = format!("{name} on {}", ctx.adapter().slug());
            let layer = match MoeLayer::new(ctx, loaded.config, &loaded.weights) {
                Ok(l) => l,
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

#[test]
fn every_family_matches_transformers_through_the_example() {
    let exe = {
        let test = std::env::current_exe().unwrap();
        let dir = test.parent().and_then(Path::parent).unwrap();
        dir.join("examples").join(format!("moe_layer{}", std::env::consts::EXE_SUFFIX))
    };
    let out_dir = std::env::temp_dir().join(format!("moeflow-parity-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    for adapter in common::wgpu_adapters() {
        let backend = format!("{:?}", adapter.get_info().backend).to_lowercase();
        for dir in fixtures() {
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
            check(&format!("{name} via moe_layer on {backend}"), hidden, &got, &expected(&dir));
        }
    }
    std::fs::remove_dir_all(&out_dir).ok();
}
