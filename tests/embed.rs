//! The layer as an inference engine embeds it: the app's own device, created with exactly the
//! layer's requirements; its activations and one workspace in one arena buffer at non-zero
//! offsets; one plan per layer for up to 512 tokens, two layers chained with x and y swapping
//! roles and sharing the workspace (which starts out holding garbage); forwards of 1, 7, 512
//! and 64 tokens in turn, all recorded into one encoder between the app's own copies, one
//! submission.

mod common;

use common::{assert_rows_close, bits};

use moeflow::prelude::*;
use moeflow::reference::layer as reference;
use moeflow::synth::Synth;
use moeflow::workspace::{WORKSPACE_USAGE, Workspace};

#[test]
fn an_app_runs_two_layers_at_changing_counts_in_one_submission() {
    let max = 512u32;
    let counts = [1u32, 7, 512, 64];
    let cfg = MoeConfig { shared_ffn: Some(24), ..MoeConfig::new(32, 24, 8, 2) };
    let h = cfg.route.hidden as usize;
    let (w1, w2) = (Synth::new(61).moe_weights(&cfg), Synth::new(62).moe_weights(&cfg));
    // Each step's input rows, then room for each step's output rows.
    let inputs: Vec<Vec<f32>> =
        counts.iter().map(|&n| Synth::new(63 + u64::from(n)).uniform(n as usize * h, 1.0)).collect();
    for adapter in common::wgpu_adapters() {
        let needs = cfg.requirements(&adapter, max).unwrap();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("the app's device"),
            required_features: needs.features,
            required_limits: needs.limits.clone(),
            ..Default::default()
        }))
        .unwrap();
        let ctx = Context::from_wgpu(device.clone(), queue.clone());
        let slug = ctx.adapter().slug();
        let one = MoeLayer::new(&ctx, cfg, &w1).unwrap();
        let two = MoeLayer::new(&ctx, cfg, &w2).unwrap();

        // The app's arena: a gap, x, y, the layers' one workspace, a gap; each region at the
        // workspace's alignment (a multiple of the device's offset alignments).
        let layout = one.workspace(&ctx, max).unwrap();
        assert_eq!(layout, two.workspace(&ctx, max).unwrap(), "{slug}: one configuration, one layout");
        let align = layout.alignment();
        assert_eq!(align % u64::from(device.limits().min_storage_buffer_offset_alignment), 0);
        let region = (u64::from(max) * h as u64 * 4).div_ceil(align) * align;
        let (xa, ya, wa) = (align, align + region, align + 2 * region);
        let arena_bytes = wa + layout.bytes() + align;
        let arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("arena"),
            size: arena_bytes,
            usage: WORKSPACE_USAGE,
            mapped_at_creation: false,
        });
        // Gaps and activations zero; the workspace all ones (NaN floats, u32::MAX indices): a
        // forward reads nothing there it did not write.
        let mut init = vec![0u8; arena_bytes as usize];
        init[wa as usize..(wa + layout.bytes()) as usize].fill(0xff);
        queue.write_buffer(&arena, 0, &init);
        let x = BufferView::new(&arena, xa, region);
        let y = BufferView::new(&arena, ya, region);
        let workspace = Workspace::new(&ctx, &layout, BufferView::new(&arena, wa, layout.bytes())).unwrap();
        let p1 = one.plan_in(&ctx, one.io(x, y, max).unwrap(), &workspace).unwrap();
        let p2 = two.plan_in(&ctx, two.io(y, x, max).unwrap(), &workspace).unwrap();

        // The app's own buffers: every step's input, and every step's output copied out.
        let staged: Vec<f32> = inputs.concat();
        let input = ctx.upload("inputs", &staged).unwrap();
        let output = ctx.zeroed("outputs", staged.len() as u64 * 4).unwrap();
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let mut at = 0u64;
        for &n in &counts {
            let bytes = u64::from(n) * h as u64 * 4;
            encoder.copy_buffer_to_buffer(&input, at, &arena, xa, bytes);
            p1.record(&mut encoder, n).unwrap(); // x -> y
            p2.record(&mut encoder, n).unwrap(); // y -> x
            encoder.copy_buffer_to_buffer(&arena, xa, &output, at, bytes);
            at += bytes;
        }
        queue.submit([encoder.finish()]);
        let got: Vec<f32> = ctx.read_back(&output, staged.len()).unwrap();

        // The last forward, of 64 tokens, left the rows past them as the 512-token one wrote
        // them.
        let arena_x: Vec<f32> = ctx.read_back(&arena, ((xa + region) / 4) as usize).unwrap();
        let (last_x, rows_of_512) = (&arena_x[(xa / 4) as usize..], (1 + 7) * h);
        let differs = |a: &[f32], b: &[f32]| bits(a).iter().zip(bits(b)).position(|(a, b)| *a != b);
        assert_eq!(
            differs(&last_x[64 * h..512 * h], &got[rows_of_512 + 64 * h..rows_of_512 + 512 * h]),
            None,
            "{slug}: rows past the last forward's 64 tokens changed at"
        );
        let mut at = 0usize;
        let mut mid_of_last = Vec::new();
        for (&n, x) in counts.iter().zip(&inputs) {
            let rows = n as usize * h;
            let what = format!("{slug}: {n} tokens");
            // Plans made for exactly n tokens, one layer after the other.
            let mid = one.forward_host(&ctx, x).unwrap().y;
            mid_of_last.clone_from(&mid);
            let want = two.forward_host(&ctx, &mid).unwrap().y;
            assert_eq!(differs(&got[at..at + rows], &want), None, "{what}: differs from exact plans at");
            let (ref_mid, _, _) = reference::forward(&cfg, &w1, x).unwrap();
            let (ref_y, _, _) = reference::forward(&cfg, &w2, &ref_mid).unwrap();
            assert_rows_close(&format!("{what} against the CPU reference"), &got[at..at + rows], &ref_y, h);
            at += rows;
        }
        // Nothing before the arena's first region or past the workspace was touched.
        let all: Vec<u32> = ctx.read_back(&arena, (arena_bytes / 4) as usize).unwrap();
        assert!(all[..(align / 4) as usize].iter().all(|&v| v == 0), "{slug}: bytes before x");
        let tail = ((wa + layout.bytes()) / 4) as usize;
        assert!(all[tail..].iter().all(|&v| v == 0), "{slug}: bytes past the workspace");
        // The second layer's routing results are the last forward's, in the shared workspace.
        let (_, idx, _) = reference::forward(&cfg, &w2, &mid_of_last).unwrap();
        let got_idx: Vec<u32> = ctx.read_back(p2.indices(), idx.len()).unwrap();
        assert_eq!(got_idx, idx, "{slug}: the last forward's indices");
        assert_eq!(
            p1.indices().view().offset,
            p2.indices().view().offset,
            "{slug}: the layers share their regions"
        );
    }
}
