//! The contract between the Rust side and the WGSL, reflected from naga's module of every
//! kernel: for every [`KernelSpec`], the bindings its entry point uses and their access
//! modes, the size of its parameter struct, its workgroup size, and the values of the
//! constants both sides declare (word indices, flags, limits). The Rust side keeps these as
//! typed constants and `size_of` of its parameter structs; these tests fail where the two
//! sides disagree. (wgpu also checks the parameter size when it builds a pipeline, from each
//! layout's `min_binding_size`.) Every module is also validated by naga and translated by its
//! back ends to SPIR-V, MSL, HLSL and GLSL (Metal and DX12 are not on the test machines, so
//! this is how their breakage is caught), and every file under `wgsl/` must belong to one.

use std::collections::BTreeMap;

use naga::back::{glsl, hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};

use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Override, ShaderSource};

/// Every shader module moeflow builds.
fn all_shaders() -> Vec<&'static ShaderSource> {
    let mut all = Vec::new();
    all.extend_from_slice(crate::kernels::routing::SHADERS);
    all.extend_from_slice(crate::kernels::dispatch::SHADERS);
    all.extend(crate::kernels::gemm::shaders());
    all.extend_from_slice(crate::kernels::combine::SHADERS);
    all.extend_from_slice(crate::kernels::sizing::SHADERS);
    #[cfg(feature = "dag")]
    {
        all.extend_from_slice(crate::dag::shaders::SHADERS);
        all.extend_from_slice(crate::dag::moe::SHADERS);
        all.extend_from_slice(crate::dag::probe::SHADERS);
    }
    #[cfg(feature = "bench")]
    all.extend_from_slice(crate::bench::calibrate::SHADERS);
    all
}

/// Every kernel moeflow builds.
fn all_specs() -> Vec<&'static KernelSpec> {
    let mut all: Vec<&'static KernelSpec> = Vec::new();
    all.extend_from_slice(crate::kernels::routing::SPECS);
    all.extend_from_slice(crate::kernels::dispatch::SPECS);
    all.extend(crate::kernels::gemm::specs());
    all.extend_from_slice(crate::kernels::combine::SPECS);
    all.extend_from_slice(crate::kernels::sizing::SPECS);
    #[cfg(feature = "dag")]
    {
        all.extend_from_slice(crate::dag::shaders::SPECS);
        all.extend_from_slice(crate::dag::moe::SPECS);
        all.extend_from_slice(crate::dag::probe::SPECS);
    }
    #[cfg(feature = "bench")]
    all.extend_from_slice(crate::bench::calibrate::SPECS);
    all
}

/// How the WGSL declares a global, as an [`Access`].
fn access_of(module: &naga::Module, var: &naga::GlobalVariable, what: &str) -> Access {
    match var.space {
        naga::AddressSpace::Uniform => Access::Uniform,
        naga::AddressSpace::Storage { access } if access.contains(naga::StorageAccess::STORE) => {
            Access::ReadWrite
        }
        naga::AddressSpace::Storage { .. } => Access::Read,
        naga::AddressSpace::Handle => match module.types[var.ty].inner {
            naga::TypeInner::Image {
                dim: naga::ImageDimension::D2,
                arrayed: true,
                class: naga::ImageClass::Sampled { kind: naga::ScalarKind::Uint, multi: false },
            } => Access::TextureU32,
            ref other => panic!("{what}: a handle moeflow has no access for: {other:?}"),
        },
        other => panic!("{what}: a binding in address space {other:?}"),
    }
}

/// A module-scope constant's value as a number (u32, i32 or f32 literals).
fn constant_value(module: &naga::Module, c: &naga::Constant) -> Option<f64> {
    match module.global_expressions[c.init] {
        naga::Expression::Literal(naga::Literal::U32(v)) => Some(f64::from(v)),
        naga::Expression::Literal(naga::Literal::I32(v)) => Some(f64::from(v)),
        naga::Expression::Literal(naga::Literal::F32(v)) => Some(f64::from(v)),
        naga::Expression::Literal(naga::Literal::AbstractInt(v)) => Some(v as f64),
        _ => None,
    }
}

#[test]
fn every_entry_point_has_a_spec() {
    let specs = all_specs();
    for source in all_shaders() {
        // Generated gemm modules of variants the test does not enumerate have no spec here.
        for &entry in source.entry_points {
            assert!(
                specs.iter().any(|s| std::ptr::eq(s.shader, source) && s.entry == entry),
                "{}::{entry} has no KernelSpec in src/contract.rs's list",
                source.name
            );
        }
    }
}

#[test]
fn every_spec_matches_its_wgsl() {
    let mut modules: BTreeMap<&str, (naga::Module, naga::valid::ModuleInfo)> = BTreeMap::new();
    let specs = all_specs();
    let mut mismatched = Vec::new();
    assert!(specs.len() > 40, "only {} kernel specs found", specs.len());
    for spec in specs {
        let what = format!("{}::{}", spec.shader.name, spec.entry);
        let (module, info) = modules.entry(spec.shader.name).or_insert_with(|| validate(spec.shader));
        let (index, ep) = module
            .entry_points
            .iter()
            .enumerate()
            .find(|(_, ep)| ep.name == spec.entry)
            .unwrap_or_else(|| panic!("{what}: no such entry point"));
        assert_eq!(ep.stage, naga::ShaderStage::Compute, "{what}");

        // Bindings: exactly those the entry point uses (through any function it calls), each
        // with the access the WGSL declares, all in group 0.
        let uses = info.get_entry_point(index);
        let mut used: Vec<(u32, Access)> = Vec::new();
        for (handle, var) in module.global_variables.iter() {
            let Some(binding) = &var.binding else { continue };
            if uses[handle].is_empty() {
                continue;
            }
            assert_eq!(binding.group, 0, "{what}: binding {} is in group {}", binding.binding, binding.group);
            let access = access_of(module, var, &what);
            used.push((binding.binding, access));
            if binding.binding == 0 {
                assert_eq!(access, Access::Uniform, "{what}: binding 0 must be the parameters");
                let size = module.types[var.ty].inner.size(module.to_ctx());
                assert_eq!(
                    u64::from(size),
                    spec.params_bytes,
                    "{what}: the WGSL parameter struct has {size} bytes, the Rust side binds {}",
                    spec.params_bytes
                );
            } else if access == Access::Uniform {
                let size = module.types[var.ty].inner.size(module.to_ctx());
                let want = other_uniform_bytes(spec.shader.name, binding.binding)
                    .unwrap_or(crate::kernels::gemm::WINDOW_BYTES);
                assert_eq!(
                    u64::from(size),
                    want,
                    "{what}: uniform binding {} is neither an x window nor a listed uniform",
                    binding.binding
                );
            }
        }
        used.sort_by_key(|&(b, _)| b);
        let mut listed = spec.bindings.to_vec();
        listed.sort_by_key(|&(b, _)| b);
        if listed != used {
            mismatched.push(format!("{what}: the spec lists {listed:?}, the WGSL uses {used:?}"));
        }

        // Workgroup size.
        match spec.workgroup {
            Workgroup::Fixed(n) => {
                assert!(ep.workgroup_size_overrides.is_none(), "{what}: the WGSL's size is overridable");
                assert_eq!(ep.workgroup_size, [n, 1, 1], "{what}: workgroup size");
            }
            Workgroup::Override(name) => {
                let sizes = ep.workgroup_size_overrides.unwrap_or_else(|| panic!("{what}: a fixed size"));
                assert!(sizes[1].is_none() && sizes[2].is_none(), "{what}: y or z overridable");
                assert_eq!(ep.workgroup_size[1..], [1, 1], "{what}: workgroup size in y and z");
                let x = sizes[0].unwrap_or_else(|| panic!("{what}: x is not overridable"));
                let uses_override = match module.global_expressions[x] {
                    naga::Expression::Override(o) => module.overrides[o].name.as_deref() == Some(name.name()),
                    _ => false,
                };
                assert!(uses_override, "{what}: the workgroup size is not the override `{name}`");
            }
        }
    }
    assert!(mismatched.is_empty(), "bindings differ:\n{}", mismatched.join("\n"));
}

/// `(module name prefix, constant, Rust value)`: constants declared on both sides.
fn shared_constants() -> Vec<(&'static str, &'static str, f64)> {
    use crate::kernels::{dispatch as d, gemm as g, routing as r};
    let mut all = vec![
        ("routing/", "ROUTE_WG", f64::from(r::ROUTE_WG)),
        ("routing/", "MAX_EXPERTS", f64::from(r::MAX_EXPERTS)),
        ("routing/", "MAX_K", f64::from(r::MAX_K)),
        ("routing/", "MAX_GROUPS", f64::from(r::MAX_GROUPS)),
        ("routing/", "NO_EXPERT", f64::from(crate::reference::dispatch::NONE)),
        ("dispatch/", "DISPATCH_WG", f64::from(d::DISPATCH_WG)),
        ("dispatch/", "NONE", f64::from(crate::reference::dispatch::NONE)),
        ("dispatch/", "META_ROWS", f64::from(d::META_ROWS)),
        ("dispatch/", "META_PADDED_ROWS", f64::from(d::META_PADDED_ROWS)),
        ("dispatch/", "META_TILES", f64::from(d::META_TILES)),
        ("dispatch/", "META_MAX_COUNT", f64::from(d::META_MAX_COUNT)),
        ("dispatch/", "META_NONEMPTY", f64::from(d::META_NONEMPTY)),
        ("dispatch/", "META_OVERFLOW", f64::from(d::META_OVERFLOW)),
        ("dispatch/", "META_INVALID", f64::from(d::META_INVALID)),
        ("gemm/", "NONE", f64::from(g::NONE)),
        ("gemm/", "FLAG_GATHER", f64::from(g::FLAG_GATHER)),
        ("gemm/", "FLAG_OUT_ENTRY", f64::from(g::FLAG_OUT_ENTRY)),
        ("gemm/", "FLAG_IDENTITY_ROWS", f64::from(g::FLAG_IDENTITY_ROWS)),
        ("gemm/", "FLAG_EXPERT_FROM_TILES", f64::from(g::FLAG_EXPERT_FROM_TILES)),
        ("gemm/", "FLAG_EXPERT_FROM_INDICES", f64::from(g::FLAG_EXPERT_FROM_INDICES)),
        ("gemm/rowwise_subgroup", "ROW_ALIGN", f64::from(g::ROWWISE_SUBGROUP_ROW_ALIGN)),
    ];
    all.extend(dag_constants());
    all
}

/// Bytes of a uniform binding past 0 that is not an x window, by module and binding: what the
/// Rust side binds there.
fn other_uniform_bytes(module: &str, binding: u32) -> Option<u64> {
    #[cfg(feature = "dag")]
    if (module, binding) == ("dag/moe", 3) {
        return Some(crate::dag::moe::PASS_RANGE_BYTES);
    }
    let _ = (module, binding);
    None
}

/// The DAG kernels' shared constants (none without the `dag` feature).
fn dag_constants() -> Vec<(&'static str, &'static str, f64)> {
    #[cfg(feature = "dag")]
    {
        use crate::dag::{chain as c, moe as m, queue as q};
        let mut all = vec![
            ("dag/", "NONE", f64::from(crate::dag::program::NONE)),
            ("dag/", "KIND_AFFINE", f64::from(c::KIND_AFFINE)),
            ("dag/", "KIND_SILU", f64::from(c::KIND_SILU)),
            ("dag/", "KIND_RMS", f64::from(c::KIND_RMS)),
            ("dag/", "SUM_LANES", crate::reference::dag::SUM_LANES as f64),
            ("dag/", "RMS_EPS", f64::from(crate::reference::dag::RMS_EPS)),
            ("dag/", "TICKET", f64::from(q::TICKET)),
            ("dag/", "STATUS", f64::from(q::STATUS)),
            ("dag/", "DONE", f64::from(q::DONE)),
            ("dag/", "MAX_SPINS", f64::from(q::MAX_SPINS)),
            ("dag/", "FAULTS", f64::from(q::FAULTS)),
            ("dag/", "COUNTERS", f64::from(q::STATE_HEADER)),
            ("dag/", "STATUS_TIMEOUT", f64::from(q::STATUS_TIMEOUT)),
            ("dag/", "STATUS_LOOP_LIMIT", f64::from(q::STATUS_LOOP_LIMIT)),
            ("dag/moe", "MOE_TILE", f64::from(m::MOE_TILE)),
            ("dag/moe", "MOE_NONE", f64::from(m::MOE_NONE)),
            ("dag/moe", "MOE_ROUTE", f64::from(m::TaskKind::Route as u32)),
            ("dag/moe", "MOE_LAYOUT", f64::from(m::TaskKind::Layout as u32)),
            ("dag/moe", "MOE_UP", f64::from(m::TaskKind::Up as u32)),
            ("dag/moe", "MOE_DOWN", f64::from(m::TaskKind::Down as u32)),
            ("dag/moe", "MOE_COMBINE", f64::from(m::TaskKind::Combine as u32)),
            ("dag/moe", "MOE_SHARED_UP", f64::from(m::TaskKind::SharedUp as u32)),
            ("dag/moe", "MOE_SHARED_DOWN", f64::from(m::TaskKind::SharedDown as u32)),
            ("dag/moe", "MOE_SHARED", f64::from(m::TaskKind::Shared as u32)),
            ("dag/moe", "MOE_EXPERT", f64::from(m::TaskKind::Expert as u32)),
            ("dag/moe", "RUN_TIME_NEED", f64::from(m::RUN_TIME_NEED)),
        ];
        // The program header's words, by the Rust struct's field offsets.
        macro_rules! header_words {
            ($($name:literal => $field:ident),+ $(,)?) => {
                $(all.push(("dag/moe", $name, (std::mem::offset_of!(m::Header, $field) / 4) as f64));)+
            };
        }
        header_words!(
            "H_TASKS" => tasks,
            "H_TASK_OFF" => task_off,
            "H_SPIN_LIMIT" => spin_limit,
            "H_WORK" => work,
            "H_CANARY" => canary,
            "H_FFN" => ffn,
            "H_UP_TILES" => up_tiles,
            "H_DOWN_TILES" => down_tiles,
            "H_SLOTS" => slots,
            "H_COUNTS" => counts,
            "H_BASES" => bases,
            "H_ROW_ENTRY" => row_entry,
            "H_TILE_EXPERT" => tile_expert,
            "H_CHUNKS" => chunks,
            "H_INDICES" => indices,
            "H_ROWS_H" => rows_h,
            "H_PARTIAL" => partial,
            "H_WEIGHTS" => weights,
            "H_BIAS" => bias,
            "H_SHARED_FFN" => shared_ffn,
            "H_SHARED_UP_TILES" => shared_up_tiles,
            "H_SHARED_GATE" => shared_gate,
            "H_SHARED_UP_OFF" => shared_up_off,
            "H_SHARED_DOWN_OFF" => shared_down_off,
            "H_SHARED_H" => shared_h,
            "H_SHARED_OUT" => shared_out,
            "H_COMBINE_RULE" => combine_rule,
            "H_COMBINE_FIRST" => combine_first,
            "H_ENTRY_SIGNALS" => entry_signals,
        );
        all
    }
    #[cfg(not(feature = "dag"))]
    Vec::new()
}

/// Where `table` and the WGSL disagree: a constant whose value differs, one that is not a
/// literal, or a table entry no module of its prefix declares; one line each.
fn constant_disagreements(table: &[(&str, &str, f64)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = vec![false; table.len()];
    for source in all_shaders() {
        let (module, _) = validate(source);
        for (_, c) in module.constants.iter() {
            let Some(name) = c.name.as_deref() else { continue };
            for (i, &(prefix, n, value)) in table.iter().enumerate() {
                if n != name || !source.name.starts_with(prefix) {
                    continue;
                }
                seen[i] = true;
                match constant_value(&module, c) {
                    Some(wgsl) if wgsl == value => {}
                    Some(wgsl) => {
                        out.push(format!("{}: `{name}` is {wgsl} in WGSL and {value} in Rust", source.name))
                    }
                    None => out.push(format!("{}: `{name}` is not a literal", source.name)),
                }
            }
        }
    }
    for (i, &(prefix, name, _)) in table.iter().enumerate() {
        if !seen[i] {
            out.push(format!("no {prefix}* module declares `{name}`"));
        }
    }
    out
}

#[test]
fn shared_constants_agree() {
    let wrong = constant_disagreements(&shared_constants());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every word of the MoE program's header is in the table (each `H_*` constant of
/// `wgsl/dag/moe.wgsl` and each field of `dag::moe::Header`), and a table whose Rust side had
/// two fields swapped disagrees with the WGSL on both.
#[test]
#[cfg(feature = "dag")]
fn every_moe_header_word_is_checked() {
    let table = shared_constants();
    let header: Vec<(&str, f64)> = table
        .iter()
        .filter(|(p, n, _)| *p == "dag/moe" && n.starts_with("H_"))
        .map(|&(_, n, v)| (n, v))
        .collect();
    assert_eq!(header.len() as u32, crate::dag::moe::HEADER_WORDS, "a header field has no table entry");
    let mut words: Vec<f64> = header.iter().map(|&(_, v)| v).collect();
    words.sort_by(f64::total_cmp);
    words.dedup();
    assert_eq!(words.len(), header.len(), "two header constants share a word");
    let source = all_shaders().into_iter().find(|s| s.name == "dag/moe").expect("the MoE program's module");
    let (module, _) = validate(source);
    for (_, c) in module.constants.iter() {
        if let Some(name) = c.name.as_deref().filter(|n| n.starts_with("H_")) {
            assert!(header.iter().any(|&(n, _)| n == name), "`{name}` of dag/moe is not in the table");
        }
    }
    let mut swapped = table.clone();
    let at =
        |name: &str| swapped.iter().position(|&(p, n, _)| p == "dag/moe" && n == name).expect("in the table");
    let (i, j) = (at("H_INDICES"), at("H_WEIGHTS"));
    let (vi, vj) = (swapped[i].2, swapped[j].2);
    swapped[i].2 = vj;
    swapped[j].2 = vi;
    let wrong = constant_disagreements(&swapped);
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(wrong.iter().any(|w| w.contains("H_INDICES")) && wrong.iter().any(|w| w.contains("H_WEIGHTS")));
}

// ---- every module through naga's back ends ----

/// Modules that start with `enable f16;` need shader-f16 (never on GL adapters).
fn needs_f16(source: &ShaderSource) -> bool {
    source.parts.first().is_some_and(|p| p.text.contains("enable f16;"))
}

/// Modules that enable wgpu's cooperative matrices (Vulkan and Metal only: naga's HLSL and
/// GLSL writers have none).
fn needs_coop(source: &ShaderSource) -> bool {
    source.parts.first().is_some_and(|p| p.text.contains("enable wgpu_cooperative_matrix;"))
}

/// Modules that read a subgroup builtin need subgroups (never on GL adapters).
fn needs_subgroups(source: &ShaderSource) -> bool {
    source.parts.iter().any(|p| p.text.contains("@builtin(subgroup_invocation_id)"))
}

fn validate(source: &ShaderSource) -> (naga::Module, naga::valid::ModuleInfo) {
    let text = source.compose();
    let module = naga::front::wgsl::parse_str(&text)
        .unwrap_or_else(|e| panic!("{}: {}", source.name, e.emit_to_string(&text)));
    let mut caps = Capabilities::default();
    if needs_f16(source) {
        caps |= Capabilities::SHADER_FLOAT16 | Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    }
    if needs_subgroups(source) {
        caps |= Capabilities::SUBGROUP;
    }
    if needs_coop(source) {
        caps |= Capabilities::COOPERATIVE_MATRIX;
    }
    let info = Validator::new(ValidationFlags::all(), caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(
            naga::valid::SubgroupOperationSet::BASIC | naga::valid::SubgroupOperationSet::BALLOT,
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", source.name, e.emit_to_string(&text)));
    (module, info)
}

#[test]
fn every_module_validates_and_translates_to_every_backend() {
    for source in all_shaders() {
        let (module, info) = validate(source);
        for &entry in source.entry_points {
            let ep = (naga::ShaderStage::Compute, entry);
            let (module, info) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some(ep),
                &Default::default(),
            )
            .unwrap_or_else(|e| panic!("{}::{entry}: overrides: {e}", source.name));
            let what = format!("{}::{entry}", source.name);
            let spv_opts = spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: entry.to_string(),
            };
            // With the checks wgpu builds by default (every index clamped) and without (the
            // build of Indexing::Proven modules, naga's default).
            for policy in [naga::proc::BoundsCheckPolicy::Restrict, naga::proc::BoundsCheckPolicy::Unchecked]
            {
                let options = spv::Options {
                    bounds_check_policies: naga::proc::BoundsCheckPolicies {
                        index: policy,
                        buffer: policy,
                        image_load: policy,
                        binding_array: policy,
                    },
                    ..Default::default()
                };
                let words = spv::write_vec(&module, &info, &options, Some(&spv_opts))
                    .unwrap_or_else(|e| panic!("{what}: SPIR-V ({policy:?}): {e}"));
                assert!(words.len() > 5, "{what}: empty SPIR-V");
            }
            let msl_opts = msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
                ..Default::default()
            };
            // Simdgroup matrices need MSL 2.3.
            let msl_options = if needs_coop(source) {
                msl::Options { lang_version: (2, 3), ..Default::default() }
            } else {
                msl::Options::default()
            };
            let (text, _) = msl::write_string(&module, &info, &msl_options, &msl_opts)
                .unwrap_or_else(|e| panic!("{what}: MSL: {e}"));
            assert!(text.contains("kernel"), "{what}: MSL has no kernel");
            if needs_coop(source) {
                assert!(
                    text.contains("simdgroup_multiply_accumulate"),
                    "{what}: MSL has no simdgroup matrices"
                );
                // No cooperative matrices on DX12 or GL.
                continue;
            }
            let mut text = String::new();
            let hlsl_opts =
                hlsl::PipelineOptions { entry_point: Some((naga::ShaderStage::Compute, entry.to_string())) };
            let hlsl_options = if needs_f16(source) {
                hlsl::Options { shader_model: hlsl::ShaderModel::V6_2, ..Default::default() }
            } else if needs_subgroups(source) {
                hlsl::Options { shader_model: hlsl::ShaderModel::V6_0, ..Default::default() }
            } else {
                hlsl::Options::default()
            };
            hlsl::Writer::new(&mut text, &hlsl_options, &hlsl_opts)
                .write(&module, &info, None)
                .unwrap_or_else(|e| panic!("{what}: HLSL: {e}"));
            assert!(text.contains("numthreads"), "{what}: HLSL has no numthreads");
            // GL adapters never offer shader-f16 or subgroups, so those modules have no GLSL
            // target.
            let glsl_versions = if needs_f16(source) || needs_subgroups(source) {
                vec![]
            } else {
                vec![glsl::Version::new_gles(310), glsl::Version::Desktop(430)]
            };
            for version in glsl_versions {
                let mut text = String::new();
                let opts = glsl::Options { version, ..Default::default() };
                let pipeline = glsl::PipelineOptions {
                    shader_stage: naga::ShaderStage::Compute,
                    entry_point: entry.to_string(),
                    multiview: None,
                };
                glsl::Writer::new(&mut text, &module, &info, &opts, &pipeline, Default::default())
                    .and_then(|mut w| w.write())
                    .unwrap_or_else(|e| panic!("{what}: GLSL {version:?}: {e}"));
                assert!(text.contains("local_size_x"), "{what}: GLSL has no local size");
            }
        }
    }
}

/// Every module's override constants, as naga reflects them, are those its parts declare in
/// [`Override::of_file`]: a pipeline's typed constants name what its WGSL has.
#[test]
fn every_modules_overrides_are_its_parts_declared_ones() {
    for source in all_shaders() {
        let (module, _) = validate(source);
        let mut wgsl: Vec<&str> = module.overrides.iter().filter_map(|(_, o)| o.name.as_deref()).collect();
        wgsl.sort_unstable();
        let mut declared: Vec<&str> = source.overrides().iter().map(|o| o.name()).collect();
        declared.sort_unstable();
        assert_eq!(wgsl, declared, "{}: the WGSL's overrides against Override::of_file", source.name);
    }
}

/// Module names are labels (the caches key on the source's address), and unique: the pipeline
/// records of `MOEFLOW_DUMP_PIPELINES` and every error message name one module each.
#[test]
fn every_module_has_its_own_name() {
    let mut by_name: BTreeMap<&str, Vec<crate::shader::ModuleKey>> = BTreeMap::new();
    for s in all_shaders() {
        let keys = by_name.entry(s.name).or_default();
        if !keys.contains(&s.key()) {
            keys.push(s.key());
        }
    }
    let shared: Vec<&str> = by_name.iter().filter(|(_, k)| k.len() > 1).map(|(n, _)| *n).collect();
    assert!(shared.is_empty(), "modules that share a name: {shared:?}");
}

/// A kernel is refused a constant its module does not declare, by name, and takes its own.
#[test]
fn a_kernel_is_refused_a_constant_its_module_lacks() {
    let spec = crate::kernels::combine::SPECS[0];
    assert!(spec.check_constants(&[(Override::HasShared, 1.0), (Override::SharedGated, 0.0)]).is_ok());
    let err = spec.check_constants(&[(Override::HasShared, 1.0), (Override::Dtype, 0.0)]).unwrap_err();
    assert!(err.to_string().contains("no override constant DTYPE"), "{err}");
}

#[test]
#[cfg(all(feature = "dag", feature = "bench"))]
fn every_wgsl_file_belongs_to_a_module() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("wgsl");
    let used: Vec<&str> = all_shaders().iter().flat_map(|s| s.parts.iter().map(|p| p.path)).collect();
    let mut stack = vec![root.clone()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("wgsl/ is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "wgsl") {
                let rel = path.strip_prefix(&root).expect("under wgsl/").to_string_lossy().replace('\\', "/");
                assert!(
                    used.contains(&rel.as_str()),
                    "wgsl/{rel} is in no shader module, so nothing validates it"
                );
                seen += 1;
            }
        }
    }
    assert!(seen > 0, "no WGSL files found");
}

/// Where [`every_module_is_its_recorded_wgsl`] keeps its record.
const WGSL_RECORD: &str = "tests/fixtures/wgsl_modules.txt";

/// Every module's WGSL, byte for byte, and every kernel's name are those recorded in
/// [`WGSL_RECORD`]: one line per module (a 64-bit FNV-1a hash of [`ShaderSource::compose`], its
/// name and its entry points) and one per kernel (`kernel module/entry`), sorted. A change to
/// the generated WGSL or to a pipeline's name fails here and names the modules; a deliberate
/// one is recorded with `MOEFLOW_RECORD_WGSL=1 cargo test --lib contract` and shows in the
/// diff. Builds without the `dag` or `bench` modules check the lines of the modules they have.
#[test]
fn every_module_is_its_recorded_wgsl() {
    let mut lines: Vec<String> = all_shaders()
        .iter()
        .map(|s| {
            format!(
                "module {:016x} {} {}",
                s.fnv1a(crate::shader::FNV1A_BASIS),
                s.name,
                s.entry_points.join(",")
            )
        })
        .chain(all_specs().iter().map(|k| format!("kernel {}/{}", k.shader.name, k.entry)))
        .collect();
    lines.sort();
    lines.dedup();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(WGSL_RECORD);
    if std::env::var_os("MOEFLOW_RECORD_WGSL").is_some() {
        std::fs::write(&path, lines.join("\n") + "\n").expect("the WGSL record is writable");
        return;
    }
    let text = std::fs::read_to_string(&path).expect("the WGSL record is readable");
    let recorded: Vec<&str> = text.lines().collect();
    let changed: Vec<&String> = lines.iter().filter(|l| !recorded.contains(&l.as_str())).collect();
    assert!(changed.is_empty(), "modules or kernels that differ from {WGSL_RECORD}: {changed:#?}");
    if cfg!(all(feature = "dag", feature = "bench")) {
        let gone: Vec<&&str> = recorded.iter().filter(|l| !lines.iter().any(|m| m == *l)).collect();
        assert!(gone.is_empty(), "recorded in {WGSL_RECORD} but no longer built: {gone:#?}");
    }
}
