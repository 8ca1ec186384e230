// A small GGUF file (version 3) of one Qwen3-MoE layer, written here as llama.cpp lays it out,
// for the browser test's file case: an F32 router and Q8_0 expert tensors with seeded values.
const ALIGN = 32;

function str(s) {
  const b = new TextEncoder().encode(s);
  const out = new Uint8Array(8 + b.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(b.length), true);
  out.set(b, 8);
  return out;
}

function u32(v) {
  const out = new Uint8Array(4);
  new DataView(out.buffer).setUint32(0, v, true);
  return out;
}

function u64(v) {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(v), true);
  return out;
}

function cat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const pad = (n) => Math.ceil(n / ALIGN) * ALIGN;

/// `count` values from a xorshift state, in [-1, 1).
function values(state, count) {
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    out[i] = ((state >>> 0) / 2 ** 32) * 2 - 1;
  }
  return out;
}

/// Q8_0 blocks of 32 values: an f16 scale (0.0078125 here) and 32 int8 codes.
function q8_0(count, seed) {
  const v = values(seed, count);
  const out = new Uint8Array((count / 32) * 34);
  for (let b = 0; b < count / 32; b++) {
    out[b * 34] = 0x00;
    out[b * 34 + 1] = 0x20; // f16 0x2000 = 2^-7
    for (let i = 0; i < 32; i++) out[b * 34 + 2 + i] = Math.round(v[b * 32 + i] * 127) & 0xff;
  }
  return out;
}

/// The file's bytes: hidden `h`, expert FFN `f`, `e` experts, top-`k`.
export function qwen3MoeLayer({ h = 64, f = 32, e = 8, k = 2 } = {}) {
  const kv = [
    ["general.architecture", 8, str("qwen3moe")],
    ["qwen3moe.expert_count", 4, u32(e)],
    ["qwen3moe.expert_used_count", 4, u32(k)],
    ["qwen3moe.expert_feed_forward_length", 4, u32(f)],
  ];
  const f32 = (a) => new Uint8Array(a.buffer);
  const tensors = [
    ["blk.0.ffn_gate_inp.weight", [h, e], 0, f32(values(7, h * e))],
    ["blk.0.ffn_gate_exps.weight", [h, f, e], 8, q8_0(h * f * e, 11)],
    ["blk.0.ffn_up_exps.weight", [h, f, e], 8, q8_0(h * f * e, 13)],
    ["blk.0.ffn_down_exps.weight", [f, h, e], 8, q8_0(f * h * e, 17)],
  ];
  const head = [new TextEncoder().encode("GGUF"), u32(3), u64(tensors.length), u64(kv.length)];
  for (const [key, type, value] of kv) head.push(str(key), u32(type), value);
  let offset = 0;
  for (const [name, dims, type, data] of tensors) {
    head.push(str(name), u32(dims.length), ...dims.map(u64), u32(type), u64(offset));
    offset += pad(data.length);
  }
  const header = cat(head);
  const parts = [header, new Uint8Array(pad(header.length) - header.length)];
  for (const [, , , data] of tensors) parts.push(data, new Uint8Array(pad(data.length) - data.length));
  return cat(parts);
}
