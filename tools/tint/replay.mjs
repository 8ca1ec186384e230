// Replays kernel runs captured by moeflow's `tests/dawn.rs` (MOEFLOW_DAWN_CASES=DIR) under
// Dawn, the WebGPU implementation inside Chromium (WGSL compiled by Tint), and checks their
// outputs against the CPU reference's values with the same bounds the Rust test applies under
// wgpu: every word equal for indices and layouts, 2e-5 + 2e-5·|ref| per element, or
// 2e-5 + 2e-5·max|ref row| per row for sums whose terms cancel.
//
//   VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json node replay.mjs DIR
//
// Each case folder holds case.json (buffers, textures, dispatches in order, checks), the
// buffers' bytes and the textures' texels before the run, the WGSL modules and the expected
// outputs. The dispatches run in one compute
// pass, as moeflow records them; the pipelines get explicit bind-group layouts with the
// access moeflow declares for each binding.
// Exit status: 0 when every case passed, 1 when one failed, 2 when nothing could run.
import fs from 'node:fs';
import path from 'node:path';
import { openDawn } from './dawn.mjs';

const dir = process.argv[2];
if (!dir || !fs.existsSync(dir)) {
  console.error('usage: node replay.mjs DIR (a folder written by tests/dawn.rs with MOEFLOW_DAWN_CASES)');
  process.exit(2);
}
const cases = fs.readdirSync(dir).filter((d) => fs.existsSync(path.join(dir, d, 'case.json'))).sort();
if (cases.length === 0) {
  console.error(`no cases in ${dir}`);
  process.exit(2);
}
const { device, description } = await openDawn();
console.log(`adapter: ${description}`);

const USAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_SRC
  | GPUBufferUsage.COPY_DST;

/** Words of `got` against `want` under `bound`; the first mismatch, or null. */
function mismatch(got, want, bound) {
  const f = new Float32Array(got.buffer, got.byteOffset, got.length);
  const w = new Float32Array(want.buffer, want.byteOffset, want.length);
  const close = (a, b, scale) => {
    if (Number.isNaN(a) || Number.isNaN(b)) return Number.isNaN(a) && Number.isNaN(b);
    if (!Number.isFinite(a) || !Number.isFinite(b)) return a === b;
    return Math.abs(a - b) <= 2e-5 + 2e-5 * scale;
  };
  switch (bound.kind) {
    case 'exact':
      for (let i = 0; i < want.length; i++) {
        if (got[i] !== want[i]) return `word ${i}: got 0x${got[i].toString(16)}, want 0x${want[i].toString(16)}`;
      }
      return null;
    case 'close':
      for (let i = 0; i < want.length; i++) {
        if (!close(f[i], w[i], Math.abs(w[i]))) return `element ${i}: got ${f[i]}, want ${w[i]}`;
      }
      return null;
    case 'rows':
      for (let r = 0; r * bound.width < want.length; r++) {
        const row = w.subarray(r * bound.width, (r + 1) * bound.width);
        const scale = row.reduce((m, v) => (Number.isFinite(v) ? Math.max(m, Math.abs(v)) : m), 0);
        for (let c = 0; c < row.length; c++) {
          const a = f[r * bound.width + c];
          if (!close(a, row[c], scale)) return `row ${r} col ${c}: got ${a}, want ${row[c]}`;
        }
      }
      return null;
    default:
      return `unknown bound ${JSON.stringify(bound)}`;
  }
}

/** Runs one case; resolves to a list of failures (empty when it passed). */
async function replay(at, spec) {
  const failures = [];
  device.pushErrorScope('validation');
  const buffers = spec.buffers.map((b) => {
    const buffer = device.createBuffer({ size: b.size, usage: USAGE, mappedAtCreation: true });
    new Uint8Array(buffer.getMappedRange()).set(fs.readFileSync(path.join(at, b.file)));
    buffer.unmap();
    return buffer;
  });
  const textures = (spec.textures ?? []).map((t) => {
    const [width, height, layers] = t.size;
    const texture = device.createTexture({
      size: [width, height, layers],
      format: t.format,
      usage: GPUTextureUsage.TEXTURE_BINDING | GPUTextureUsage.COPY_DST,
    });
    device.queue.writeTexture({ texture }, fs.readFileSync(path.join(at, t.file)),
      { bytesPerRow: t.bytesPerRow, rowsPerImage: height }, [width, height, layers]);
    return texture;
  });
  const modules = new Map();
  const pipelines = new Map();
  const steps = [];
  for (const d of spec.dispatches) {
    if (!modules.has(d.module)) {
      const module = device.createShaderModule({ code: fs.readFileSync(path.join(at, d.module), 'utf8'), label: d.module });
      const info = await module.getCompilationInfo();
      for (const m of info.messages.filter((m) => m.type === 'error')) {
        failures.push(`${d.module} ${m.lineNum}:${m.linePos} ${m.message}`);
      }
      modules.set(d.module, module);
    }
    const bound = d.textures ?? [];
    const key = `${d.module} ${d.entry} ${JSON.stringify(d.constants)} ${d.bindings.map((b) => `${b.binding}:${b.access}`)} ${bound.map((t) => t.binding)}`;
    if (!pipelines.has(key)) {
      const layout = device.createBindGroupLayout({
        entries: [
          ...d.bindings.map((b) => ({ binding: b.binding, visibility: GPUShaderStage.COMPUTE, buffer: { type: b.access } })),
          ...bound.map((t) => ({
            binding: t.binding,
            visibility: GPUShaderStage.COMPUTE,
            texture: { sampleType: 'uint', viewDimension: '2d-array' },
          })),
        ],
      });
      const pipeline = await device.createComputePipelineAsync({
        layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
        compute: { module: modules.get(d.module), entryPoint: d.entry, constants: d.constants },
      }).catch((e) => { failures.push(`${d.entry}: ${e.message ?? e}`); return null; });
      pipelines.set(key, { layout, pipeline });
    }
    const { layout, pipeline } = pipelines.get(key);
    const group = device.createBindGroup({
      layout,
      entries: [
        ...d.bindings.map((b) => ({ binding: b.binding, resource: { buffer: buffers[b.buffer], offset: b.offset, size: b.size } })),
        ...bound.map((t) => ({ binding: t.binding, resource: textures[t.texture].createView({ dimension: '2d-array' }) })),
      ],
    });
    steps.push({ pipeline, group, workgroups: d.workgroups });
  }
  if (failures.length) {
    await device.popErrorScope();
    return failures;
  }
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  for (const s of steps) {
    pass.setPipeline(s.pipeline);
    pass.setBindGroup(0, s.group);
    pass.dispatchWorkgroups(...s.workgroups);
  }
  pass.end();
  const reads = spec.checks.map((c) => {
    const bytes = c.words * 4;
    const read = device.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    encoder.copyBufferToBuffer(buffers[c.buffer], c.offset ?? 0, read, 0, bytes);
    return read;
  });
  device.queue.submit([encoder.finish()]);
  const scope = await device.popErrorScope();
  if (scope) return [scope.message];
  for (const [i, c] of spec.checks.entries()) {
    await reads[i].mapAsync(GPUMapMode.READ);
    const got = new Uint32Array(reads[i].getMappedRange().slice(0));
    reads[i].unmap();
    const raw = fs.readFileSync(path.join(at, c.expected));
    const want = new Uint32Array(raw.buffer, raw.byteOffset, raw.length / 4);
    const bad = mismatch(got, want, c.bound);
    if (bad) failures.push(`${c.what}: ${bad}`);
  }
  for (const b of [...buffers, ...reads, ...textures]) b.destroy();
  return failures;
}

let passed = 0;
let failed = 0;
for (const name of cases) {
  const at = path.join(dir, name);
  const spec = JSON.parse(fs.readFileSync(path.join(at, 'case.json'), 'utf8'));
  const started = Date.now();
  const failures = await replay(at, spec);
  const secs = ((Date.now() - started) / 1000).toFixed(1);
  if (failures.length) {
    failed++;
    console.log(`FAIL ${name} (${spec.dispatches.length} dispatches, ${secs} s)`);
    for (const f of failures) console.log(`    ${f.split('\n').slice(0, 8).join('\n    ')}`);
  } else {
    passed++;
    const checks = spec.checks.map((c) => `${c.what} ${c.bound.kind}`).join(', ');
    console.log(`PASS ${name} (${spec.dispatches.length} dispatches, ${secs} s): ${checks}`);
  }
}
console.log(`dawn: ${passed} cases passed, ${failed} failed (of ${cases.length})`);
process.exit(failed ? 1 : 0);
