// x for the row-wise kernel, read from the dispatch's uniform window (filled by stage.wgsl:
// row win_row0 + r at vec4 r * ceil(K / 4), zero past K), so no load of x is a storage load.
@group(0) @binding(9) var<uniform> xw: array<vec4<f32>, 4096>;

fn x_base(row: u32, entry: u32) -> u32 {
    return (row - params.win_row0) * ((params.kdim + 3u) / 4u);
}

fn x_vec(base: u32, k: u32) -> vec4<f32> {
    return xw[base + k / 4u];
}
