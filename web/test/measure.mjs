// One run of the page in headless Chromium (SwiftShader WebGPU), for timing: prints, per token
// count of the query, the total GPU and host wall milliseconds as `M=<n> gpu_ms=<t> wall_ms=<t>`.
// Usage: node web/test/measure.mjs 'tokens=1,64&hidden=256&...' [chromium binary]
import { result, start } from "./page.mjs";

const query = process.argv[2] ?? "";
const { base, browser, close } = await start(process.argv[3]);
try {
  const page = await browser.newPage();
  await page.goto(`${base}index.html?${query}&run=1`);
  const { r } = await result(page);
  if (r.error || !r.pass) throw new Error(r.error ?? "the run failed its check");
  for (const run of r.runs) console.log(`M=${run.tokens} gpu_ms=${run.gpu_ms} wall_ms=${run.wall_ms}`);
} finally {
  await close();
}
