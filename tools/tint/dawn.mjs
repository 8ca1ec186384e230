// Opens Dawn (the npm package `webgpu`: Dawn's Node bindings, with Tint as WGSL compiler) on
// the first adapter it finds, with every limit moeflow's kernels may need raised to the
// adapter's own, and shader-f16 and subgroups where the adapter has them.
//
// Dawn needs a Vulkan driver it accepts: SwiftShader here (point VK_ICD_FILENAMES at its ICD);
// it refuses Mesa 22's lavapipe.
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);

const LIMITS = ['maxComputeWorkgroupStorageSize', 'maxStorageBuffersPerShaderStage',
  'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxStorageBufferBindingSize',
  'maxBufferSize', 'maxUniformBufferBindingSize', 'maxComputeWorkgroupsPerDimension'];

// Dawn's instance, kept for the life of the process: once it is garbage-collected, calls on
// its devices abort the process.
let gpu = null;

/** Resolves to `{ adapter, device, features, description }`; exits with status 2 when Dawn
 * finds no adapter. */
export async function openDawn() {
  gpu ??= create([]);
  const adapter = await gpu.requestAdapter();
  if (!adapter) {
    console.error('Dawn found no adapter (point VK_ICD_FILENAMES at SwiftShader)');
    process.exit(2);
  }
  const info = adapter.info ?? {};
  const description = `${info.vendor} ${info.architecture} ${info.description}`.trim();
  const features = ['shader-f16', 'subgroups'].filter((f) => adapter.features.has(f));
  const requiredLimits = {};
  for (const key of LIMITS) requiredLimits[key] = adapter.limits[key];
  const device = await adapter.requestDevice({ requiredFeatures: features, requiredLimits });
  return { adapter, device, features, description };
}
