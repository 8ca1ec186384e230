// What the browser test and the timing script share: web/ served on 127.0.0.1 (module scripts
// are not loaded from file://) and headless Chromium with WebGPU on SwiftShader, driven over
// the DevTools protocol by playwright-core.
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = fileURLToPath(new URL("..", import.meta.url));
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };

/// Serves web/ and starts Chromium (`browserPath`); returns the page's base address, the
/// browser, and `close` to end both.
export async function start(browserPath = "/usr/bin/chromium-headless-shell") {
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
  const close = async () => {
    await browser.close();
    server.close();
  };
  return { base: `http://127.0.0.1:${server.address().port}/`, browser, close };
}

/// Waits for the page's report (window.moeflowResult) and returns it with the text shown.
export async function result(page) {
  await page.waitForFunction(() => window.moeflowResult !== undefined, null, { timeout: 300_000 });
  const r = await page.evaluate(() => window.moeflowResult);
  const text = await page.evaluate(() => document.getElementById("report").textContent);
  return { r, text };
}
