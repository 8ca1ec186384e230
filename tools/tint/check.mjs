// Compiles every pipeline recorded by a moeflow run (MOEFLOW_DUMP_PIPELINES=DIR) with Dawn,
// the WebGPU implementation inside Chromium, whose WGSL compiler is Tint: each recorded module
// and, for each recorded entry point and set of override constants, a compute pipeline.
//
//   VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json node check.mjs DIR [--part I/N]
//
// `--part I/N` checks only the records whose index (in name order) is I modulo N: a process
// keeps every pipeline it compiled, and SwiftShader's code for a quantised expert kernel takes
// about 1 GB, so CI runs the records in N processes (one process ran out of 24 GiB).
//
// Dawn needs a Vulkan driver it accepts (SwiftShader here; it refuses Mesa 22's lavapipe).
// Modules that enable f16 are reported as skipped where the adapter has no shader-f16.
// Exit status: 0 when every pipeline compiled, 1 when one failed, 2 when nothing could run.
import fs from 'node:fs';
import path from 'node:path';
import { openDawn } from './dawn.mjs';

const dir = process.argv[2];
if (!dir || !fs.existsSync(dir)) {
  console.error('usage: node check.mjs DIR (a folder written by MOEFLOW_DUMP_PIPELINES)');
  process.exit(2);
}
const all = fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
if (all.length === 0) {
  console.error(`no pipeline records in ${dir}`);
  process.exit(2);
}
const partArg = process.argv.indexOf('--part');
const [part, parts] = partArg > 0 ? process.argv[partArg + 1].split('/').map(Number) : [0, 1];
if (!(parts >= 1 && part >= 0 && part < parts)) {
  console.error('--part takes I/N with 0 <= I < N');
  process.exit(2);
}
const records = all.filter((_, i) => i % parts === part);
const { device, features, description } = await openDawn();
console.log(`adapter: ${description}`);
const modules = new Map();
let ok = 0;
let failed = 0;
let skipped = 0;
for (const file of records) {
  const rec = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'));
  const code = fs.readFileSync(path.join(dir, rec.module), 'utf8');
  const name = `${rec.module} ${rec.entry} ${JSON.stringify(rec.constants)}`;
  if (/^\s*enable f16;/m.test(code) && !features.includes('shader-f16')) {
    skipped++;
    console.log(`SKIP ${name} (the adapter has no shader-f16)`);
    continue;
  }
  const errors = [];
  device.pushErrorScope('validation');
  let module = modules.get(rec.module);
  if (!module) {
    module = device.createShaderModule({ code, label: rec.module });
    const info = await module.getCompilationInfo();
    module.errors = info.messages.filter((m) => m.type === 'error')
      .map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
    modules.set(rec.module, module);
  }
  errors.push(...module.errors);
  try {
    await device.createComputePipelineAsync({
      layout: 'auto',
      compute: { module, entryPoint: rec.entry, constants: rec.constants },
    });
  } catch (e) {
    errors.push(String(e.message ?? e));
  }
  const scope = await device.popErrorScope();
  if (scope) errors.push(scope.message);
  if (errors.length) {
    failed++;
    console.log(`FAIL ${name}`);
    for (const e of new Set(errors)) console.log(`    ${e.split('\n').slice(0, 8).join('\n    ')}`);
  } else {
    ok++;
  }
}
console.log(
  `tint: ${ok} pipelines compiled, ${failed} failed, ${skipped} skipped (of ${records.length}; part ${part}/${parts} of ${all.length})`,
);
process.exit(failed ? 1 : 0);
