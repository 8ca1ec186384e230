// Sizing: rewrites the words of a plan's parameters and indirect grids that follow the live
// token count, before the plan's kernels read them (src/kernels/sizing.rs).
//
// The live token count t is live[0], at most the plan's maximum: the host checks what it
// writes there, and a larger count written on the device runs as the maximum (every buffer is
// sized for it). Each rule writes one word of one target:
//   value = min(ceil(max(per_token * t + base - floor, 0) / divisor), cap)
//     when from_tokens <= t <= to_tokens, else 0;
// a SPILL rule writes a 1-D grid of `value` workgroups as two words (x, y), spilled into y past
// max_groups as Context::grid does: x = min(value, max_groups), y = ceil(value / x), and
// (0, 1) for none. The host checks that per_token * max + base fits in u32, and it grows with
// t, so no value wraps. Every rule writes a different word.
//
// Targets: 0 .. TARGETS - 1 are the parameter buffers bound at bindings 3 .. 3 + TARGETS - 1
// (whole, as array<u32>), TARGETS the grids buffer at binding 2.

const TARGETS: u32 = 5u;
const MAX_RULES: u32 = 64u;
const KIND_VALUE: u32 = 0u;
const KIND_SPILL: u32 = 1u;

struct Rule {
    target_buffer: u32,
    word: u32,
    kind: u32,
    per_token: u32,
    base: u32,
    floor: u32,
    divisor: u32,
    cap: u32,
    from_tokens: u32,
    to_tokens: u32,
    pad0: u32,
    pad1: u32,
}

struct Rules {
    count: u32,
    max_groups: u32,
    max_tokens: u32,
    pad: u32,
    list: array<Rule, MAX_RULES>,
}

@group(0) @binding(0) var<uniform> rules: Rules;
@group(0) @binding(1) var<storage, read> live: array<u32>;
@group(0) @binding(2) var<storage, read_write> grids: array<u32>;
@group(0) @binding(3) var<storage, read_write> target0: array<u32>;
@group(0) @binding(4) var<storage, read_write> target1: array<u32>;
@group(0) @binding(5) var<storage, read_write> target2: array<u32>;
@group(0) @binding(6) var<storage, read_write> target3: array<u32>;
@group(0) @binding(7) var<storage, read_write> target4: array<u32>;

fn put(which: u32, word: u32, value: u32) {
    switch which {
        case 0u: { target0[word] = value; }
        case 1u: { target1[word] = value; }
        case 2u: { target2[word] = value; }
        case 3u: { target3[word] = value; }
        case 4u: { target4[word] = value; }
        default: { grids[word] = value; }
    }
}

@compute @workgroup_size(64)
fn size_plan(@builtin(local_invocation_index) lid: u32) {
    if lid >= min(rules.count, MAX_RULES) {
        return;
    }
    let r = rules.list[lid];
    let t = min(live[0], rules.max_tokens);
    var value = 0u;
    if r.from_tokens <= t && t <= r.to_tokens {
        let n = r.per_token * t + r.base;
        let past = select(0u, n - r.floor, n > r.floor);
        value = min(past / r.divisor + select(0u, 1u, past % r.divisor != 0u), r.cap);
    }
    if r.kind == KIND_SPILL {
        var x = min(value, rules.max_groups);
        var y = 1u;
        if x != 0u {
            y = value / x + select(0u, 1u, value % x != 0u);
        }
        put(r.target_buffer, r.word, x);
        put(r.target_buffer, r.word + 1u, y);
    } else {
        put(r.target_buffer, r.word, value);
    }
}
