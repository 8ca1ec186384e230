// One run of the page in headless Chromium (SwiftShader WebGPU), for timing: prints, per token
// count of the query, the total GPU and host wall milliseconds as `M=<n> gpu_ms=<t> wall_ms=<t>`.
// Usage: node web/test/measure.mjs 'tokens=1,64&hidden=256&...' [chromium binary]
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = fileURLToPath(new URL("..", import.meta.url));
const query = process.argv[2] ?? "";
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };
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
const browser = await chromium.launch({
  executablePath: process.argv[3] ?? "/usr/bin/chromium-headless-shell",
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader", "--use-webgpu-adapter=swiftshader"],
});
try {
  const page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${server.address().port}/index.html?${query}&run=1`);
  await page.waitForFunction(() => window.moeflowResult !== undefined, null, { timeout: 300_000 });
  const r = await page.evaluate(() => window.moeflowResult);
  if (r.error || !r.pass) throw new Error(r.error ?? "the run failed its check");
  for (const run of r.runs) console.log(`M=${run.tokens} gpu_ms=${run.gpu_ms} wall_ms=${run.wall_ms}`);
} finally {
  await browser.close();
  server.close();
}
