// Groups of four weights at any k of a row, from the weights files that read single values and
// in-K groups (weights_packed.wgsl, weights_f16.wgsl: weight_from and weight4). Composed after
// one of them.

// Values k .. k + 3 of the row at `base`, 0.0 at k >= kdim, read one by one.
fn weight4_tail(buf_is_up: bool, base: u32, k: u32, kdim: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < kdim {
            v[j] = weight_from(buf_is_up, base + k + j);
        }
    }
    return v;
}

// weight4 where the whole group is inside K, else weight4_tail.
fn weight_group(buf_is_up: bool, base: u32, k: u32, kdim: u32) -> vec4<f32> {
    if k + 4u <= kdim {
        return weight4(buf_is_up, base + k);
    }
    return weight4_tail(buf_is_up, base, k, kdim);
}
