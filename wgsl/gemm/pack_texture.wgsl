// Copies packed expert-weight words (weights_packed.wgsl's layout: [rows, K] elements, f32 one
// per word, halves two per word low half first) into the row-pitched layout of a texture upload
// (weights_texture.wgsl's layout): row r's K elements as texels of four words (four f32
// elements, or eight halves), zeros past K, rows `pitch_words` words apart. Copies bits only;
// nothing is converted.

struct PackParams {
    // Rows to pack.
    rows: u32,
    // First row to pack, relative to the bound source.
    src_row0: u32,
    // Elements per row (K).
    kdim: u32,
    // Words a packed row holds in the destination: 4 per texel, ceil(K / 4) (f32) or
    // ceil(K / 8) (16-bit) texels.
    row_words: u32,
    // Words from one destination row to the next (a multiple of 64: 256-byte copy rows).
    pitch_words: u32,
    // 0: f32 weights (one element per word); 1: 16-bit weights (two per word).
    halves: u32,
}

@group(0) @binding(0) var<uniform> params: PackParams;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn pack(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let i = gid.x + gid.y * groups.x * 64u;
    let r = i / params.row_words;
    let m = i % params.row_words;
    if r >= params.rows {
        return;
    }
    let base = (params.src_row0 + r) * params.kdim;
    var word = 0u;
    if params.halves == 0u {
        if m < params.kdim {
            word = src[base + m];
        }
    } else {
        for (var j = 0u; j < 2u; j++) {
            let k = 2u * m + j;
            if k < params.kdim {
                let e = base + k;
                let half = (src[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu;
                word |= half << (16u * j);
            }
        }
    }
    dst[r * params.pitch_words + m] = word;
}
