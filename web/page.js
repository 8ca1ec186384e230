// The page's side: reads the options (from the form, or from the address's query for a
// scripted run: ?tokens=1,64&dtype=q4_0&run=1), runs the wasm module, and shows its report as
// moe_layer prints it, with the last run's expert load drawn. window.moeflowResult holds the
// report (or {error}) once a run ends, for tests that drive the page.
import init, { error_checks, run_file, run_synthetic } from "./pkg/moeflow_web.js";

const form = document.getElementById("options");
const status = document.getElementById("status");
const out = document.getElementById("report");

function options() {
  const f = new FormData(form);
  const num = (k) => Number(f.get(k));
  return {
    tokens: String(f.get("tokens")).split(",").map((t) => Number(t.trim())),
    hidden: num("hidden"), ffn: num("ffn"), experts: num("experts"), k: num("k"),
    shared_ffn: num("shared_ffn"), dtype: String(f.get("dtype")), seed: num("seed"),
    max_binding_mib: String(f.get("max_binding_mib")).trim() === "" ? null : num("max_binding_mib"),
  };
}

function text(r) {
  const lines = [
    `adapter: ${r.adapter} on ${r.backend} (${r.device_type}${r.driver ? `, ${r.driver}` : ""})`,
    `features: timestamps=${r.timestamps} subgroups=${r.subgroups} shader-f16=${r.shader_f16}; ` +
      `max storage binding ${r.max_storage_binding_mib} MiB; ` +
      `expert weights in ${r.weight_bindings.join(" / ")} bindings (gate / up / down)`,
    `layer: ${r.layer}`,
  ];
  for (const run of r.runs) {
    lines.push(`M=${run.tokens}: per-stage GPU time`);
    for (const s of run.stages) {
      const t = s.gpu_ms === null ? "         -" : s.gpu_ms.toFixed(3).padStart(10);
      lines.push(`  ${s.name.padEnd(9)} ${t} ms  (${s.dispatches} dispatches)`);
    }
    if (run.gpu_ms !== null) lines.push(`  total     ${run.gpu_ms.toFixed(3).padStart(10)} ms GPU`);
    lines.push(`  host wall ${run.wall_ms.toFixed(3).padStart(10)} ms; ${run.tokens_per_s.toFixed(0)} tokens/s`);
    lines.push(`  routing equal   ${run.routing_equal}/${run.checked_tokens}`);
    lines.push(`  outputs within 2e-5 + 2e-5*|row scale|: ${run.outputs_within} ` +
      `(worst ${run.worst_of_bound.toFixed(3)} of the bound; ${run.bit_equal}/${run.values} bit-equal)`);
    lines.push(`  expert load: mean ${run.load_mean.toFixed(1)}, max/mean ${run.load_imbalance.toFixed(2)}`);
  }
  lines.push(`result: ${r.pass ? "PASS" : "FAIL"}`);
  return lines.join("\n");
}

function draw(load) {
  const c = document.getElementById("load");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const max = Math.max(1, ...load);
  const w = c.width / load.length;
  g.fillStyle = "#36c";
  load.forEach((n, e) => {
    const h = (n / max) * (c.height - 14);
    g.fillRect(e * w + 1, c.height - 14 - h, Math.max(1, w - 2), h);
  });
  g.fillStyle = "#000";
  g.fillText(`rows per expert (max ${max})`, 4, c.height - 2);
}

async function run(opts) {
  await show(() => run_synthetic(JSON.stringify(opts)));
}

// The layer of the picked file, read as the native loaders read it (config.json decides a
// safetensors layer's routing; a GGUF file's metadata decides its own).
async function runFile() {
  const f = new FormData(fileForm);
  const weights = f.get("weights");
  if (!(weights instanceof File) || weights.size === 0) {
    status.textContent = "Pick a weights file first.";
    return;
  }
  const config = f.get("config");
  const configText = config instanceof File && config.size > 0 ? await config.text() : undefined;
  const layer = String(f.get("layer")).trim();
  const opts = {
    tokens: String(f.get("tokens")).split(",").map((t) => Number(t.trim())),
    layer: layer === "" ? null : Number(layer),
  };
  const bytes = new Uint8Array(await weights.arrayBuffer());
  await show(() => run_file(weights.name, bytes, configText, JSON.stringify(opts)));
}

async function show(start) {
  status.textContent = "Running…";
  out.textContent = "";
  try {
    const report = JSON.parse(await start());
    out.textContent = text(report);
    out.className = report.pass ? "pass" : "fail";
    draw(report.runs[report.runs.length - 1].load);
    status.textContent = "Done.";
    window.moeflowResult = report;
  } catch (e) {
    const error = String(e);
    out.textContent = error;
    out.className = "fail";
    status.textContent = "Failed.";
    window.moeflowResult = { error };
  }
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  run(options());
});
const fileForm = document.getElementById("file");
fileForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  runFile();
});

await init();
if (!navigator.gpu) {
  status.textContent = "This browser offers no WebGPU (navigator.gpu is missing).";
  window.moeflowResult = { error: status.textContent };
} else {
  status.textContent = "Ready.";
  const q = new URLSearchParams(location.search);
  for (const [k, v] of q) if (form.elements[k]) form.elements[k].value = v;
  window.moeflowReady = true;
  if (q.get("run") === "1") run(options());
  // For the browser test: ?errors=1 runs the misuse checks instead.
  if (q.get("errors") === "1") {
    error_checks().then(
      (message) => { window.moeflowResult = { refused: message }; },
      (e) => { window.moeflowResult = { error: String(e) }; },
    );
  }
}
