// Tiled grouped GEMM: a workgroup of 8 x 8 invocations computes a block of BM = 32 rows by
// BN = 32 columns, each invocation 4 rows x 4 columns, streaming K through workgroup memory in
// chunks of 32 (BK4 = 8 groups of four). All rows of a block share one expert: the tile map's entry for the block
// (dispatch tiles are multiples of BM), or params.fixed_expert. Blocks of unused tiles exit at
// once, so empty experts cost nothing. Accumulation order: see common.wgsl.

const BM: u32 = 32u;
const BN: u32 = 32u;
const BK4: u32 = 8u;

override EXPERT_FROM_TILES: bool = true;

var<workgroup> xs: array<vec4<f32>, 256>;
var<workgroup> ws: array<vec4<f32>, 256>;
var<workgroup> us: array<vec4<f32>, 256>;
var<workgroup> block_entry: array<u32, 32>;

fn weight4(is_up: bool, base: u32, k: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < params.kdim {
            v[j] = weight_from(is_up, base + k + j);
        }
    }
    return v;
}

@compute @workgroup_size(64)
fn tiled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row0 = wid.x * BM;
    let col0 = wid.y * BN;
    if row0 >= params.rows {
        return;
    }
    var expert = params.fixed_expert;
    if EXPERT_FROM_TILES {
        expert = tile_expert[(params.row_offset + row0) / params.tile_rows];
    }
    if expert == NONE {
        return;
    }
    if lid < BM {
        var e = NONE;
        if row0 + lid < params.rows {
            e = entry_of(row0 + lid);
        }
        block_entry[lid] = e;
    }
    workgroupBarrier();
    let ty = lid / 8u;
    let tx = lid % 8u;
    let kdim = params.kdim;
    let wbase = expert * params.n * kdim;
    var acc: array<vec4<f32>, 16>;
    var acc_up: array<vec4<f32>, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = vec4<f32>(0.0);
        acc_up[i] = vec4<f32>(0.0);
    }
    for (var k0 = 0u; k0 < kdim; k0 += 4u * BK4) {
        // Load: 128 vec4 of x (32 rows x 4 groups) and of w (32 cols x 4 groups), two each.
        for (var s = lid; s < BM * BK4; s += 64u) {
            let r = s / BK4;
            let g = s % BK4;
            let k = k0 + 4u * g;
            var xv = vec4<f32>(0.0);
            let e = block_entry[r];
            if e != NONE {
                let xr = input_row(row0 + r, e) * kdim;
                for (var j = 0u; j < 4u; j++) {
                    if k + j < kdim {
                        xv[j] = x[xr + k + j];
                    }
                }
            }
            xs[s] = xv;
            let c = col0 + r;
            var wv = vec4<f32>(0.0);
            var uv = vec4<f32>(0.0);
            if c < params.n {
                wv = weight4(false, wbase + c * kdim, k);
                if SWIGLU {
                    uv = weight4(true, wbase + c * kdim, k);
                }
            }
            ws[s] = wv;
            us[s] = uv;
        }
        workgroupBarrier();
        for (var g = 0u; g < BK4; g++) {
            if k0 + 4u * g < kdim {
                for (var i = 0u; i < 4u; i++) {
                    let xv = xs[(ty * 4u + i) * BK4 + g];
                    for (var j = 0u; j < 4u; j++) {
                        let c = tx + 8u * j;
                        acc[i * 4u + j] = fma(xv, ws[c * BK4 + g], acc[i * 4u + j]);
                        if SWIGLU {
                            acc_up[i * 4u + j] = fma(xv, us[c * BK4 + g], acc_up[i * 4u + j]);
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = ty * 4u + i;
        if row0 + r >= params.rows {
            continue;
        }
        let e = block_entry[r];
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + tx + 8u * j;
            if c >= params.n {
                continue;
            }
            var v = lanes_sum(acc[i * 4u + j]);
            if SWIGLU {
                v = silu_mul(v, lanes_sum(acc_up[i * 4u + j]));
            }
            if e == NONE {
                v = 0.0;
            }
            store(row0 + r, e, c, v);
        }
    }
}
