// Expert weights packed in u32 words, unpacked with integer operations so every adapter runs
// every dtype: DTYPE 0 is f32 (one per word), 1 is IEEE half and 2 is bfloat16 (two per word,
// low half first; half.wgsl widens them). The quantised formats (DTYPE 3..6) have their own
// weights file, weights_quant.wgsl. A row starts at weight_row(expert, col), its first
// element's index. weight_from(is_up, idx) returns element idx of w (or w_up) as f32;
// weight4(is_up, idx) elements idx .. idx + 3 (all inside the buffer), reading each word once;
// weight_groups.wgsl (composed after this file) reads groups of four at any k from them.

// Weights [E, N, K].
@group(0) @binding(2) var<storage, read> w: array<u32>;
// Second weights (up projection) for SWIGLU, same shape and dtype.
@group(0) @binding(3) var<storage, read> w_up: array<u32>;

fn weight_row(expert: u32, col: u32) -> u32 {
    return weight_row_index(expert, col) * params.kdim;
}

fn weight_from(buf_is_up: bool, idx: u32) -> f32 {
    var word: u32;
    if DTYPE == 0u {
        if buf_is_up {
            return bitcast<f32>(w_up[idx]);
        }
        return bitcast<f32>(w[idx]);
    }
    if buf_is_up {
        word = w_up[idx >> 1u];
    } else {
        word = w[idx >> 1u];
    }
    let bits16 = (word >> ((idx & 1u) * 16u)) & 0xffffu;
    if DTYPE == 1u {
        return f16_bits_to_f32(bits16);
    }
    return bitcast<f32>(bits16 << 16u);
}

fn weight_word(buf_is_up: bool, i: u32) -> u32 {
    if buf_is_up {
        return w_up[i];
    }
    return w[i];
}

fn weight4(buf_is_up: bool, idx: u32) -> vec4<f32> {
    if DTYPE == 0u {
        return vec4<f32>(
            bitcast<f32>(weight_word(buf_is_up, idx)),
            bitcast<f32>(weight_word(buf_is_up, idx + 1u)),
            bitcast<f32>(weight_word(buf_is_up, idx + 2u)),
            bitcast<f32>(weight_word(buf_is_up, idx + 3u)),
        );
    }
    let i = idx >> 1u;
    let a = weight_word(buf_is_up, i);
    let b = weight_word(buf_is_up, i + 1u);
    if (idx & 1u) == 0u {
        return vec4<f32>(half_to_f32(a & 0xffffu), half_to_f32(a >> 16u), half_to_f32(b & 0xffffu), half_to_f32(b >> 16u));
    }
    let c = weight_word(buf_is_up, i + 2u);
    return vec4<f32>(half_to_f32(a >> 16u), half_to_f32(b & 0xffffu), half_to_f32(b >> 16u), half_to_f32(c & 0xffffu));
}
