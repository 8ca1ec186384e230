// Bucket ("caps") routing on top of a k = 1, tile = 1 layout: bucket c keeps its first
// `bound` tokens in stable order in pad_perm[c * bound .. (c + 1) * bound) (NONE pads);
// tokens past the bound go, in (bucket, rank) order, to the overflow list.

@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
@group(0) @binding(4) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(6) var<storage, read_write> perm: array<u32>;
@group(0) @binding(7) var<storage, read_write> inverse: array<u32>;
@group(0) @binding(1) var<storage, read_write> indices: array<u32>;
@group(0) @binding(10) var<storage, read_write> overflow_offsets: array<u32>;
@group(0) @binding(11) var<storage, read_write> pad_perm: array<u32>;
@group(0) @binding(12) var<storage, read_write> overflow: array<u32>;

// One invocation per pad_perm slot (bucket c, rank r).
@compute @workgroup_size(64)
fn bucket_slots(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let s = gid.x + gid.y * nwg.x * 64u;
    if s >= params.experts * params.bound {
        return;
    }
    let c = s / params.bound;
    let r = s % params.bound;
    var token = NONE;
    if r < counts[c] {
        token = perm[offsets[c] + r];
    }
    pad_perm[s] = token;
}

// One invocation per token: tokens ranked at or past the bound go to the overflow list.
@compute @workgroup_size(64)
fn bucket_overflow(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i >= params.entries {
        return;
    }
    let c = indices[i];
    if c >= params.experts {
        return;
    }
    let rank = inverse[i] - offsets[c];
    if rank >= params.bound {
        overflow[overflow_offsets[c] + rank - params.bound] = i;
    }
}
