//! Kernel lab: where the window GEMM reads its weights from. A dense `[256, 512] × [1024,
//! 512]ᵀ` GEMM in the strict order, x from a 64 KiB uniform window as in
//! `GemmVariant::Window` (the lab's window holds 32 rows; row `r` reads window row `r % 32`),
//! the weights from a storage buffer (`array<vec4<f32>>`, or `array<vec2<u32>>` of packed
//! bf16) or from a sampled `texture_2d<u32>` (`Rgba32Uint` texels of four f32 words, or
//! `Rg32Uint` texels of four bf16 values), one texel or vector per group of four K values.
//! Every adapter moeflow finds, a pure-FMA probe first, two interleaved rounds, the median of
//! five timed runs per kernel (host wall time, submit to completion). Outputs are checked on a
//! sample against a CPU reference in the same order; a mismatch fails the run.
//!
//! `cargo bench --bench weight_fetch` (`MOEFLOW_ADAPTER=gl` to pick adapters by name). For
//! exploring kernels before they enter the library; docs/gemm.md records what it showed.

use std::fmt::Write as _;
use std::time::Instant;

use moeflow::Context;
use wgpu::util::DeviceExt;

const M: u32 = 256;
const K: u32 = 512;
const N: u32 = 1024;
const K4: u32 = K / 4;
/// Rows of x in the uniform window (32 rows × K f32 = 64 KiB).
const WINDOW_ROWS: u32 = 32;
const BLOCKS: [(u32, u32); 3] = [(16, 8), (32, 4), (32, 8)];
const LANES: u32 = 8;

/// Where a kernel reads its weights.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    StorageF32,
    TextureF32,
    StorageBf16,
    TextureBf16,
}

impl Source {
    const ALL: [Source; 4] =
        [Source::StorageF32, Source::TextureF32, Source::StorageBf16, Source::TextureBf16];

    fn bf16(self) -> bool {
        matches!(self, Source::StorageBf16 | Source::TextureBf16)
    }
}

/// The WGSL of a `rows × cols` block of `LANES` invocations (columns spaced `LANES` apart).
fn kernel(rows: u32, cols: u32, source: Source) -> String {
    let mut s = format!("const K4: u32 = {K4}u;\nconst N: u32 = {N}u;\n");
    s.push_str("@group(0) @binding(0) var<uniform> xw: array<vec4<f32>, 4096>;\n");
    s.push_str(match source {
        Source::StorageF32 => "@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;\n",
        Source::StorageBf16 => "@group(0) @binding(1) var<storage, read> w: array<vec2<u32>>;\n",
        Source::TextureF32 | Source::TextureBf16 => "@group(0) @binding(1) var w: texture_2d<u32>;\n",
    });
    s.push_str("@group(0) @binding(2) var<storage, read_write> out: array<f32>;\n");
    s.push_str(
        "fn bf16x4(t: vec2<u32>) -> vec4<f32> {\n    return vec4<f32>(bitcast<f32>(t.x << 16u), \
         bitcast<f32>(t.x & 0xffff0000u), bitcast<f32>(t.y << 16u), bitcast<f32>(t.y & 0xffff0000u));\n}\n",
    );
    let _ = writeln!(
        s,
        "@compute @workgroup_size({LANES})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32) {{"
    );
    let _ = writeln!(
        s,
        "    let row0 = wid.x * {rows}u;\n    let col0 = wid.y * {}u + lid;\n    let xr0 = row0 % {WINDOW_ROWS}u;",
        cols * LANES
    );
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(s, "    var a{i}_{j} = vec4<f32>(0.0);");
        }
    }
    let _ = writeln!(s, "    for (var k = 0u; k < K4; k += 1u) {{");
    for i in 0..rows {
        let _ = writeln!(s, "        let x{i} = xw[(xr0 + {i}u) * K4 + k];");
    }
    for j in 0..cols {
        let c = format!("(col0 + {}u)", j * LANES);
        let _ = match source {
            Source::StorageF32 => writeln!(s, "        let w{j} = w[{c} * K4 + k];"),
            Source::StorageBf16 => writeln!(s, "        let w{j} = bf16x4(w[{c} * K4 + k]);"),
            Source::TextureF32 => {
                writeln!(s, "        let w{j} = bitcast<vec4<f32>>(textureLoad(w, vec2<u32>(k, {c}), 0));")
            }
            Source::TextureBf16 => {
                writeln!(s, "        let w{j} = bf16x4(textureLoad(w, vec2<u32>(k, {c}), 0).xy);")
            }
        };
    }
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(s, "        a{i}_{j} = fma(x{i}, w{j}, a{i}_{j});");
        }
    }
    s.push_str("    }\n");
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(
                s,
                "    out[(row0 + {i}u) * N + col0 + {}u] = (a{i}_{j}.x + a{i}_{j}.y) + (a{i}_{j}.z + a{i}_{j}.w);",
                j * LANES
            );
        }
    }
    s.push_str("}\n");
    s
}

/// 16384 invocations, each 2048 rounds of 8 independent scalar FMA chains.
const PROBE: &str = "@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    var a0 = f32(g.x) * 1e-6; var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
    var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
    let b = 0.999 + f32(g.y);
    let c = 0.001 + f32(g.z);
    for (var i = 0u; i < 2048u; i++) {
        a0 = fma(a0, b, c); a1 = fma(a1, b, c); a2 = fma(a2, b, c); a3 = fma(a3, b, c);
        a4 = fma(a4, b, c); a5 = fma(a5, b, c); a6 = fma(a6, b, c); a7 = fma(a7, b, c);
    }
    out[g.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}";
const PROBE_FLOP: f64 = 2.0 * 16384.0 * 2048.0 * 8.0;

/// The lab's buffers and textures on one device.
struct Lab {
    ctx: Context,
    x_window: wgpu::Buffer,
    w_f32: wgpu::Buffer,
    w_bf16: wgpu::Buffer,
    t_f32: wgpu::TextureView,
    t_bf16: wgpu::TextureView,
    out: wgpu::Buffer,
    readback: wgpu::Buffer,
    x: Vec<f32>,
    w: Vec<f32>,
}

impl Lab {
    fn new(ctx: Context) -> Self {
        let x: Vec<f32> = (0..WINDOW_ROWS * K).map(|i| ((i * 7919 % 1000) as f32) / 1000.0 - 0.5).collect();
        let w: Vec<f32> = (0..N * K).map(|i| ((i * 104_729 % 997) as f32) / 997.0 - 0.5).collect();
        let packed: Vec<u32> =
            w.chunks(2).map(|p| (p[0].to_bits() >> 16) | (p[1].to_bits() & 0xffff_0000)).collect();
        let device = ctx.device();
        let buffer = |contents: &[u8], usage| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents, usage })
        };
        let texture = |format: wgpu::TextureFormat, words: &[u32], words_per_texel: u32| {
            let size = wgpu::Extent3d { width: K4, height: N, depth_or_array_layers: 1 };
            let t = device.create_texture(&wgpu::TextureDescriptor {
                label: None,
                size,
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format,
                usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
                view_formats: &[],
            });
            ctx.queue().write_texture(
                t.as_image_copy(),
                bytemuck::cast_slice(words),
                wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some(K4 * words_per_texel * 4),
                    rows_per_image: Some(N),
                },
                size,
            );
            t.create_view(&wgpu::TextureViewDescriptor::default())
        };
        let words: Vec<u32> = w.iter().map(|v| v.to_bits()).collect();
        let out_bytes = u64::from(M * N * 4);
        Lab {
            x_window: buffer(bytemuck::cast_slice(&x), wgpu::BufferUsages::UNIFORM),
            w_f32: buffer(bytemuck::cast_slice(&w), wgpu::BufferUsages::STORAGE),
            w_bf16: buffer(bytemuck::cast_slice(&packed), wgpu::BufferUsages::STORAGE),
            t_f32: texture(wgpu::TextureFormat::Rgba32Uint, &words, 4),
            t_bf16: texture(wgpu::TextureFormat::Rg32Uint, &packed, 2),
            out: device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: out_bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: out_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            x,
            w,
            ctx,
        }
    }

    /// Median seconds of five runs of `source`'s pipeline over `groups` (after one untimed run).
    fn time(&self, wgsl: &str, source: Option<Source>, groups: [u32; 2]) -> f64 {
        let device = self.ctx.device();
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        let mut entries = vec![wgpu::BindGroupEntry { binding: 2, resource: self.out.as_entire_binding() }];
        if let Some(source) = source {
            let weights = match source {
                Source::StorageF32 => self.w_f32.as_entire_binding(),
                Source::StorageBf16 => self.w_bf16.as_entire_binding(),
                Source::TextureF32 => wgpu::BindingResource::TextureView(&self.t_f32),
                Source::TextureBf16 => wgpu::BindingResource::TextureView(&self.t_bf16),
            };
            entries.push(wgpu::BindGroupEntry { binding: 0, resource: self.x_window.as_entire_binding() });
            entries.push(wgpu::BindGroupEntry { binding: 1, resource: weights });
        }
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let run = || {
            let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(groups[0], groups[1], 1);
            }
            let started = Instant::now();
            let index = self.ctx.queue().submit([encoder.finish()]);
            device
                .poll(wgpu::PollType::Wait { submission_index: Some(index), timeout: None })
                .expect("wait for the lab kernel");
            started.elapsed().as_secs_f64()
        };
        run();
        let mut times: Vec<f64> = (0..5).map(|_| run()).collect();
        times.sort_by(f64::total_cmp);
        times[2]
    }

    /// The largest difference from the CPU reference over a sample of outputs.
    fn check(&self, source: Source) -> f32 {
        let device = self.ctx.device();
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        encoder.copy_buffer_to_buffer(&self.out, 0, &self.readback, 0, None);
        let index = self.ctx.queue().submit([encoder.finish()]);
        self.readback.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        device
            .poll(wgpu::PollType::Wait { submission_index: Some(index), timeout: None })
            .expect("wait for the readback");
        let got: Vec<f32> =
            bytemuck::cast_slice(&self.readback.slice(..).get_mapped_range().expect("map the lab's output"))
                .to_vec();
        self.readback.unmap();
        let weight = |i: usize| {
            if source.bf16() { f32::from_bits(self.w[i].to_bits() & 0xffff_0000) } else { self.w[i] }
        };
        let (k, n) = (K as usize, N as usize);
        let mut worst = 0.0f32;
        for m in (0..M as usize).step_by(37) {
            for c in (0..n).step_by(13) {
                let xr = m % WINDOW_ROWS as usize;
                let mut acc = [0.0f32; 4];
                for i in 0..k {
                    acc[i % 4] = self.x[xr * k + i].mul_add(weight(c * k + i), acc[i % 4]);
                }
                let want = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                worst = worst.max((got[m * n + c] - want).abs());
            }
        }
        worst
    }
}

fn main() {
    let filter = std::env::var("MOEFLOW_ADAPTER").unwrap_or_default().to_lowercase();
    let contexts = match Context::all() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("weight_fetch lab skipped: {e}");
            return;
        }
    };
    for ctx in contexts.into_iter().filter(|c| c.adapter().slug().contains(&filter)) {
        println!("adapter {}", ctx.adapter().slug());
        let lab = Lab::new(ctx);
        let flop = 2.0 * f64::from(M) * f64::from(N) * f64::from(K);
        for round in 0..2 {
            let probe = PROBE_FLOP / lab.time(PROBE, None, [256, 1]) / 1e9;
            println!("  round {round}: FMA probe {probe:.2} GFLOP/s");
            for (rows, cols) in BLOCKS {
                for source in Source::ALL {
                    let seconds =
                        lab.time(&kernel(rows, cols, source), Some(source), [M / rows, N / (cols * LANES)]);
                    let worst = lab.check(source);
                    assert!(worst <= 1e-5, "{rows}x{cols} {source:?}: off the reference by {worst:e}");
                    let gflops = flop / seconds / 1e9;
                    println!(
                        "  round {round}: {rows:2} x {cols} {:12} {:7.2} ms {gflops:6.2} GFLOP/s ({:4.1}% of the probe)",
                        format!("{source:?}"),
                        seconds * 1e3,
                        100.0 * gflops / probe
                    );
                }
            }
        }
    }
}
