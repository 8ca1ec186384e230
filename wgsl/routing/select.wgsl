// Scoring and top-k selection for one token per workgroup (ROUTE_WG invocations).
// On entry `score[0..experts]` holds the token's logits; `route_select` turns them into
// scores, chooses k experts and writes indices and weights. Mirrored step by step by
// reference::routing::select.
//
// Tie-break contract: experts are ranked by the order key of their selection value; a
// higher key ranks first, equal keys go to the lower expert index. The key makes -0.0 equal
// +0.0 and puts NaN below every number, -inf included. Slot j takes the best expert ranked
// strictly after slot j - 1's, so an expert is excluded by its index once chosen, never by
// rewriting its value.
//
// Selection value: without bias and groups, the logit itself. Softmax and sigmoid are
// monotone, so this is the order of the scores (with ties between scores that rounding made
// equal broken by the logit), and the chosen experts never depend on how an adapter rounds
// `exp`. With a bias (score + bias[e]) or group-limited selection (sums of scores) the value
// is computed from the scores, which come from exp_fixed below, not the adapter's `exp`.

const ROUTE_WG: u32 = 64u;
const MAX_EXPERTS: u32 = 1024u;
const MAX_K: u32 = 32u;
const MAX_GROUPS: u32 = 64u;
const NO_EXPERT: u32 = 0xffffffffu;

// 0: softmax over the row; 1: sigmoid per expert; 2: raw (scores are the logits).
override GATING: u32 = 0u;
// Select on score + bias[e]; weights still come from the unbiased score.
override HAS_BIAS: bool = false;
// Group-limited selection with params.n_group and params.topk_group.
override HAS_GROUPS: bool = false;
// Divide the chosen weights by their sum (taken in slot order).
override RENORMALIZE: bool = false;

// The module that includes this file provides `bias_value(e)` (expert e's selection bias)
// and `store_choice(i, expert, weight)` (entry i = t * k + j of the outputs):
// select_io.wgsl binds them to buffers for the routing kernels.

var<workgroup> score: array<f32, MAX_EXPERTS>;
var<workgroup> red_key: array<u32, ROUTE_WG>;
var<workgroup> red_idx: array<u32, ROUTE_WG>;
var<workgroup> red_sum: array<f32, ROUTE_WG>;
var<workgroup> group_on: array<u32, MAX_GROUPS>;
var<workgroup> chosen: array<u32, MAX_K>;

// A quiet NaN. Built from a runtime value: a constant expression that evaluates to NaN is
// a shader-creation error in WGSL (Tint enforces it), and WGSL has no NaN literal.
fn quiet_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u | (params.k & 0u));
}

// exp(x) for scores, from IEEE multiplies, fma, rounding and bit operations only (no
// built-in `exp`, whose precision WGSL leaves to the adapter). Mirrored step by step by
// reference::routing::exp_fixed. Range reduction x = n ln2 + r with n = round(x log2 e)
// (ties to even) and ln 2 split in two (0.693359375 - 2.12194440e-4); Cephes' degree-7
// polynomial for e^r; then e^r * 2^n in two exact power-of-two steps. NaN stays NaN;
// x > 88.72283 gives +inf; results below the smallest normal f32 (x < -87.33655) are 0.0, so
// no adapter's subnormal handling shows.
fn exp_fixed(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    if (bits & 0x7fffffffu) > 0x7f800000u {
        return x;
    }
    if order_key(x) > order_key(88.72283172607421875) {
        return bitcast<f32>(0x7f800000u | (bits & 0u));
    }
    if order_key(x) < order_key(-87.3365478515625) {
        return 0.0;
    }
    let n = round(x * 1.44269502162933349609375);
    let r = fma(n, 2.12194440e-4, fma(n, -0.693359375, x));
    var p = 1.9875691500e-4;
    p = fma(p, r, 1.3981999507e-3);
    p = fma(p, r, 8.3334519073e-3);
    p = fma(p, r, 4.1665795894e-2);
    p = fma(p, r, 1.6666665459e-1);
    p = fma(p, r, 5.0000001201e-1);
    let y = fma(p, r * r, r) + 1.0;
    let ni = i32(n);
    let half_n = ni / 2;
    let v = (y * bitcast<f32>(u32(half_n + 127) << 23u)) * bitcast<f32>(u32(ni - half_n + 127) << 23u);
    if (bitcast<u32>(v) & 0x7fffffffu) < 0x00800000u {
        return 0.0;
    }
    return v;
}

// Total order on f32 as u32: NaN -> 0, -0.0 -> key of +0.0, otherwise monotone in value.
fn order_key(v: f32) -> u32 {
    var b = bitcast<u32>(v);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return 0u;
    }
    if b == 0x80000000u {
        b = 0u;
    }
    if (b & 0x80000000u) != 0u {
        return ~b;
    }
    return b | 0x80000000u;
}

// Inverse of order_key (NaN for key 0, +0.0 for the key of zero).
fn key_value(k: u32) -> f32 {
    if k == 0u {
        return quiet_nan();
    }
    if (k & 0x80000000u) != 0u {
        return bitcast<f32>(k & 0x7fffffffu);
    }
    return bitcast<f32>(~k);
}

// True when (ka, ia) ranks before (kb, ib).
fn outranks(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

fn selection_value(e: u32) -> f32 {
    if HAS_BIAS {
        return score[e] + bias_value(e);
    }
    return score[e];
}

fn eligible(e: u32) -> bool {
    if HAS_GROUPS {
        return group_on[e / (params.experts / params.n_group)] != 0u;
    }
    return true;
}

// Softmax: m = the largest logit by order key (NaN below everything);
// s_e = 1.0 where l_e equals m (so +inf and all--inf rows have their limits), else
// exp_fixed(l_e - m); each invocation sums the s_e of its non-NaN experts e = lid, lid + ROUTE_WG,
// ... in ascending e from 0.0, then a tree over invocations (stride 32, 16, ..., 1:
// part[i] = part[i] + part[i + stride]); score_e = s_e / total.
// Sigmoid: score_e = 1.0 / (1.0 + exp_fixed(-l_e)). Raw: score_e = l_e.
// A NaN logit gets a NaN score and adds nothing to the softmax sum, so it never poisons the
// other experts and ranks last.
fn scores_from_logits(lid: u32) {
    let n = params.experts;
    if GATING == 0u {
        var mk = 0u;
        for (var e = lid; e < n; e += ROUTE_WG) {
            mk = max(mk, order_key(score[e]));
        }
        red_key[lid] = mk;
        workgroupBarrier();
        for (var s = ROUTE_WG / 2u; s > 0u; s >>= 1u) {
            if lid < s {
                red_key[lid] = max(red_key[lid], red_key[lid + s]);
            }
            workgroupBarrier();
        }
        let mk_row = red_key[0];
        let m = key_value(mk_row);
        var acc = 0.0;
        for (var e = lid; e < n; e += ROUTE_WG) {
            let key = order_key(score[e]);
            var v = quiet_nan();
            if key != 0u {
                if key == mk_row {
                    v = 1.0;
                } else {
                    v = exp_fixed(score[e] - m);
                }
                acc = acc + v;
            }
            score[e] = v;
        }
        red_sum[lid] = acc;
        workgroupBarrier();
        for (var s = ROUTE_WG / 2u; s > 0u; s >>= 1u) {
            if lid < s {
                red_sum[lid] = red_sum[lid] + red_sum[lid + s];
            }
            workgroupBarrier();
        }
        let total = red_sum[0];
        for (var e = lid; e < n; e += ROUTE_WG) {
            score[e] = score[e] / total;
        }
    } else if GATING == 1u {
        for (var e = lid; e < n; e += ROUTE_WG) {
            var v = quiet_nan();
            if order_key(score[e]) != 0u {
                v = 1.0 / (1.0 + exp_fixed(-score[e]));
            }
            score[e] = v;
        }
    }
    workgroupBarrier();
}

// Group-limited routing: group g holds experts [g * gs, (g + 1) * gs). Its value is
// v1 + v2, the selection values of its two best experts in rank order (best first).
// Invocation 0 then picks topk_group groups by the same rank rule on those values.
fn choose_groups(lid: u32) {
    let groups = params.n_group;
    let gs = params.experts / groups;
    if lid < groups {
        var k1 = 0u;
        var i1 = NO_EXPERT;
        var k2 = 0u;
        var i2 = NO_EXPERT;
        for (var j = 0u; j < gs; j++) {
            let e = lid * gs + j;
            let key = order_key(selection_value(e));
            if outranks(key, e, k1, i1) {
                k2 = k1;
                i2 = i1;
                k1 = key;
                i1 = e;
            } else if outranks(key, e, k2, i2) {
                k2 = key;
                i2 = e;
            }
        }
        red_sum[lid] = selection_value(i1) + selection_value(i2);
        group_on[lid] = 0u;
    }
    workgroupBarrier();
    if lid == 0u {
        for (var j = 0u; j < params.topk_group; j++) {
            var bk = 0u;
            var bg = NO_EXPERT;
            for (var g = 0u; g < groups; g++) {
                let key = order_key(red_sum[g]);
                if group_on[g] == 0u && outranks(key, g, bk, bg) {
                    bk = key;
                    bg = g;
                }
            }
            group_on[bg] = 1u;
        }
    }
    workgroupBarrier();
}

// Slot j: each invocation finds its best eligible expert ranked after slot j - 1's pick,
// then a tree over invocations (stride 32, ..., 1) keeps the better of each pair.
fn choose_experts(lid: u32) {
    let n = params.experts;
    var pk = 0xffffffffu;
    var pi = 0u;
    for (var j = 0u; j < params.k; j++) {
        var bk = 0u;
        var bi = NO_EXPERT;
        for (var e = lid; e < n; e += ROUTE_WG) {
            if eligible(e) {
                let key = order_key(selection_value(e));
                if outranks(pk, pi, key, e) && outranks(key, e, bk, bi) {
                    bk = key;
                    bi = e;
                }
            }
        }
        red_key[lid] = bk;
        red_idx[lid] = bi;
        workgroupBarrier();
        for (var s = ROUTE_WG / 2u; s > 0u; s >>= 1u) {
            if lid < s && outranks(red_key[lid + s], red_idx[lid + s], red_key[lid], red_idx[lid]) {
                red_key[lid] = red_key[lid + s];
                red_idx[lid] = red_idx[lid + s];
            }
            workgroupBarrier();
        }
        pk = red_key[0];
        pi = red_idx[0];
        if lid == 0u {
            chosen[j] = pi;
        }
        workgroupBarrier();
    }
}

// Zero for a subnormal (or zero) `v`, `v` otherwise (NaN and infinities included). WGSL lets
// an implementation flush f32 subnormals to zero (SwiftShader does, Mesa does not); the
// renormalising sum flushes explicitly, so its result is the same on both kinds.
fn flush_subnormal(v: f32) -> f32 {
    return select(v, 0.0, abs(v) < 1.17549435e-38);
}

// Without bias and groups the experts are chosen on the logits (before scoring), else on
// the scores (plus bias). Weights: w_j = score[chosen_j]; with RENORMALIZE each w_j is
// flushed (flush_subnormal), sum = flush(sum + w_j) in slot order from 0.0, and w_j = w_j / sum;
// finally w_j = w_j * scale.
fn route_select(t: u32, lid: u32) {
    let on_logits = !HAS_BIAS && !HAS_GROUPS;
    if on_logits {
        choose_experts(lid);
    }
    scores_from_logits(lid);
    if !on_logits {
        if HAS_GROUPS {
            choose_groups(lid);
        }
        choose_experts(lid);
    }
    let k = params.k;
    if lid == 0u {
        var sum = 0.0;
        if RENORMALIZE {
            for (var j = 0u; j < k; j++) {
                sum = flush_subnormal(sum + flush_subnormal(score[chosen[j]]));
            }
        }
        let out = t * k;
        for (var j = 0u; j < k; j++) {
            var w = score[chosen[j]];
            if RENORMALIZE {
                w = flush_subnormal(w) / sum;
            }
            store_choice(out + j, chosen[j], w * params.scale);
        }
    }
}
