//! Token dispatch on every adapter: layouts bitwise equal to a CPU stable sort, device and
//! host paths identical, bucket routing with overflow and drop, load statistics, bad input.

mod common;

use common::{contexts, rng};
use moeflow::kernels::dispatch::{
    BucketConfig, BucketLayout, DispatchConfig, DispatchLayout, OverflowPolicy, dispatch_host_indices,
    host_dispatch,
};
use moeflow::reference::dispatch::{self as reference, NONE};
use rand::Rng;

#[derive(Clone, Copy, Debug)]
enum Dist {
    Uniform,
    Zipf,
    AllOnOne,
    EvenOnly,
    TieHeavy,
}

/// `tokens * k` indices, each token's k experts distinct (as top-k gives them). `EvenOnly`
/// needs `k <= experts / 2`.
fn indices(dist: Dist, tokens: u32, experts: u32, k: u32, seed: u64) -> Vec<u32> {
    let mut r = rng(seed);
    let weights: Vec<f64> = (0..experts).map(|e| 1.0 / f64::from(e + 1).powf(1.1)).collect();
    let total: f64 = weights.iter().sum();
    let mut out = Vec::with_capacity((tokens * k) as usize);
    for _ in 0..tokens {
        let mut row: Vec<u32> = Vec::new();
        while row.len() < k as usize {
            let e = match dist {
                Dist::Uniform => r.random_range(0..experts),
                Dist::Zipf => {
                    let mut u = r.random_range(0.0..total);
                    let mut e = 0;
                    while e + 1 < experts && u >= weights[e as usize] {
                        u -= weights[e as usize];
                        e += 1;
                    }
                    e
                }
                Dist::AllOnOne | Dist::TieHeavy => (experts / 3 + row.len() as u32) % experts,
                Dist::EvenOnly => 2 * r.random_range(0..experts.div_ceil(2)),
            };
            if !row.contains(&e) {
                row.push(e);
            }
        }
        out.extend(row);
    }
    out
}

#[test]
fn device_layout_equals_a_cpu_stable_sort() {
    for ctx in contexts() {
        let mut cases = 0;
        for tokens in [1u32, 7, 64, 4096, 65536] {
            for experts in [8u32, 60, 64, 128, 330, 1024] {
                let k = if tokens >= 4096 { 2 } else { 8.min(experts) };
                let dists: &[Dist] = if tokens == 65536 {
                    &[Dist::Zipf]
                } else {
                    &[Dist::Uniform, Dist::Zipf, Dist::AllOnOne, Dist::EvenOnly, Dist::TieHeavy]
                };
                for (d, &dist) in dists.iter().enumerate() {
                    let k = match dist {
                        Dist::AllOnOne => 1,
                        Dist::EvenOnly => k.min(experts / 2),
                        _ => k,
                    };
                    let tile = [1u32, 16, 64][(cases + d) % 3];
                    let cfg = DispatchConfig { experts, k, tile };
                    let idx = indices(dist, tokens, experts, k, u64::from(tokens * 31 + experts));
                    let got = dispatch_host_indices(&ctx, cfg, &idx).unwrap();
                    let want = reference::layout(&idx, experts, tile, 0);
                    let what =
                        format!("{} {dist:?} M={tokens} E={experts} k={k} tile={tile}", ctx.adapter().slug());
                    assert_eq!(got.counts, want.counts, "{what}: counts");
                    assert_eq!(got.offsets, want.offsets, "{what}: offsets");
                    assert_eq!(got.padded, want.padded, "{what}: padded offsets");
                    assert_eq!(got.meta, want.meta, "{what}: meta");
                    assert_eq!(got.perm, want.perm, "{what}: perm");
                    assert_eq!(got.inverse, want.inverse, "{what}: inverse");
                    assert_eq!(got.tile_expert, want.tile_expert, "{what}: tile map");
                    cases += 1;
                }
            }
        }
        eprintln!("{}: {cases} layouts bitwise equal to the CPU stable sort", ctx.adapter().slug());
    }
}

#[test]
fn device_and_host_dispatch_give_identical_layouts() {
    for ctx in contexts() {
        for (tokens, experts, k, tile) in [(300u32, 60u32, 4u32, 16u32), (1, 8, 2, 64), (2000, 330, 8, 32)] {
            let cfg = DispatchConfig { experts, k, tile };
            let idx = indices(Dist::Zipf, tokens, experts, k, 5);
            let buf = ctx.upload("indices", &idx).unwrap();
            let device = DispatchLayout::new(&ctx, cfg, tokens, 0).unwrap();
            let plan = device.plan(&ctx, &buf).unwrap();
            ctx.run(&plan.iter().collect::<Vec<_>>()).unwrap();
            let host = DispatchLayout::new(&ctx, cfg, tokens, 0).unwrap();
            let host_layout = host_dispatch(&ctx, &host, &buf, 0).unwrap();
            let (a, b) = (device.read(&ctx).unwrap(), host.read(&ctx).unwrap());
            assert_eq!(a, b, "M={tokens} E={experts}");
            assert_eq!(b, host_layout);
            assert_eq!(
                device.read_tile_map(&ctx).unwrap(),
                host.read_tile_map(&ctx).unwrap(),
                "full tile maps"
            );
            let tail = device.read_tile_map(&ctx).unwrap();
            assert!(tail[a.meta.tiles as usize..].iter().all(|&t| t == NONE), "unused tiles are NONE");
        }
    }
}

#[test]
fn buckets_keep_stable_order_and_overflow_or_drop_past_the_bound() {
    for ctx in contexts() {
        for (tokens, n_caps, bound) in [(1000u32, 330u32, 2u32), (64, 8, 16), (4096, 1024, 3), (7, 1, 1)] {
            let winners = indices(Dist::Zipf, tokens, n_caps, 1, 9);
            let want_layout = reference::layout(&winners, n_caps, 1, bound);
            let (want_pad, want_over) = reference::buckets(&want_layout, bound);
            let buf = ctx.upload("winners", &winners).unwrap();
            for policy in [OverflowPolicy::Overflow, OverflowPolicy::Drop] {
                let cfg = BucketConfig { n_caps, bound, policy };
                let b = BucketLayout::new(&ctx, cfg, tokens).unwrap();
                let plan = b.plan(&ctx, &buf).unwrap();
                ctx.run(&plan.iter().collect::<Vec<_>>()).unwrap();
                let got = b.read(&ctx).unwrap();
                let what = format!("M={tokens} caps={n_caps} bound={bound} {policy:?}");
                assert_eq!(got.pad_perm, want_pad, "{what}: pad_perm");
                assert_eq!(got.over_bound, want_over.len() as u32, "{what}: rows past the bound");
                match policy {
                    OverflowPolicy::Overflow => {
                        assert_eq!(got.overflow, want_over, "{what}: overflow list");
                        // Nothing is lost: every token is in exactly one place.
                        let mut all: Vec<u32> = got
                            .pad_perm
                            .iter()
                            .copied()
                            .filter(|&t| t != NONE)
                            .chain(got.overflow.iter().copied())
                            .collect();
                        all.sort_unstable();
                        assert_eq!(all, (0..tokens).collect::<Vec<_>>(), "{what}");
                    }
                    OverflowPolicy::Drop => assert!(got.overflow.is_empty()),
                    other => panic!("no check for {other:?}"),
                }
                let stats = b.layout().stats(&ctx).unwrap();
                assert_eq!(stats.over_bound, want_over.len() as u32);
            }
        }
    }
}

#[test]
fn bucket_winners_are_an_argmax_with_the_routing_tie_rule() {
    use moeflow::reference::routing::order_key;
    for ctx in contexts() {
        let (tokens, n_caps, bound) = (300u32, 330u32, 2u32);
        let mut r = rng(12);
        // Scores quantised to a few levels so exact ties are common; a NaN here and there.
        let scores: Vec<f32> = (0..tokens * n_caps)
            .map(|i| if i % 97 == 0 { f32::NAN } else { f32::from(r.random_range(0u8..6)) })
            .collect();
        let want: Vec<u32> = scores
            .chunks(n_caps as usize)
            .map(|row| {
                let mut best = 0usize;
                for (e, v) in row.iter().enumerate() {
                    if order_key(*v) > order_key(row[best]) {
                        best = e;
                    }
                }
                best as u32
            })
            .collect();
        let sb = ctx.upload("scores", &scores).unwrap();
        let winners = ctx.zeroed("winners", u64::from(tokens) * 4).unwrap();
        let values = ctx.zeroed("values", u64::from(tokens) * 4).unwrap();
        let argmax =
            moeflow::kernels::routing::plan_argmax(&ctx, &sb, tokens, n_caps, &winners, &values).unwrap();
        let cfg = BucketConfig { n_caps, bound, policy: OverflowPolicy::Overflow };
        let buckets = BucketLayout::new(&ctx, cfg, tokens).unwrap();
        let bplan = buckets.plan(&ctx, &winners).unwrap();
        let mut ds = argmax.dispatches();
        ds.extend(bplan.iter());
        ctx.run(&ds).unwrap();
        let got: Vec<u32> = ctx.read_back(&winners, tokens as usize).unwrap();
        assert_eq!(got, want, "{}: argmax with lower-index ties", ctx.adapter().slug());
        let (pad, over) = reference::buckets(&reference::layout(&want, n_caps, 1, bound), bound);
        let host = buckets.read(&ctx).unwrap();
        assert_eq!(host.pad_perm, pad);
        assert_eq!(host.overflow, over);
    }
}

#[test]
fn load_statistics_come_from_counts_and_meta() {
    for ctx in contexts() {
        let idx = [3u32, 3, 3, 1];
        let layout = DispatchLayout::new(&ctx, DispatchConfig { experts: 4, k: 1, tile: 4 }, 4, 2).unwrap();
        let buf = ctx.upload("indices", &idx).unwrap();
        ctx.run(&layout.plan(&ctx, &buf).unwrap().iter().collect::<Vec<_>>()).unwrap();
        let s = layout.stats(&ctx).unwrap();
        assert_eq!(s.per_expert, vec![0, 1, 0, 3]);
        assert_eq!((s.rows, s.max, s.nonempty, s.over_bound, s.invalid), (4, 3, 2, 1, 0));
        assert_eq!(s.mean, 1.0);
        assert_eq!(s.imbalance, 3.0);
        // An out-of-range index that reaches the device is counted, never written out of bounds.
        let bad = ctx.upload("indices", &[0u32, 9, 1, 1]).unwrap();
        ctx.run(&layout.plan(&ctx, &bad).unwrap().iter().collect::<Vec<_>>()).unwrap();
        let l = layout.read(&ctx).unwrap();
        assert_eq!(l.meta.invalid, 1);
        assert_eq!(l.inverse[1], NONE);
        assert_eq!(l, reference::layout(&[0, 9, 1, 1], 4, 4, 2));
    }
}

#[test]
fn bad_input_is_an_error() {
    for ctx in contexts() {
        let cfg = DispatchConfig { experts: 8, k: 2, tile: 16 };
        let err = dispatch_host_indices(&ctx, cfg, &[0, 8]).unwrap_err().to_string();
        assert!(err.contains("indices[1] = 8 is not below the expert count 8"), "{err}");
        let err =
            dispatch_host_indices(&ctx, DispatchConfig { tile: 24, ..cfg }, &[0, 1]).unwrap_err().to_string();
        assert!(err.contains("tile = 24 is not supported"), "{err}");
        let err = dispatch_host_indices(&ctx, DispatchConfig { tile: 512, ..cfg }, &[0, 1])
            .unwrap_err()
            .to_string();
        assert!(err.contains("tile = 512"), "{err}");
        let err =
            dispatch_host_indices(&ctx, DispatchConfig { experts: 0, ..cfg }, &[]).unwrap_err().to_string();
        assert!(err.contains("experts must be at least 1"), "{err}");
        let err = dispatch_host_indices(&ctx, cfg, &[0, 1, 2]).unwrap_err().to_string();
        assert!(err.contains("multiple of k = 2"), "{err}");
        let err =
            BucketLayout::new(&ctx, BucketConfig { n_caps: 4, bound: 0, policy: OverflowPolicy::Drop }, 8)
                .unwrap_err()
                .to_string();
        assert!(err.contains("bound must be at least 1"), "{err}");
        let layout = DispatchLayout::new(&ctx, cfg, 100, 0).unwrap();
        let err = layout.plan(&ctx, &ctx.zeroed("short", 16).unwrap()).unwrap_err().to_string();
        assert!(err.contains("`indices`"), "{err}");
    }
}
