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

// The cases: decode and prefill sizes, f32 and quantised weights. The split-binding case sizes
// the expert weights past the 4 MiB binding the device is asked for (see below).
const cases = [
  { name: "f32, decode and prefill", query: "tokens=1,64&dtype=f32" },
  { name: "q4_0, decode and prefill", query: "tokens=1,64&dtype=q4_0" },
  { name: "mxfp4, prefill", query: "tokens=33&dtype=mxfp4" },
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
try {
  for (const c of cases) {
    const page = await browser.newPage();
    page.on("console", (m) => m.type() === "error" && console.log(`  console: ${m.text()}`));
    await page.goto(`${base}index.html?${c.query}&run=1`);
    await page.waitForFunction(() => window.moeflowResult !== undefined, null, { timeout: 300_000 });
    const r = await page.evaluate(() => window.moeflowResult);
    const report = await page.evaluate(() => document.getElementById("report").textContent);
    console.log(`== ${c.name}\n${report}`);
    const ok = !r.error && r.pass && r.runs.every((run) => run.routing_equal === run.checked_tokens && run.outputs_within);
    if (!ok) {
      failed += 1;
      console.log(`FAIL: ${c.name}: ${r.error ?? "routing or outputs differ from the CPU reference"}`);
    }
    await page.close();
  }
} finally {
  await browser.close();
  server.close();
}
console.log(failed ? `${failed} of ${cases.length} cases failed` : `all ${cases.length} cases passed`);
process.exit(failed ? 1 : 0);
