//! The error promise: bad input through the loader, the library API and the `moe_layer`
//! example is a clear `Err` naming the problem (or a correct result), never a panic, a hang,
//! lost data or a silently wrong answer. Each case asserts its exact outcome; the loader
//! cases build safetensors files in memory with every rank and zero dimension per tensor.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use moeflow::kernels::dispatch::OverflowPolicy;
use moeflow::kernels::gemm::{GemmVariant, WeightDtype};
use moeflow::kernels::routing::{Gating, GroupLimit, RouteConfig, RouteMode};
use moeflow::layer::{Capacity, ForwardIo, KernelChoice, MoeConfig, MoeLayer, MoeWeights};
use moeflow::synth::Synth;
use moeflow::weights::{
    Family, LoadOptions, OutTensor, RoutingFlags, check_output_path, load_input, load_layer,
    write_atomically, write_tensors,
};
use moeflow::{Context, DType, Error, Tensor};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};

const H: usize = 8;
const F: usize = 6;
const E: usize = 4;

/// A tensor to write: name, shape, dtype, raw bytes.
#[derive(Clone, Debug)]
struct T {
    name: String,
    shape: Vec<usize>,
    dtype: Dtype,
    bytes: Vec<u8>,
}

fn f32s(name: &str, shape: &[usize], seed: u64) -> T {
    let n = shape.iter().product();
    let v = Synth::new(seed).uniform(n, 0.5);
    T {
        name: name.into(),
        shape: shape.to_vec(),
        dtype: Dtype::F32,
        bytes: bytemuck::cast_slice(&v).to_vec(),
    }
}

fn serialize(ts: &[T]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = ts
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.bytes).expect("consistent test tensor"),
            )
        })
        .collect();
    safetensors::serialize(views, None).expect("serialising a test file")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Names {
    Mixtral,
    Mlp,
}

/// A complete layer with `names`' tensor names, optional bias, Qwen-style or DeepSeek-style
/// shared expert, and shared gate.
fn layer(names: Names, bias: bool, shared: Option<&str>, shared_gate: bool) -> Vec<T> {
    let mut ts = Vec::new();
    let (router, experts, parts) = match names {
        Names::Mixtral => ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.", ["w1", "w3", "w2"]),
        Names::Mlp => ("mlp.gate.weight", "mlp.experts.", ["gate_proj", "up_proj", "down_proj"]),
    };
    ts.push(f32s(router, &[E, H], 1));
    for i in 0..E {
        ts.push(f32s(&format!("{experts}{i}.{}.weight", parts[0]), &[F, H], 10 + i as u64));
        ts.push(f32s(&format!("{experts}{i}.{}.weight", parts[1]), &[F, H], 20 + i as u64));
        ts.push(f32s(&format!("{experts}{i}.{}.weight", parts[2]), &[H, F], 30 + i as u64));
    }
    if bias {
        ts.push(f32s("mlp.gate.e_score_correction_bias", &[E], 2));
    }
    if let Some(base) = shared {
        // Qwen's shared expert has a size of its own; DeepSeek's is n_shared * F.
        let fs = if base == "mlp.shared_expert." { 5 } else { F };
        ts.push(f32s(&format!("{base}gate_proj.weight"), &[fs, H], 3));
        ts.push(f32s(&format!("{base}up_proj.weight"), &[fs, H], 4));
        ts.push(f32s(&format!("{base}down_proj.weight"), &[H, fs], 5));
    }
    if shared_gate {
        ts.push(f32s("mlp.shared_expert_gate.weight", &[1, H], 6));
    }
    ts
}

fn mixtral() -> Vec<T> {
    layer(Names::Mixtral, false, None, false)
}
fn olmoe() -> Vec<T> {
    layer(Names::Mlp, false, None, false)
}
fn qwen2() -> Vec<T> {
    layer(Names::Mlp, false, Some("mlp.shared_expert."), true)
}
fn deepseek() -> Vec<T> {
    layer(Names::Mlp, true, Some("mlp.shared_experts."), false)
}

fn with(mut ts: Vec<T>, name: &str, f: impl FnOnce(&mut T)) -> Vec<T> {
    let t = ts.iter_mut().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}"));
    f(t);
    ts
}

fn without(mut ts: Vec<T>, name: &str) -> Vec<T> {
    ts.retain(|t| t.name != name);
    ts
}

/// Reshape a tensor (refilling its data to match).
fn reshape(ts: Vec<T>, name: &str, shape: &[usize]) -> Vec<T> {
    with(ts, name, |t| {
        let n: usize = shape.iter().product();
        t.shape = shape.to_vec();
        t.bytes = vec![0; n * 4];
        t.dtype = Dtype::F32;
    })
}

fn cfg_mixtral() -> Value {
    json!({"model_type": "mixtral", "num_local_experts": E, "num_experts_per_tok": 2, "intermediate_size": F,
           "hidden_size": H, "vocab_size": 32000, "rope_theta": 1e6, "hidden_act": "silu"})
}
fn cfg_olmoe() -> Value {
    json!({"model_type": "olmoe", "num_experts": E, "num_experts_per_tok": 2, "norm_topk_prob": false,
           "intermediate_size": F})
}
fn cfg_qwen2() -> Value {
    json!({"model_type": "qwen2_moe", "num_experts": E, "num_experts_per_tok": 2, "norm_topk_prob": false,
           "moe_intermediate_size": F, "shared_expert_intermediate_size": 5})
}
fn cfg_deepseek() -> Value {
    json!({"model_type": "deepseek_v3", "n_routed_experts": E, "num_experts_per_tok": 2, "n_group": 2,
           "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5, "n_shared_experts": 1,
           "moe_intermediate_size": F, "topk_method": "noaux_tc", "scoring_func": "sigmoid"})
}

fn set(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn unset(mut v: Value, key: &str) -> Value {
    v.as_object_mut().expect("object").remove(key);
    v
}

fn load(
    ts: &[T],
    config: Option<Value>,
    routing: RoutingFlags,
) -> moeflow::Result<moeflow::weights::LoadedLayer> {
    load_layer(&serialize(ts), "test", &LoadOptions { config, routing, ..LoadOptions::default() })
}

fn expect_err<T: std::fmt::Debug>(what: &str, r: moeflow::Result<T>, needles: &[&str]) {
    match r {
        Ok(v) => panic!("{what}: expected an error mentioning {needles:?}, got Ok({v:?})"),
        Err(e) => {
            let msg = e.to_string();
            for n in needles {
                assert!(msg.contains(n), "{what}: error `{msg}` does not mention `{n}`");
            }
        }
    }
}

fn k2() -> RoutingFlags {
    RoutingFlags { k: Some(2), ..RoutingFlags::default() }
}

#[test]
fn malformed_files_are_errors() {
    let good = serialize(&mixtral());
    let opts = LoadOptions { routing: k2(), ..LoadOptions::default() };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty file", Vec::new()),
        ("random bytes", (0..200u8).collect()),
        ("header length past the file", {
            let mut b = good.clone();
            b.truncate(12);
            b
        }),
        ("truncated data", good[..good.len() - 7].to_vec()),
        ("header not JSON", {
            let mut b = 16u64.to_le_bytes().to_vec();
            b.extend_from_slice(b"not json at all!");
            b
        }),
    ];
    for (what, bytes) in cases {
        expect_err(
            what,
            load_layer(&bytes, "bad.safetensors", &opts),
            &["bad.safetensors", "not a readable safetensors"],
        );
        expect_err(
            what,
            load_input(&bytes, "bad.safetensors"),
            &["bad.safetensors", "not a readable safetensors"],
        );
    }
    assert!(load_layer(&good, "good", &opts).is_ok(), "the untouched file loads");
}

#[test]
fn every_rank_and_zero_dimension_of_every_tensor_is_an_error() {
    let base = |names: Names| match names {
        Names::Mixtral => (mixtral(), None, k2()),
        Names::Mlp => (deepseek(), Some(cfg_deepseek()), RoutingFlags::default()),
    };
    let tensors: Vec<(Names, &str)> = vec![
        (Names::Mixtral, "block_sparse_moe.gate.weight"),
        (Names::Mixtral, "block_sparse_moe.experts.0.w1.weight"),
        (Names::Mixtral, "block_sparse_moe.experts.2.w3.weight"),
        (Names::Mixtral, "block_sparse_moe.experts.3.w2.weight"),
        (Names::Mlp, "mlp.gate.weight"),
        (Names::Mlp, "mlp.experts.0.gate_proj.weight"),
        (Names::Mlp, "mlp.experts.1.up_proj.weight"),
        (Names::Mlp, "mlp.experts.3.down_proj.weight"),
        (Names::Mlp, "mlp.gate.e_score_correction_bias"),
        (Names::Mlp, "mlp.shared_experts.gate_proj.weight"),
        (Names::Mlp, "mlp.shared_experts.up_proj.weight"),
        (Names::Mlp, "mlp.shared_experts.down_proj.weight"),
    ];
    let shapes: Vec<Vec<usize>> =
        vec![vec![], vec![7], vec![2, 3, 4], vec![0, H], vec![E, 0], vec![0], vec![1, 1, 1, 1]];
    let mut n = 0;
    for (names, name) in &tensors {
        for shape in &shapes {
            let (ts, config, flags) = base(*names);
            let what = format!("{name} as {shape:?}");
            expect_err(&what, load(&reshape(ts, name, shape), config, flags), &[name]);
            n += 1;
        }
    }
    // The Qwen shared-expert gate too.
    for shape in [vec![], vec![H], vec![2, H], vec![1, 0], vec![0, H], vec![1, H, 1]] {
        let ts = reshape(qwen2(), "mlp.shared_expert_gate.weight", &shape);
        expect_err(
            &format!("shared gate {shape:?}"),
            load(&ts, Some(cfg_qwen2()), RoutingFlags::default()),
            &["mlp.shared_expert_gate.weight"],
        );
        n += 1;
    }
    assert!(n >= 90, "{n} shape cases");
}

#[test]
fn inconsistent_weights_are_errors() {
    let flags = k2();
    expect_err(
        "no router",
        load(&without(mixtral(), "block_sparse_moe.gate.weight"), None, flags.clone()),
        &["no router tensor"],
    );
    expect_err(
        "missing expert tensor",
        load(&without(mixtral(), "block_sparse_moe.experts.2.w3.weight"), None, flags.clone()),
        &["block_sparse_moe.experts.2.w3.weight", &format!("[{F}, {H}]")],
    );
    let mut extra = mixtral();
    extra.push(f32s("block_sparse_moe.experts.4.w1.weight", &[F, H], 9));
    expect_err(
        "expert past the router",
        load(&extra, None, flags.clone()),
        &["expert 4", "router has 4 experts"],
    );
    let mut extra = olmoe();
    extra.push(f32s("mlp.experts.17.down_proj.weight", &[H, F], 9));
    expect_err("far expert", load(&extra, Some(cfg_olmoe()), RoutingFlags::default()), &["expert 17"]);
    let mixed = with(mixtral(), "block_sparse_moe.experts.1.w2.weight", |t| {
        let v: Vec<f32> = bytemuck::cast_slice(&t.bytes).to_vec();
        t.bytes = v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect();
        t.dtype = Dtype::BF16;
    });
    expect_err("mixed expert dtypes", load(&mixed, None, flags.clone()), &["mix dtypes", "--dtype"]);
    let converted = load_layer(
        &serialize(&mixed),
        "mixed",
        &LoadOptions { routing: flags.clone(), dtype: Some(WeightDtype::Bf16), ..LoadOptions::default() },
    )
    .expect("an explicit dtype converts mixed experts");
    assert_eq!(converted.config.weight_dtype, WeightDtype::Bf16);
    for dtype in [Dtype::I32, Dtype::F64, Dtype::U8, Dtype::I64] {
        let ts = with(mixtral(), "block_sparse_moe.experts.0.w3.weight", |t| {
            t.dtype = dtype;
            t.bytes = vec![0; F * H * dtype.bitsize() / 8];
        });
        expect_err(
            &format!("{dtype:?} expert"),
            load(&ts, None, flags.clone()),
            &["block_sparse_moe.experts.0.w3.weight", "f32, f16, bf16 and FP8 e4m3"],
        );
    }
    let two_layers: Vec<T> = mixtral()
        .into_iter()
        .flat_map(|t| {
            ["model.layers.0.", "model.layers.1."].map(|p| T { name: format!("{p}{}", t.name), ..t.clone() })
        })
        .collect();
    expect_err(
        "two layers, no prefix",
        load(&two_layers, None, flags.clone()),
        &["several MoE layers", "--prefix"],
    );
    let one = load_layer(
        &serialize(&two_layers),
        "two",
        &LoadOptions {
            prefix: Some("model.layers.1.".into()),
            routing: flags.clone(),
            ..LoadOptions::default()
        },
    )
    .expect("a prefix picks one layer");
    assert_eq!(one.prefix, "model.layers.1.");
    expect_err(
        "prefix of no layer",
        load_layer(
            &serialize(&two_layers),
            "two",
            &LoadOptions { prefix: Some("model.layers.9.".into()), routing: flags, ..LoadOptions::default() },
        ),
        &["missing tensor", "model.layers.9.mlp.gate.weight"],
    );
}

#[test]
fn config_keys_are_read_per_family_and_contradictions_are_errors() {
    let none = RoutingFlags::default;
    let cases: Vec<(&str, Vec<T>, Value, &[&str])> = vec![
        (
            "unknown model_type",
            olmoe(),
            set(cfg_olmoe(), "model_type", json!("phimoe")),
            &["model_type `phimoe`"],
        ),
        ("no model_type", olmoe(), unset(cfg_olmoe(), "model_type"), &["neither `model_type`"]),
        (
            "unknown architecture",
            olmoe(),
            set(unset(cfg_olmoe(), "model_type"), "architectures", json!(["FooForCausalLM"])),
            &["FooForCausalLM"],
        ),
        ("expert count", olmoe(), set(cfg_olmoe(), "num_experts", json!(6)), &["6 experts", "num_experts"]),
        ("k = 0", olmoe(), set(cfg_olmoe(), "num_experts_per_tok", json!(0)), &["num_experts_per_tok = 0"]),
        ("k > E", olmoe(), set(cfg_olmoe(), "num_experts_per_tok", json!(5)), &["num_experts_per_tok = 5"]),
        (
            "k not an integer",
            olmoe(),
            set(cfg_olmoe(), "num_experts_per_tok", json!("two")),
            &["num_experts_per_tok", "integer"],
        ),
        (
            "k negative",
            olmoe(),
            set(cfg_olmoe(), "num_experts_per_tok", json!(-2)),
            &["num_experts_per_tok", "integer"],
        ),
        (
            "norm not a bool",
            olmoe(),
            set(cfg_olmoe(), "norm_topk_prob", json!("yes")),
            &["norm_topk_prob", "true or false"],
        ),
        (
            "sparsemixer",
            olmoe(),
            set(cfg_olmoe(), "scoring_func", json!("sparsemixer")),
            &["scoring_func", "sparsemixer"],
        ),
        (
            "sigmoid on qwen3",
            olmoe(),
            set(set(cfg_olmoe(), "model_type", json!("qwen3_moe")), "scoring_func", json!("sigmoid")),
            &["scoring_func", "qwen3_moe"],
        ),
        (
            "softmax on deepseek_v3",
            deepseek(),
            set(cfg_deepseek(), "scoring_func", json!("softmax")),
            &["scoring_func", "deepseek_v3"],
        ),
        (
            "topk_method on v3",
            deepseek(),
            set(cfg_deepseek(), "topk_method", json!("greedy")),
            &["topk_method", "noaux_tc"],
        ),
        (
            "lone n_group",
            deepseek(),
            unset(cfg_deepseek(), "topk_group"),
            &["`n_group` without `topk_group`"],
        ),
        (
            "lone topk_group",
            deepseek(),
            unset(cfg_deepseek(), "n_group"),
            &["`topk_group` without `n_group`"],
        ),
        (
            "groups not dividing E",
            deepseek(),
            set(set(cfg_deepseek(), "n_group", json!(3)), "topk_group", json!(1)),
            &["does not divide"],
        ),
        (
            "groups on olmoe",
            olmoe(),
            set(set(cfg_olmoe(), "n_group", json!(2)), "topk_group", json!(1)),
            &["n_group = 2", "olmoe"],
        ),
        (
            "scale on mixtral",
            mixtral(),
            set(cfg_mixtral(), "routed_scaling_factor", json!(2.0)),
            &["routed_scaling_factor", "mixtral"],
        ),
        (
            "scale not finite",
            deepseek(),
            set(cfg_deepseek(), "routed_scaling_factor", json!("inf")),
            &["routed_scaling_factor", "finite"],
        ),
        ("gelu experts", mixtral(), set(cfg_mixtral(), "hidden_act", json!("gelu")), &["hidden_act", "gelu"]),
        (
            "ffn size",
            mixtral(),
            set(cfg_mixtral(), "intermediate_size", json!(7)),
            &["intermediate_size", "= 7"],
        ),
        (
            "shared size",
            qwen2(),
            set(cfg_qwen2(), "shared_expert_intermediate_size", json!(9)),
            &["shared expert", "9"],
        ),
        (
            "shared count",
            deepseek(),
            set(cfg_deepseek(), "n_shared_experts", json!(2)),
            &["shared expert", "12"],
        ),
        (
            "no shared expert but config has one",
            layer(Names::Mlp, true, None, false),
            cfg_deepseek(),
            &["shared expert", "have none"],
        ),
        (
            "mixtral without renormalisation",
            mixtral(),
            set(cfg_mixtral(), "norm_topk_prob", json!(false)),
            &["mixtral always renormalises"],
        ),
        (
            "deepseek_v2 renormalising",
            layer(Names::Mlp, false, Some("mlp.shared_experts."), false),
            json!({"model_type": "deepseek_v2", "n_routed_experts": E, "num_experts_per_tok": 2, "norm_topk_prob": true}),
            &["norm_topk_prob = true for deepseek_v2"],
        ),
        (
            "group_limited_greedy",
            layer(Names::Mlp, false, Some("mlp.shared_experts."), false),
            json!({"model_type": "deepseek_v2", "n_routed_experts": E, "num_experts_per_tok": 2, "topk_method": "group_limited_greedy"}),
            &["group_limited_greedy"],
        ),
        (
            "bias on qwen3",
            layer(Names::Mlp, true, None, false),
            set(cfg_olmoe(), "model_type", json!("qwen3_moe")),
            &["e_score_correction_bias", "qwen3_moe"],
        ),
        (
            "shared expert on mixtral",
            layer(Names::Mixtral, false, Some("mlp.shared_expert."), true),
            cfg_mixtral(),
            &["shared expert", "mixtral"],
        ),
        (
            "shared gate on deepseek",
            layer(Names::Mlp, true, Some("mlp.shared_experts."), true),
            cfg_deepseek(),
            &["shared_expert_gate", "deepseek_v3"],
        ),
        (
            "qwen2 shared without gate",
            layer(Names::Mlp, false, Some("mlp.shared_expert."), false),
            cfg_qwen2(),
            &["qwen2_moe", "gate"],
        ),
        (
            "qwen2 DeepSeek-style shared names",
            layer(Names::Mlp, false, Some("mlp.shared_experts."), true),
            cfg_qwen2(),
            &["mlp.shared_experts.", "qwen2_moe"],
        ),
        (
            "mixtral names for qwen3",
            mixtral(),
            set(cfg_olmoe(), "model_type", json!("qwen3_moe")),
            &["qwen3_moe", "block_sparse_moe"],
        ),
        ("mlp names for mixtral", olmoe(), cfg_mixtral(), &["mixtral", "`mlp.*`"]),
    ];
    let n = cases.len();
    for (what, ts, config, needles) in cases {
        expect_err(what, load(&ts, Some(config), none()), needles);
    }
    assert!(n >= 30);
    // Flags that contradict the config.
    let flag = |r: RoutingFlags| load(&olmoe(), Some(cfg_olmoe()), r);
    expect_err(
        "family flag",
        flag(RoutingFlags { family: Some(Family::Qwen3Moe), ..none() }),
        &["family", "contradicts"],
    );
    expect_err(
        "k flag",
        flag(RoutingFlags { k: Some(3), ..none() }),
        &["num_experts_per_tok", "contradicts"],
    );
    expect_err(
        "norm flag",
        flag(RoutingFlags { norm_topk_prob: Some(true), ..none() }),
        &["norm_topk_prob", "contradicts"],
    );
    // Agreeing flags are fine, and unrelated keys are ignored.
    let ok =
        flag(RoutingFlags { k: Some(2), norm_topk_prob: Some(false), ..none() }).expect("agreeing flags");
    assert!(!ok.config.route.renormalize);
    let noisy =
        set(set(cfg_mixtral(), "rope_scaling", json!({"type": "yarn"})), "attention_dropout", json!(0.1));
    assert!(load(&mixtral(), Some(noisy), none()).is_ok(), "keys unrelated to the MoE block are ignored");
}

#[test]
fn family_defaults_follow_transformers() {
    let none = RoutingFlags::default();
    // Absent keys take the config class's defaults.
    let q = load(&olmoe(), Some(unset(cfg_olmoe(), "norm_topk_prob")), none.clone()).unwrap();
    assert!(!q.config.route.renormalize, "olmoe's norm_topk_prob defaults to false");
    let m = load(&mixtral(), Some(cfg_mixtral()), none.clone()).unwrap();
    assert!(m.config.route.renormalize && m.config.route.gating == Gating::Softmax);
    let d = load(
        &deepseek(),
        Some(unset(unset(unset(cfg_deepseek(), "scoring_func"), "norm_topk_prob"), "routed_scaling_factor")),
        none.clone(),
    )
    .unwrap();
    assert_eq!(
        d.config.route.gating,
        Gating::Sigmoid,
        "deepseek_v3 scores with sigmoid without a scoring_func key"
    );
    assert!(d.config.route.renormalize && d.config.route.scale == 2.5 && d.config.route.bias);
    assert_eq!(d.config.route.groups, Some(GroupLimit { n_group: 2, topk_group: 1 }));
    let d1 = load(
        &deepseek(),
        Some(set(set(cfg_deepseek(), "n_group", json!(1)), "topk_group", json!(1))),
        none.clone(),
    )
    .unwrap();
    assert_eq!(d1.config.route.groups, None, "n_group = 1 is no group limit");
    let by_arch = set(unset(cfg_olmoe(), "model_type"), "architectures", json!(["OlmoeForCausalLM"]));
    assert_eq!(load(&olmoe(), Some(by_arch), none).unwrap().routing.family, Family::Olmoe);
}

#[test]
fn without_a_config_families_that_need_values_are_refused() {
    let none = RoutingFlags::default;
    expect_err("mixtral without k", load(&mixtral(), None, none()), &["experts per token", "--k"]);
    assert!(load(&mixtral(), None, k2()).is_ok(), "mixtral names decide the semantics");
    expect_err("mlp names", load(&olmoe(), None, k2()), &["fit several families", "--family"]);
    let olmoe_flags = RoutingFlags { family: Some(Family::Olmoe), ..k2() };
    expect_err("olmoe without norm", load(&olmoe(), None, olmoe_flags.clone()), &["norm_topk_prob"]);
    let ok = load(&olmoe(), None, RoutingFlags { norm_topk_prob: Some(true), ..olmoe_flags }).unwrap();
    assert!(ok.config.route.renormalize);
    expect_err("deepseek without groups", load(&deepseek(), None, k2()), &["deepseek_v3", "n_group"]);
    let groups = RoutingFlags { groups: Some(GroupLimit { n_group: 2, topk_group: 1 }), ..k2() };
    expect_err("deepseek without norm", load(&deepseek(), None, groups.clone()), &["norm_topk_prob"]);
    let norm = RoutingFlags { norm_topk_prob: Some(true), ..groups };
    expect_err("deepseek without scale", load(&deepseek(), None, norm.clone()), &["routed_scaling_factor"]);
    let full = load(&deepseek(), None, RoutingFlags { routed_scaling_factor: Some(2.5), ..norm }).unwrap();
    assert_eq!((full.config.route.gating, full.config.route.scale), (Gating::Sigmoid, 2.5));
    let v2 = layer(Names::Mlp, false, Some("mlp.shared_experts."), false);
    expect_err(
        "deepseek_v2 without scale",
        load(&v2, None, RoutingFlags { family: Some(Family::DeepseekV2), ..k2() }),
        &["routed_scaling_factor"],
    );
}

#[test]
fn bad_inputs_are_errors() {
    let x = |shape: &[usize], dtype: Dtype| {
        let n: usize = shape.iter().product();
        serialize(&[T {
            name: "x".into(),
            shape: shape.to_vec(),
            dtype,
            bytes: vec![0; n * dtype.bitsize() / 8],
        }])
    };
    expect_err("rank 3", load_input(&x(&[2, 3, 4], Dtype::F32), "x"), &["[tokens, hidden]"]);
    expect_err("rank 0", load_input(&x(&[], Dtype::F32), "x"), &["[tokens, hidden]"]);
    expect_err("zero hidden", load_input(&x(&[3, 0], Dtype::F32), "x"), &["[tokens, hidden]"]);
    expect_err("i32", load_input(&x(&[3, 4], Dtype::I32), "x"), &["I32"]);
    let two = serialize(&[f32s("a", &[1, 2], 1), f32s("b", &[1, 2], 2)]);
    expect_err("no x among two", load_input(&two, "in"), &["no tensor `x`"]);
    let (v, t, h) = load_input(&x(&[3, 4], Dtype::F32), "x").unwrap();
    assert_eq!((v.len(), t, h), (12, 3, 4));
    let (_, t, h) = load_input(&x(&[4], Dtype::F32), "x").unwrap();
    assert_eq!((t, h), (1, 4), "a single row is one token");
}

/// Config and weight mistakes through the library API.
#[test]
fn api_errors_name_the_problem() {
    let Some(ctx) = common::contexts().into_iter().next() else {
        return;
    };
    let base = MoeConfig::new(16, 8, 4, 2);
    let w = Synth::new(1).moe_weights(&base);
    let new = |c: MoeConfig, w: &MoeWeights| MoeLayer::new(&ctx, c, w);
    expect_err(
        "k = 0",
        new(MoeConfig { route: RouteConfig { k: 0, ..base.route }, ..base }, &w),
        &["k must be at least 1"],
    );
    expect_err(
        "k > E",
        new(MoeConfig { route: RouteConfig { k: 5, ..base.route }, ..base }, &w),
        &["larger than the number of experts"],
    );
    expect_err(
        "E = 0",
        new(MoeConfig { route: RouteConfig { experts: 0, ..base.route }, ..base }, &w),
        &["experts must be at least 1"],
    );
    expect_err(
        "H = 0",
        new(MoeConfig { route: RouteConfig { hidden: 0, ..base.route }, ..base }, &w),
        &["hidden size"],
    );
    expect_err("F = 0", new(MoeConfig { ffn: 0, ..base }, &w), &["FFN sizes"]);
    expect_err("shared 0", new(MoeConfig { shared_ffn: Some(0), ..base }, &w), &["FFN sizes"]);
    expect_err(
        "gate without shared",
        new(MoeConfig { shared_gate: true, ..base }, &w),
        &["shared_gate needs"],
    );
    expect_err(
        "bound 0",
        new(MoeConfig { capacity: Capacity::Bounded { bound: 0, policy: OverflowPolicy::Drop }, ..base }, &w),
        &["capacity bound"],
    );
    expect_err(
        "NaN scale",
        new(MoeConfig { route: RouteConfig { scale: f32::NAN, ..base.route }, ..base }, &w),
        &["scale must be finite"],
    );
    expect_err(
        "E > 1024",
        new(MoeConfig { route: RouteConfig { experts: 2000, ..base.route }, ..base }, &w),
        &["experts is 2000"],
    );
    expect_err(
        "k > 32",
        new(MoeConfig { route: RouteConfig { experts: 64, k: 33, ..base.route }, ..base }, &w),
        &["k is 33"],
    );
    let short = MoeWeights { router: vec![0.0; 3], ..w.clone() };
    expect_err("short router", new(base, &short), &["router"]);
    let short = MoeWeights { down: vec![0.0; 3], ..w.clone() };
    expect_err("short down", new(base, &short), &["experts down"]);
    expect_err(
        "bias without config",
        new(base, &MoeWeights { bias: Some(vec![0.0; 4]), ..w.clone() }),
        &["bias"],
    );
    let layer = new(base, &w).unwrap();
    let x = ctx.upload("x", &[0.0f32; 16 * 3]).unwrap();
    let y = ctx.zeroed("y", 16 * 3 * 4).unwrap();
    expect_err("x too small", layer.io(&x, &y, 4), &["`x`", "at least 256 bytes"]);
    expect_err("y too small", layer.io(&x, &ctx.zeroed("y", 8).unwrap(), 3), &["`y`"]);
    expect_err("tokens * k past u32", layer.workspace(&ctx, u32::MAX), &["tokens * k"]);
    expect_err("a workspace for no tokens", layer.workspace(&ctx, 0), &["at least 1"]);
    // Tensors of the wrong shape or element type, named.
    let t = |view, shape, dtype| Tensor::new(view, shape, dtype).unwrap();
    let (x3, y3) = (t(&x, [3, 16], DType::F32), t(&y, [3, 16], DType::F32));
    let plan = |io| layer.plan(&ctx, io).map(|_| ());
    expect_err("no rows", plan(ForwardIo::new(t(&x, [0, 16], DType::F32), y3)), &["at least 1", "`x`"]);
    expect_err("x of u32", plan(ForwardIo::new(t(&x, [3, 16], DType::U32), y3)), &["`x`", "u32 [3, 16]"]);
    expect_err("x not H wide", plan(ForwardIo::new(t(&x, [4, 12], DType::F32), y3)), &["`x`", "f32 [4, 16]"]);
    expect_err("y of other rows", plan(ForwardIo::new(x3, t(&y, [2, 16], DType::F32))), &["`y`", "[2, 16]"]);
    let (ib, wb) = (ctx.zeroed("indices", 3 * 2 * 4).unwrap(), ctx.zeroed("weights", 3 * 2 * 4).unwrap());
    let io = ForwardIo::new(x3, y3);
    let bad = io.with_routing(t(&ib, [3, 2], DType::F32), t(&wb, [3, 2], DType::F32));
    expect_err("f32 indices", plan(bad), &["`indices`", "u32 [3, 2]"]);
    let bad = io.with_routing(t(&ib, [3, 2], DType::U32), t(&wb, [2, 3], DType::F32));
    expect_err("weights of another shape", plan(bad), &["`weights`", "f32 [3, 2]"]);
    let logits = ctx.zeroed("logits", 3 * 4 * 4).unwrap();
    let fused = MoeConfig { route_mode: RouteMode::Fused { write_logits: false }, ..base };
    let quiet = new(fused, &w).unwrap();
    let asked = io.with_logits(t(&logits, [3, 4], DType::F32));
    expect_err("logits of a fused route", quiet.plan(&ctx, asked), &["logits", "does not write them"]);
    expect_err("logits too narrow", plan(io.with_logits(t(&logits, [3, 2], DType::F32))), &["`logits`"]);
    expect_err("a tensor past its view", Tensor::f32(&ib, [4, 2]), &["at least 32 bytes", "24 bytes"]);
    expect_err("forward of a partial row", layer.forward_host(&ctx, &[0.0; 17]), &["rows of hidden"]);
}

#[test]
fn buffers_device_loss_and_foreign_resources_are_errors() {
    for adapter in common::wgpu_adapters() {
        let open = || Context::from_adapter(&adapter).expect("a device");
        let ctx = open();
        let name = ctx.adapter().slug();
        let max = ctx.limits().max_buffer_size;
        expect_err(&name, ctx.zeroed("huge", max + 4), &["buffer `huge`", "max_buffer_size"]);
        let data = ctx.upload("data", &[1u32, 2, 3, 4]).unwrap();
        expect_err(&name, ctx.read_back::<u32>(&data, 5), &["readback", "20 bytes"]);
        assert_eq!(ctx.read_back::<u32>(&data, 4).unwrap(), vec![1, 2, 3, 4]);
        let plain = ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("storage only"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        expect_err(&name, ctx.read_back::<u32>(&plain, 4), &["without COPY_SRC"]);
        let mapped = ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("mapped"),
            size: 16,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::MAP_WRITE,
            mapped_at_creation: true,
        });
        expect_err(&name, ctx.read_back::<u32>(&mapped, 4), &["still mapped"]);
        let gone = ctx.upload("gone", &[5u32; 4]).unwrap();
        gone.destroy();
        expect_err(&name, ctx.read_back::<u32>(&gone, 4), &["destroyed"]);

        // A buffer of another context (another device of the same adapter) is refused, both
        // when read back and when bound into a plan.
        // (On GL every context has an instance of its own, where wgpu cannot tell buffers
        // apart; see `moeflow::instance`.)
        let other = open();
        let foreign = other.upload("foreign", &[7u32; 4]).unwrap();
        let _own = ctx.upload("own", &[9u32; 4]).unwrap();
        let cfg = MoeConfig::new(16, 8, 4, 2);
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)).unwrap();
        let y = ctx.zeroed("y", 16 * 3 * 4).unwrap();
        if adapter.get_info().backend != wgpu::Backend::Gl {
            expect_err(&name, ctx.read_back::<u32>(&foreign, 4), &["doesn't match Device"]);
            let fx = other.upload("foreign x", &[0.5f32; 16 * 3]).unwrap();
            expect_err(&name, layer.plan(&ctx, layer.io(&fx, &y, 3).unwrap()), &["doesn't match Device"]);
        }

        // The other device is unaffected by this one's loss.
        assert_eq!(other.read_back::<u32>(&foreign, 4).unwrap(), vec![7; 4]);
    }
}

/// Sizes whose arithmetic would wrap in a release build are refused, naming the sizes: a
/// tensor of 2^31 × 2^31 f32, a buffer of u64::MAX bytes, a read-back of usize::MAX / 4 + 2
/// values, expert weights of 2^22 × 2^22 × 2^22 values (which match four values once wrapped),
/// quantised blocks of as many rows, and streamed weights of 256 TiB (refused before their
/// chunk list is made).
#[test]
fn size_arithmetic_cannot_wrap() {
    use moeflow::kernels::gemm::{ExpertWeights, QuantisedValues};
    for ctx in common::contexts() {
        let name = ctx.adapter().slug();
        let data = ctx.upload("data", &[1.0f32; 4]).unwrap();
        let huge = 1u32 << 31;
        expect_err(&name, Tensor::f32(&data, [huge, huge]), &["2147483648 × 2147483648 × 4 does not fit"]);
        expect_err(&name, ctx.zeroed("x", u64::MAX), &["buffer `x`", "do not fit in 64 bits"]);
        expect_err(&name, ctx.read_back::<f32>(&data, usize::MAX / 4 + 2), &["readback", "does not fit"]);
        let e = 1u32 << 22;
        expect_err(
            &name,
            ExpertWeights::from_f32(&ctx, &[0.0; 4], WeightDtype::F32, e, e, e),
            &["expert weights [4194304, 4194304, 4194304]", "does not fit"],
        );
        // Streamed weights read their values after planning their chunks: a shape past memory
        // is refused before any list of chunks is made.
        let never = |_| -> moeflow::Result<moeflow::kernels::gemm::StoredValues<'static>> { unreachable!() };
        expect_err(
            &name,
            ExpertWeights::stream(&ctx, WeightDtype::F32, [1 << 20, 1 << 20, 64], never, |_| {}),
            &["65,536 buffers"],
        );
        let q = QuantisedValues::Q8_0(&[0u8; 34]);
        expect_err(&name, ExpertWeights::from_quantised(&ctx, q, u32::MAX, u32::MAX, 32), &["does not fit"]);
    }
}

/// Views that a plan writes may not share a byte with another view it binds: x and y as one
/// view, routing outputs inside y, a caller's workspace over y, and the dense entry points with
/// x = y are refused naming both views; disjoint views of one buffer run bitwise as separate
/// buffers do.
#[test]
fn overlapping_views_are_refused() {
    use moeflow::kernels::gemm::{DenseKernel, ExpertWeights, GemmOrder, plan_dense};
    use moeflow::pipeline::BufferView;
    use moeflow::workspace::{WORKSPACE_USAGE, Workspace};
    common::side_by_side(&common::contexts(), |_, ctx| {
        let name = ctx.adapter().slug();
        let cfg = MoeConfig::new(16, 8, 4, 2);
        let layer = MoeLayer::new(ctx, cfg, &Synth::new(1).moe_weights(&cfg)).unwrap();
        let xs = Synth::new(2).uniform(16 * 3, 1.0);
        let want = layer.forward_host(ctx, &xs).unwrap();
        // x in the first 192 bytes, y in the next 192.
        let one = ctx.upload("x and y", &[xs.clone(), vec![0.0; 16 * 3]].concat()).unwrap();
        let at = |offset: u64, shape: [u32; 2]| Tensor::f32(BufferView::new(&one, offset, 192), shape);
        let (x, y) = (at(0, [3, 16]).unwrap(), at(192, [3, 16]).unwrap());

        expect_err(&name, layer.plan(ctx, ForwardIo::new(x, x)), &["`x`", "`y`", "overlapping views"]);
        let shifted = at(64, [3, 16]).unwrap();
        expect_err(
            &name,
            layer.plan(ctx, ForwardIo::new(x, shifted)),
            &["`x` (bytes 0 .. 192)", "`y` (bytes 64 .. 256)"],
        );
        // Routing indices in y's first bytes.
        let weights = ctx.zeroed("weights", 24).unwrap();
        let routing = ForwardIo::new(x, y).with_routing(
            Tensor::u32(BufferView::new(&one, 192, 24), [3, 2]).unwrap(),
            Tensor::f32(&weights, [3, 2]).unwrap(),
        );
        expect_err(&name, layer.plan(ctx, routing), &["`y`", "`indices`"]);

        // A caller's workspace over y.
        let layout = layer.workspace(ctx, 3).unwrap();
        let big = ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("workspace and y"),
            size: layout.bytes() + 192,
            usage: WORKSPACE_USAGE,
            mapped_at_creation: false,
        });
        let ws = Workspace::new(ctx, &layout, &big).unwrap();
        let over = Tensor::f32(BufferView::new(&big, 0, 192), [3, 16]).unwrap();
        expect_err(&name, layer.plan_in(ctx, ForwardIo::new(x, over), &ws), &["`y`", "is written"]);

        // Disjoint views of one buffer: the bits of the host forward.
        let plan = layer.plan(ctx, ForwardIo::new(x, y)).unwrap();
        ctx.run(&plan.dispatches()).unwrap();
        let got: Vec<f32> = ctx.read_back(y, 16 * 3).unwrap();
        assert_eq!(common::bits(&got), common::bits(&want.y), "{name}: disjoint views of one buffer");

        // The dense GEMM in place.
        let w = ExpertWeights::from_f32(ctx, &[0.5; 16 * 16], WeightDtype::F32, 1, 16, 16).unwrap();
        let dense = plan_dense(ctx, &w, 3, x.view(), x.view(), DenseKernel::Rowwise, GemmOrder::Strict);
        expect_err(&name, dense, &["`x`", "`y`", "overlapping views"]);
    });
}

/// Where a property case puts one tensor: in the shared buffer at a slot (and 4 bytes past
/// it, off the device's alignment, when `skew`), or in a buffer of its own.
#[derive(Clone, Copy, Debug)]
struct Place {
    shared: bool,
    slot: u64,
    skew: bool,
}

fn place() -> impl proptest::strategy::Strategy<Value = Place> {
    use proptest::prelude::*;
    (prop::bool::weighted(0.6), 0u64..12, prop::bool::weighted(0.05)).prop_map(|(shared, slot, skew)| Place {
        shared,
        slot,
        skew,
    })
}

/// A random plan: its maximum token count, the count it runs, and where x, y, the caller's
/// routing tensors and the workspace lie (and, rarely, x given as u32).
#[derive(Clone, Debug)]
struct PlanCase {
    max_tokens: u32,
    count: u32,
    x: Place,
    y: Place,
    routing: Option<(Place, Place)>,
    workspace: Option<Place>,
    x_as_u32: bool,
}

fn plan_case() -> impl proptest::strategy::Strategy<Value = PlanCase> {
    use proptest::prelude::*;
    let views = (
        place(),
        place(),
        prop::option::weighted(0.4, (place(), place())),
        prop::option::weighted(0.3, place()),
    );
    (1u32..=4, views, prop::bool::weighted(0.05)).prop_flat_map(
        |(max_tokens, (x, y, routing, workspace), x_as_u32)| {
            // Mostly a count the plan runs; now and then an empty batch or one past the maximum.
            prop_oneof![6 => 1..=max_tokens, 1 => Just(0), 1 => Just(max_tokens + 1)]
                .prop_map(move |count| PlanCase { max_tokens, count, x, y, routing, workspace, x_as_u32 })
        },
    )
}

/// The plan-once API under random views: random maximum and live counts, tensors at random
/// slots of one shared buffer (aliasing, overlapping, off the offset alignment) or in buffers
/// of their own, the caller's routing tensors or not, a caller's workspace in the shared buffer
/// or the plan's own, and now and then a tensor of the wrong element type. Each case is either
/// an `Err` (at planning or recording) or a forward whose y, indices and weights are the bits
/// of the exact plan's (`forward_host`, every tensor in a buffer of its own). 64 cases per
/// adapter with a fixed seed; the layer's kernels are built once.
#[test]
fn random_views_give_an_error_or_the_exact_plans_bits() {
    use moeflow::pipeline::BufferView;
    use moeflow::workspace::{WORKSPACE_USAGE, Workspace};
    use proptest::prelude::{prop_assert, prop_assert_eq};
    use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
    let (h, k) = (16u32, 2u32);
    let cfg = MoeConfig::new(h, 8, 4, k);
    let xs = Synth::new(3).uniform(4 * h as usize, 1.0);
    for ctx in common::contexts() {
        let name = ctx.adapter().slug();
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)).unwrap();
        let exact: Vec<_> =
            (1..=4).map(|n| layer.forward_host(&ctx, &xs[..n * h as usize]).unwrap()).collect();
        let align = u64::from(ctx.device().limits().min_storage_buffer_offset_alignment).max(4);
        let slot_bytes = 256u64.next_multiple_of(align);
        let layout = layer.workspace(&ctx, 4).unwrap();
        let buffer = |bytes: u64| {
            ctx.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("property case"),
                size: bytes,
                usage: WORKSPACE_USAGE,
                mapped_at_creation: false,
            })
        };
        let config = Config {
            cases: 48,
            rng_seed: RngSeed::Fixed(51),
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        // Cases that ran a forward, and plans refused for overlapping views.
        let (ran, overlapped) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let outcome = runner.run(&plan_case(), |c| {
            let shared = buffer(14 * slot_bytes + layout.bytes());
            let own: Vec<wgpu::Buffer> = (0..5).map(|_| buffer(slot_bytes + 4)).collect();
            let view = |p: Place, i: usize, bytes: u64| {
                let skew = if p.skew { 4 } else { 0 };
                if p.shared {
                    BufferView::new(&shared, p.slot * slot_bytes + skew, bytes)
                } else {
                    BufferView::new(&own[i], skew, bytes)
                }
            };
            let t = c.max_tokens;
            let (x_bytes, r_bytes) = (u64::from(t * h) * 4, u64::from(t * k) * 4);
            let xv = view(c.x, 0, x_bytes);
            let x = if c.x_as_u32 { Tensor::u32(xv, [t, h]) } else { Tensor::f32(xv, [t, h]) };
            let y = Tensor::f32(view(c.y, 1, x_bytes), [t, h]);
            let (Ok(x), Ok(y)) = (x, y) else { return Ok(()) };
            let mut io = ForwardIo::new(x, y);
            if let Some((i, w)) = c.routing {
                let (Ok(i), Ok(w)) =
                    (Tensor::u32(view(i, 2, r_bytes), [t, k]), Tensor::f32(view(w, 3, r_bytes), [t, k]))
                else {
                    return Ok(());
                };
                io = io.with_routing(i, w);
            }
            let planned = match c.workspace {
                None => layer.plan(&ctx, io),
                Some(p) => {
                    let ws_view = view(Place { shared: true, ..p }, 4, layout.bytes());
                    match Workspace::new(&ctx, &layout, ws_view) {
                        Ok(ws) => layer.plan_in(&ctx, io, &ws),
                        Err(_) => return Ok(()),
                    }
                }
            };
            let plan = match planned {
                Ok(plan) => plan,
                Err(e) => {
                    overlapped
                        .set(overlapped.get() + usize::from(e.to_string().contains("overlapping views")));
                    return Ok(());
                }
            };
            prop_assert!(!c.x_as_u32, "a u32 x was planned");
            ctx.queue().write_buffer(xv.buffer, xv.offset, bytemuck::cast_slice(&xs[..(t * h) as usize]));
            let mut encoder = ctx.encoder("property case");
            if plan.record(&mut encoder, c.count).is_err() {
                prop_assert!(c.count > t, "recording {} of {t} tokens failed", c.count);
                return Ok(());
            }
            prop_assert!(c.count <= t, "recording {} of {t} tokens passed", c.count);
            ctx.submit_and_wait(encoder).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if c.count == 0 {
                return Ok(());
            }
            ran.set(ran.get() + 1);
            let (n, want) = (c.count as usize, &exact[c.count as usize - 1]);
            let read = |v: BufferView<'_>, len: usize| ctx.read_back::<u32>(v, len).unwrap();
            let f32_bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(read(y.view(), n * h as usize), f32_bits(&want.y), "y");
            prop_assert_eq!(read(plan.indices().view(), n * k as usize), want.indices.clone(), "indices");
            prop_assert_eq!(read(plan.weights().view(), n * k as usize), f32_bits(&want.weights), "weights");
            Ok(())
        });
        if let Err(e) = outcome {
            panic!("{name}: {e}");
        }
        let (ran, overlapped) = (ran.get(), overlapped.get());
        assert!(ran >= 12 && overlapped >= 6, "{name}: {ran} forwards ran, {overlapped} overlaps refused");
    }
}

/// Commands that wgpu refuses as they are finished or submitted, through every public way of
/// submitting a caller's encoder (`submit_and_wait`, `submit_async`): a plan recorded before
/// its `x` was destroyed, a copy of 8 bytes into the 4-byte live-count word, and a plan
/// recorded into an encoder of another device. Each is an `Err` naming the problem, never a
/// panic, and the context goes on working.
#[test]
fn refused_submissions_are_errors() {
    for adapter in common::wgpu_adapters() {
        let open = || Context::from_adapter(&adapter).expect("a device");
        let ctx = open();
        let name = ctx.adapter().slug();
        let cfg = MoeConfig::new(16, 8, 4, 2);
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)).unwrap();
        let x = ctx.upload("x", &[0.5f32; 16 * 3]).unwrap();
        let y = ctx.zeroed("y", 16 * 3 * 4).unwrap();
        let plan = layer.plan(&ctx, layer.io(&x, &y, 3).unwrap()).unwrap();
        let submit = |asynchronous: bool, encoder| {
            if asynchronous {
                pollster::block_on(ctx.submit_async(encoder))
            } else {
                ctx.submit_and_wait(encoder)
            }
        };
        for asynchronous in [false, true] {
            let what = format!("{name} (async: {asynchronous})");
            let mut encoder = ctx.encoder("too long a count");
            encoder.copy_buffer_to_buffer(&y, 0, plan.live_tokens(), 0, 8);
            expect_err(&what, submit(asynchronous, encoder), &["submission", "overrun"]);
            let mut encoder = ctx.encoder("good");
            plan.record(&mut encoder, 3).unwrap();
            submit(asynchronous, encoder).unwrap();
        }
        let gone = ctx.upload("gone x", &[0.5f32; 16 * 3]).unwrap();
        let gone_plan = layer.plan(&ctx, layer.io(&gone, &y, 3).unwrap()).unwrap();
        for asynchronous in [false, true] {
            let mut encoder = ctx.encoder("destroyed x");
            gone_plan.record(&mut encoder, 3).unwrap();
            gone.destroy();
            let what = format!("{name} (async: {asynchronous})");
            expect_err(&what, submit(asynchronous, encoder), &["submission", "destroyed"]);
        }
        // (On GL every context has an instance of its own, where wgpu cannot tell devices
        // apart; see `moeflow::instance`.)
        if adapter.get_info().backend != wgpu::Backend::Gl {
            let other = open();
            let mut encoder = other.encoder("another device's");
            plan.record(&mut encoder, 3).unwrap();
            expect_err(&name, other.submit_and_wait(encoder), &["submission", "doesn't match Device"]);
            let mut encoder = other.encoder("another device's");
            plan.record(&mut encoder, 3).unwrap();
            // Finishing the encoder raises the mismatch on its own device, outside any scope:
            // that context keeps it and reports it at its next call, which then does nothing.
            expect_err(&name, ctx.submit_and_wait(encoder), &["submission"]);
            expect_err(
                &name,
                other.submit_and_wait(other.encoder("empty")),
                &["outside moeflow's error scopes", "doesn't match Device"],
            );
            other.submit_and_wait(other.encoder("empty")).unwrap();
        }
        let mut encoder = ctx.encoder("good");
        plan.record(&mut encoder, 3).unwrap();
        ctx.submit_and_wait(encoder).unwrap();
        let want = layer.forward_host(&ctx, &[0.5f32; 16 * 3]).unwrap().y;
        assert_eq!(common::bits(&ctx.read_back::<f32>(&y, 16 * 3).unwrap()), common::bits(&want), "{name}");
    }
}

/// Every public `Context` and `MoeLayer` call that touches the device, made right after
/// `destroy()` (before anything has polled the device, so wgpu has not yet run the lost
/// callback) and again after a poll: `Err(DeviceLost)` each time, never a panic or an `Ok`.
#[test]
fn every_call_on_a_destroyed_device_is_device_lost() {
    common::side_by_side(&common::wgpu_adapters(), |_, adapter| {
        let name = format!("{:?} {}", adapter.get_info().backend, adapter.get_info().name);
        for poll_first in [false, true] {
            let ctx = Context::from_adapter(adapter).unwrap();
            let cfg = MoeConfig::new(16, 8, 4, 2);
            let weights = Synth::new(1).moe_weights(&cfg);
            let layer = MoeLayer::new(&ctx, cfg, &weights).unwrap();
            let x = ctx.upload("x", &[0.5f32; 16 * 3]).unwrap();
            let y = ctx.zeroed("y", 16 * 3 * 4).unwrap();
            let plan = layer.plan(&ctx, layer.io(&x, &y, 3).unwrap()).unwrap();
            ctx.run(&plan.dispatches()).unwrap();
            let heard = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = heard.clone();
            ctx.on_device_lost(move |_, _| flag.store(true, std::sync::atomic::Ordering::SeqCst));
            ctx.device().destroy();
            if poll_first {
                let _ = ctx.device().poll(wgpu::PollType::Poll);
            }
            let what = format!("{name}, {}", if poll_first { "polled" } else { "not polled" });
            let lost = |call: &str, r: moeflow::Result<()>| match r {
                Err(Error::DeviceLost(_)) => {}
                other => panic!("{what}: {call}: expected DeviceLost, got {other:?}"),
            };
            lost("check_alive", ctx.check_alive());
            lost("upload", ctx.upload("after", &[1u32]).map(|_| ()));
            lost("zeroed", ctx.zeroed("after", 16).map(|_| ()));
            lost("run", ctx.run(&plan.dispatches()));
            lost("submit_and_wait", ctx.submit_and_wait(ctx.encoder("after")));
            lost("read_back", ctx.read_back::<f32>(&y, 4).map(|_| ()));
            lost("MoeLayer::new", MoeLayer::new(&ctx, cfg, &weights).map(|_| ()));
            lost("plan", layer.plan(&ctx, layer.io(&x, &y, 3).unwrap()).map(|_| ()));
            lost("load", plan.load(&ctx, 4).map(|_| ()));
            lost("prepare", layer.prepare(&ctx, 3).map(|_| ()));
            lost("forward_host", layer.forward_host(&ctx, &[0.0; 16]).map(|_| ()));
            assert!(heard.load(std::sync::atomic::Ordering::SeqCst), "{what}: the app's own callback ran");
        }
    });
}

#[test]
fn small_device_limits_are_errors_not_panics() {
    common::side_by_side(&common::wgpu_adapters(), |_, adapter| {
        let limits = wgpu::Limits { max_storage_buffer_binding_size: 4096, ..adapter.limits() };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("small"),
            required_limits: limits,
            ..Default::default()
        }))
        .unwrap();
        let ctx = Context::from_wgpu(device, queue);
        // A narrow direct block of the default's 16 rows: its padded rows meet the limits as the
        // default's do (whose fallback on this device is a wide direct block).
        let block = GemmVariant::Direct(common::narrow_block(16));
        let narrow =
            |cfg: MoeConfig| MoeConfig { kernels: KernelChoice::Fixed { up: block, down: block }, ..cfg };
        // gate [4, 16, 32] f32 is 8 KiB: past the 4 KiB binding limit, so it runs split (one
        // token: the decode path; three tokens take the grouped path, whose padded activations,
        // 66 rows of 16, are past the limit: an error naming it).
        let cfg = narrow(MoeConfig::new(32, 16, 4, 2));
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)).unwrap();
        assert_eq!(layer.forward_host(&ctx, &[0.5; 32]).unwrap().y.len(), 32);
        expect_err(
            "grouped scratch past the binding limit",
            layer.forward_host(&ctx, &[0.5; 32 * 3]),
            &["past the limit of 4096"],
        );
        // One weight column of 2048 f32 (8 KiB) cannot be split: K is never split.
        let cfg = MoeConfig::new(2048, 2, 2, 1);
        expect_err(
            "one weight column past the binding limit",
            MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)),
            &["one output column", "past the limit of 4096"],
        );
        let small = narrow(MoeConfig::new(8, 8, 4, 2));
        let layer = MoeLayer::new(&ctx, small, &Synth::new(2).moe_weights(&small)).unwrap();
        let x = ctx.upload("x", &vec![0.0f32; 8 * 200]).unwrap();
        let y = ctx.zeroed("y", 8 * 200 * 4).unwrap();
        expect_err(
            "scratch past the binding limit",
            layer.plan(&ctx, layer.io(&x, &y, 200).unwrap()),
            &["past the limit of 4096"],
        );
        let x = ctx.upload("x", &[0.25f32; 8 * 6]).unwrap();
        let y = ctx.zeroed("y", 8 * 6 * 4).unwrap();
        let plan = layer.plan(&ctx, layer.io(&x, &y, 6).unwrap()).expect("a plan within the limits");
        ctx.run(&plan.dispatches()).unwrap();
    });
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moeflow-bad-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".moeflow-"))
        .collect()
}

#[test]
fn output_files_are_replaced_atomically_or_not_at_all() {
    let dir = scratch("atomic");
    let target = dir.join("y.safetensors");
    std::fs::write(&target, b"old contents").unwrap();
    // A write that fails part-way leaves the old file and no temporary file.
    let r = write_atomically(&target, |w| {
        w.write_all(b"half of the new ")?;
        Err(std::io::Error::other("disk full (injected)"))
    });
    expect_err("injected failure", r, &["y.safetensors", "disk full (injected)"]);
    assert_eq!(std::fs::read(&target).unwrap(), b"old contents");
    assert!(leftovers(&dir).is_empty(), "temporary files left: {:?}", leftovers(&dir));
    // A tensor whose data does not fill its shape is refused before anything is written.
    expect_err(
        "bad tensor",
        write_tensors(&target, &[OutTensor::F32("y", &[3, 3], &[0.0; 4])]),
        &["tensor `y`"],
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"old contents");
    // A directory that does not exist is an I/O error naming the path.
    expect_err(
        "no directory",
        write_tensors(&dir.join("missing/y.safetensors"), &[OutTensor::U32("i", &[1], &[1])]),
        &["missing/y.safetensors"],
    );
    // A good write replaces the file.
    write_tensors(&target, &[OutTensor::U32("i", &[2], &[4, 5])]).unwrap();
    let bytes = std::fs::read(&target).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("i").unwrap().shape(), &[2]);
    assert!(leftovers(&dir).is_empty());
    // Same-file checks, also through a hard link and a symbolic link.
    let input = dir.join("x.safetensors");
    std::fs::write(&input, b"x").unwrap();
    expect_err("same path", check_output_path(&input, &[&input]), &["same file"]);
    std::fs::hard_link(&input, dir.join("hard.safetensors")).unwrap();
    expect_err("hard link", check_output_path(&dir.join("hard.safetensors"), &[&input]), &["same file"]);
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&input, dir.join("soft.safetensors")).unwrap();
        expect_err("symlink", check_output_path(&dir.join("soft.safetensors"), &[&input]), &["same file"]);
    }
    expect_err(
        "dotted path",
        check_output_path(&dir.join(".").join("x.safetensors"), &[&input]),
        &["same file"],
    );
    check_output_path(&dir.join("new.safetensors"), &[&input]).unwrap();
    check_output_path(&target, &[&input]).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    dir.join("examples").join(format!("moe_layer{}", std::env::consts::EXE_SUFFIX))
}

/// Runs the example; returns (success, stdout + stderr).
fn cli(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new(example()).args(args).output().expect("running moe_layer");
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn the_cli_refuses_bad_requests_and_never_loses_a_file() {
    if common::wgpu_adapters().is_empty() {
        return;
    }
    let dir = scratch("cli");
    let w = dir.join("w.safetensors");
    std::fs::write(&w, serialize(&olmoe())).unwrap();
    let c = dir.join("config.json");
    std::fs::write(&c, cfg_olmoe().to_string()).unwrap();
    let x = dir.join("x.safetensors");
    std::fs::write(&x, serialize(&[f32s("x", &[3, H], 9)])).unwrap();
    let y = dir.join("y.safetensors");
    let before: Vec<(PathBuf, Vec<u8>)> =
        [&w, &c, &x].iter().map(|p| ((*p).clone(), std::fs::read(p).unwrap())).collect();
    let os = |s: &str| std::ffi::OsString::from(s);
    let run = |extra: &[std::ffi::OsString]| {
        let args: Vec<&std::ffi::OsStr> = extra.iter().map(|s| s.as_os_str()).collect();
        cli(&args)
    };
    let base = |out: &Path| {
        vec![
            os("--weights"),
            w.clone().into(),
            os("--config"),
            c.clone().into(),
            os("--input"),
            x.clone().into(),
            os("--output"),
            out.into(),
        ]
    };
    let cases: Vec<(&str, Vec<std::ffi::OsString>, &[&str])> = vec![
        ("output over the input", base(&x), &["same file", "x.safetensors"]),
        ("output over the weights", base(&w), &["same file", "w.safetensors"]),
        ("output over the config", base(&c), &["same file", "config.json"]),
        (
            "missing weights",
            vec![
                os("--weights"),
                dir.join("nope.safetensors").into(),
                os("--k"),
                os("2"),
                os("--input"),
                x.clone().into(),
                os("--output"),
                y.clone().into(),
            ],
            &["nope.safetensors"],
        ),
        (
            "weights not safetensors",
            vec![
                os("--weights"),
                c.clone().into(),
                os("--k"),
                os("2"),
                os("--input"),
                x.clone().into(),
                os("--output"),
                y.clone().into(),
            ],
            &["not a readable safetensors"],
        ),
        (
            "config not JSON",
            vec![
                os("--weights"),
                w.clone().into(),
                os("--config"),
                x.clone().into(),
                os("--input"),
                x.clone().into(),
                os("--output"),
                y.clone().into(),
            ],
            &["not valid JSON"],
        ),
        (
            "unknown family",
            [base(&y), vec![os("--family"), os("switch")]].concat(),
            &["`switch` is not a MoE family"],
        ),
        ("k contradicting config", [base(&y), vec![os("--k"), os("3")]].concat(), &["contradicts"]),
        ("n-group alone", [base(&y), vec![os("--n-group"), os("2")]].concat(), &["--topk-group"]),
        ("weights without input", vec![os("--weights"), w.clone().into()], &["--input"]),
        (
            "synthetic k past E",
            vec![
                os("--experts"),
                os("4"),
                os("--k"),
                os("8"),
                os("--tokens"),
                os("4"),
                os("--hidden"),
                os("16"),
                os("--ffn"),
                os("8"),
                os("--shared-ffn"),
                os("0"),
            ],
            &["k = 8 is larger than the number of experts (4)"],
        ),
        (
            "synthetic with a config",
            vec![os("--config"), c.clone().into(), os("--tokens"), os("4")],
            &["--config applies to a weights file"],
        ),
        (
            "no config, no family",
            vec![
                os("--weights"),
                w.clone().into(),
                os("--k"),
                os("2"),
                os("--input"),
                x.clone().into(),
                os("--output"),
                y.clone().into(),
            ],
            &["fit several families"],
        ),
        (
            "input of another width",
            {
                let x2 = dir.join("x2.safetensors");
                std::fs::write(&x2, serialize(&[f32s("x", &[2, H + 1], 3)])).unwrap();
                vec![
                    os("--weights"),
                    w.clone().into(),
                    os("--config"),
                    c.clone().into(),
                    os("--input"),
                    x2.into(),
                    os("--output"),
                    y.clone().into(),
                ]
            },
            &["input x", "[2, 9]"],
        ),
        ("output in a missing directory", base(&dir.join("none/y.safetensors")), &["none/y.safetensors"]),
    ];
    for (what, args, needles) in cases {
        let (ok, text) = run(&args);
        assert!(!ok, "{what}: succeeded:\n{text}");
        assert!(!text.contains("panicked"), "{what}: panicked:\n{text}");
        for n in needles {
            assert!(text.contains(n), "{what}: output does not mention `{n}`:\n{text}");
        }
    }
    for (p, bytes) in &before {
        assert_eq!(&std::fs::read(p).unwrap(), bytes, "{} changed", p.display());
    }
    assert!(!y.exists(), "no output from failed runs");
    assert!(leftovers(&dir).is_empty());
    // And the good run writes the output and says what routing it used.
    let (ok, text) = run(&base(&y));
    assert!(ok, "{text}");
    assert!(
        text.contains("olmoe")
            && text.contains("softmax top-2 of 4 experts")
            && text.contains("not renormalised"),
        "{text}"
    );
    assert!(y.exists());
    std::fs::remove_dir_all(&dir).ok();
}
