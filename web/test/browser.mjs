// Runs web/index.html in headless Chromium on its WebGPU adapter (SwiftShader) and checks the
// reports the page leaves in window.moeflowResult: for every case, routing equal to the CPU
// reference on every checked token and every output within the bound. Serves web/ on
// 127.0.0.1 (module scripts are not loaded from file://). Chromium is driven over the DevTools
// protocol by playwright-core. A missing browser, no WebGPU adapter or a failed case is a
// failure (exit status 1). Usage: node web/test/browser.mjs [chromium binary]
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = fileURLToPath(new URL("..", import.meta.url));
const browserPath = process.argv[2] ?? "/usr/bin/chromium-headless-shell";
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };

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

const server = createServer(async (req, res) => {
  const path = normalize(decodeURIComponent(new URL(req.url, "http://x").pathname));
  try {
    const body = await readFile(join(root, path === "/" ? "index.html" : path));
    res.writeHead(200, { "content-type": types[extname(path)] ?? "application/octet-stream" });
    res.end(body);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
const base = `http://127.0.0.1:${server.address().port}/`;

const browser = await chromium.launch({
  executablePath: browserPath,
  args: [
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--enable-unsafe-swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
  ],
});
let failed = 0;
// Opens the page and leaves the report of the run `start` begins.
async function report(query, start) {
  const page = await browser.newPage();
  page.on("console", (m) => m.type() === "error" && console.log(`  console: ${m.text()}`));
  await page.goto(`${base}index.html?${query}`);
  await start(page);
  await page.waitForFunction(() => window.moeflowResult !== undefined, null, { timeout: 300_000 });
  const r = await page.evaluate(() => window.moeflowResult);
  const text = await page.evaluate(() => document.getElementById("report").textContent);
  await page.close();
  return { r, text };
}
const all = [
  ...cases.map((c) => ({ ...c, query: `${c.query}&run=1`, start: async () => {} })),
  ...files.map((f) => ({
    name: f.name,
    query: "",
    start: async (page) => {
      await page.waitForFunction(() => window.moeflowReady === true, null, { timeout: 60_000 });
      await page.setInputFiles("#file input[name=weights]", join(fixtures, f.dir, "weights.safetensors"));
      await page.setInputFiles("#file input[name=config]", join(fixtures, f.dir, "config.json"));
      await page.fill("#file input[name=tokens]", f.tokens);
      await page.click("#file button");
    },
  })),
];
try {
  for (const c of all) {
    const { r, text } = await report(c.query, c.start);
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
  await browser.close();
  server.close();
}
console.log(failed ? `${failed} of ${all.length} cases failed` : `all ${all.length} cases passed`);
process.exit(failed ? 1 : 0);
