// x for the row-wise kernel, read from storage: row `row`'s input starts at
// input_row(row, entry) * K; a group of four past K reads 0.0 there.
fn x_base(row: u32, entry: u32) -> u32 {
    return input_row(row, entry) * params.kdim;
}

fn x_vec(base: u32, k: u32) -> vec4<f32> {
    return x_tail(base, k, params.kdim);
}
