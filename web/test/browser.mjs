// Runs web/index.html in headless Chromium on its WebGPU adapter (SwiftShader) and checks the
// reports the page leaves in window.moeflowResult: for every case, routing equal to the CPU
// reference on every checked token and every output within the bound (page.mjs serves web/
// and starts Chromium). A missing browser, no WebGPU adapter or a failed case is a
// failure (exit status 1). Usage: node web/test/browser.mjs [chromium binary]
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { qwen3MoeLayer } from "./gguf.mjs";
import { result, start } from "./page.mjs";

// The synthetic cases: decode and prefill sizes, f32 and quantised weights.
const cases = [
  { name: "f32, decode and prefill", query: "tokens=1,64&dtype=f32" },
  { name: "q4_0, decode and prefill", query: "tokens=1,64&dtype=q4_0" },
  { name: "mxfp4, prefill", query: "tokens=33&dtype=mxfp4" },
  // Each projection's f32 weights (16 x 1040 x 2048) are past the 128 MiB binding the device
  // is capped at, so each is split across two bindings, as natively.
  {
    name: "f32 weights split across bindings, decode and prefill",
    query: "tokens=1,8&hidden=2048&ffn=1040&experts=16&k=2&max_binding_mib=128",
    split: true,
  },
];

// A user's own files, picked on the page: checkpoints of tests/parity.rs (made by
// tools/hf_fixtures.py), their routing read from config.json as the native loader reads it.
const fixtures = fileURLToPath(new URL("../../tests/fixtures/hf/", import.meta.url));
const files = [
  { name: "file: Mixtral f32 (safetensors + config.json)", dir: "mixtral_f32_t37", tokens: "1,37" },
  { name: "file: gpt-oss MXFP4 blocks (safetensors + config.json)", dir: "gpt_oss_mxfp4_t37", tokens: "37" },
];

const { base, browser, close } = await start(process.argv[2]);
let failed = 0;
// Opens the page at `query`, lets `begin` start a run, and returns its report.
async function report(query, begin) {
  const page = await browser.newPage();
  page.on("console", (m) => m.type() === "error" && console.log(`  console: ${m.text()}`));
  await page.goto(`${base}index.html?${query}`);
  await begin(page);
  const out = await result(page);
  await page.close();
  return out;
}
const all = [
  ...cases.map((c) => ({ ...c, query: `${c.query}&run=1`, begin: async () => {} })),
  ...files.map((f) => ({
    name: f.name,
    query: "",
    begin: async (page) => {
      await page.waitForFunction(() => window.moeflowReady === true, null, { timeout: 60_000 });
      await page.setInputFiles("#file input[name=weights]", join(fixtures, f.dir, "weights.safetensors"));
      await page.setInputFiles("#file input[name=config]", join(fixtures, f.dir, "config.json"));
      await page.fill("#file input[name=tokens]", f.tokens);
      await page.click("#file button");
    },
  })),
  {
    name: "file: Qwen3-MoE Q8_0 (GGUF, written by gguf.mjs)",
    query: "",
    begin: async (page) => {
      await page.waitForFunction(() => window.moeflowReady === true, null, { timeout: 60_000 });
      const buffer = Buffer.from(qwen3MoeLayer());
      await page.setInputFiles("#file input[name=weights]", { name: "layer.gguf", mimeType: "application/octet-stream", buffer });
      await page.fill("#file input[name=tokens]", "1,40");
      await page.click("#file button");
    },
  },
];
try {
  {
    const { r } = await report("errors=1", async () => {});
    console.log(`== misuse: read-back of a destroyed buffer\n${r.refused ?? r.error}`);
    if (!r.refused) {
      failed += 1;
      console.log(`FAIL: misuse went through: ${r.error}`);
    }
  }
  for (const c of all) {
    const { r, text } = await report(c.query, c.begin);
    console.log(`== ${c.name}\n${text}`);
    const ok =
      !r.error &&
      r.pass &&
      r.runs.every((run) => run.routing_equal === run.checked_tokens && run.outputs_within) &&
      (!c.split || r.weight_bindings.every((n) => n > 1));
    if (!ok) {
      failed += 1;
      console.log(`FAIL: ${c.name}: ${r.error ?? "routing or outputs differ from the CPU reference"}`);
    }
  }
} finally {
  await close();
}
const total = all.length + 1;
console.log(failed ? `${failed} of ${total} cases failed` : `all ${total} cases passed`);
process.exit(failed ? 1 : 0);
