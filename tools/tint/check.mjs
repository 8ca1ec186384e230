// Compiles every pipeline recorded by a moeflow run (MOEFLOW_DUMP_PIPELINES=DIR) with Dawn,
// the WebGPU implementation inside Chromium, whose WGSL compiler is Tint: each recorded module
// and, for each recorded entry point and set of override constants, a compute pipeline.
//
//   VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json node check.mjs DIR
//
// A process keeps every pipeline it compiled (neither dropping the objects nor a forced GC
// gives SwiftShader's code back), and SwiftShader's code for a quantised expert kernel takes
// about 1 GB. So the records are compiled by worker processes, in name order: a worker stops
// after the record that takes its resident memory past TINT_WORKER_RSS_MB (default 6144) and
// the next worker goes on from there. The records are cut into TINT_JOBS shards (default: one
// per core) whose workers run side by side. A worker that dies (the OOM killer, a crash in the
// driver) fails the record it was compiling, and the next worker goes on after it.
// TINT_TRACE=1 prints each record's time and the worker's resident memory (stderr).
//
// Measured (SwiftShader 5.0.0, 2 cores): the expert kernels' register blocks dominate, a
// quantised window 16 x 8 pipeline 20-60 s and under 0.5 GB since the unpacking is
// branch-free; with branches, SwiftShader's compile of one FP8 16 x 8 kernel passed 17 GB.
//
// Dawn needs a Vulkan driver it accepts (SwiftShader here; it refuses Mesa 22's lavapipe).
// Modules that enable f16 are reported as skipped where the adapter has no shader-f16, and
// modules that read subgroup builtins where it has no subgroups (they get the
// `enable subgroups;` that naga refuses and Tint asks for); modules on wgpu's cooperative
// matrices always (none is recorded on the CPU adapters, which lack them).
// Exit status: 0 when every pipeline compiled, 1 when one failed, 2 when nothing could run.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { openDawn } from './dawn.mjs';

const dir = process.argv[2];
if (!dir || !fs.existsSync(dir)) {
  console.error('usage: node check.mjs DIR (a folder written by MOEFLOW_DUMP_PIPELINES)');
  process.exit(2);
}
const records = fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
if (records.length === 0) {
  console.error(`no pipeline records in ${dir}`);
  process.exit(2);
}
const workerArg = process.argv.indexOf('--worker');
if (workerArg > 0) {
  await worker(Number(process.argv[workerArg + 1]), Number(process.argv[workerArg + 2]));
} else {
  await parent();
}

/**
 * Splits the records (in name order, so one module's pipelines stay together) into TINT_JOBS
 * contiguous shards (default: the number of cores) run side by side, each by workers in turn
 * until every record of the shard has a verdict; prints the verdicts and the totals.
 */
async function parent() {
  const limitMb = Number(process.env.TINT_WORKER_RSS_MB ?? 6144);
  const jobs = Math.max(1, Math.min(Number(process.env.TINT_JOBS ?? os.availableParallelism()), records.length));
  const counts = { ok: 0, failed: 0, skipped: 0 };
  const state = { workers: 0, description: null };
  const bounds = Array.from({ length: jobs + 1 }, (_, i) => Math.round((i * records.length) / jobs));
  const shards = Array.from({ length: jobs }, (_, i) => shard(bounds[i], bounds[i + 1], limitMb, counts, state));
  await Promise.all(shards);
  console.log(`adapter: ${state.description}`);
  console.log(
    `tint: ${counts.ok} pipelines compiled, ${counts.failed} failed, ${counts.skipped} skipped (of ${records.length}, in ${state.workers} worker process(es), ${jobs} at a time)`,
  );
  process.exit(counts.failed ? 1 : 0);
}

/** Runs workers over records [from, to) in turn until each has a verdict. */
async function shard(from, to, limitMb, counts, state) {
  let next = from;
  while (next < to) {
    state.workers++;
    const start = next;
    const child = spawn(
      process.execPath,
      [fileURLToPath(import.meta.url), dir, '--worker', String(start), String(to)],
      {
        env: { ...process.env, TINT_WORKER_RSS_MB: String(limitMb) },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    let current = start;
    const lines = readline.createInterface({ input: child.stdout });
    for await (const line of lines) {
      const msg = JSON.parse(line);
      if (msg.adapter) {
        state.description ??= msg.adapter;
      } else if (msg.start !== undefined) {
        current = msg.start;
      } else {
        counts[msg.verdict]++;
        if (msg.verdict !== 'ok') console.log(`${msg.verdict === 'failed' ? 'FAIL' : 'SKIP'} ${msg.name}${msg.why}`);
        next = msg.index + 1;
      }
    }
    const code = await new Promise((resolve) => child.on('close', (c, signal) => resolve(signal ?? c)));
    if (code === 2) process.exit(2);
    if (next <= current && current < to && code !== 0) {
      // The worker died while compiling `current`.
      counts.failed++;
      console.log(`FAIL ${records[current]}\n    the compiling process ended (${code}) while compiling it`);
      next = current + 1;
    }
  }
}

/** Compiles records [from, to), one JSON line per verdict, until the memory limit. */
async function worker(from, to) {
  const limit = Number(process.env.TINT_WORKER_RSS_MB ?? 6144) * 1024 * 1024;
  const { device, features, description } = await openDawn();
  const say = (msg) => process.stdout.write(`${JSON.stringify(msg)}\n`);
  say({ adapter: description });
  const modules = new Map();
  for (let index = from; index < to; index++) {
    say({ start: index });
    const rec = JSON.parse(fs.readFileSync(path.join(dir, records[index]), 'utf8'));
    let code = fs.readFileSync(path.join(dir, rec.module), 'utf8');
    const name = `${rec.module} ${rec.entry} ${JSON.stringify(rec.constants)}`;
    if (/^\s*enable wgpu_cooperative_matrix;/m.test(code)) {
      say({ index, name, verdict: 'skipped', why: ' (cooperative matrices are a wgpu extension WebGPU lacks)' });
      continue;
    }
    if (/^\s*enable f16;/m.test(code) && !features.includes('shader-f16')) {
      say({ index, name, verdict: 'skipped', why: ' (the adapter has no shader-f16)' });
      continue;
    }
    if (/@builtin\(subgroup_/.test(code)) {
      if (!features.includes('subgroups')) {
        say({ index, name, verdict: 'skipped', why: ' (the adapter has no subgroups)' });
        continue;
      }
      // WGSL asks for the directive; naga (wgpu 30) refuses it and takes the builtins
      // from the device's SUBGROUP feature, so moeflow's modules leave it out.
      code = `enable subgroups;\n${code}`;
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
    const why = [...new Set(errors)].map((e) => `\n    ${e.split('\n').slice(0, 8).join('\n    ')}`).join('');
    say({ index, name, verdict: errors.length ? 'failed' : 'ok', why });
    if (process.env.TINT_TRACE) {
      const mb = Math.round(process.memoryUsage().rss / 1048576);
      console.error(`${new Date().toISOString()} ${index} ${records[index]} rss ${mb} MB`);
    }
    if (process.memoryUsage().rss > limit) break;
  }
  process.exit(0);
}
