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
