//! [`BucketLayout`]: bucket routing with a capacity bound and an overflow list, over a
//! dispatch layout.

use super::config::{BucketConfig, DispatchConfig, OverflowPolicy};
#[cfg(not(target_arch = "wasm32"))]
use super::host::Meta;
use super::layout::{DispatchLayout, U32};
#[cfg(not(target_arch = "wasm32"))]
use super::meta::META_WORDS;
use super::specs::{BUCKET_OVERFLOW, BUCKET_SLOTS};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveGrid};
use crate::pipeline::{BufferView, Dispatch};
use crate::size;
use crate::workspace::{Region, RegionSize, Scratch, ScratchKey};

impl ScratchKey {
    /// `pad_perm[buckets * bound]` (u32) of a bucket layout.
    pub const BUCKET_SLOTS: ScratchKey = ScratchKey::new("pad perm");
    /// The overflow list (u32 entries) of a bucket layout.
    pub const BUCKET_OVERFLOW: ScratchKey = ScratchKey::new("overflow list");
}

/// A bucket layout: the k = 1 grouping plus `pad_perm[n_caps * bound]` and the overflow list.
#[derive(Debug)]
pub struct BucketLayout {
    pub(super) cfg: BucketConfig,
    /// Winners per token of a plan's live count (1 unless set).
    pub(super) winners_per_token: u32,
    pub(super) layout: DispatchLayout,
    pub(super) pad_perm: Region,
    pub(super) overflow: Region,
}

/// Bucket lists read back to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBuckets {
    /// Token of rank r in bucket c at `c * bound + r`, NONE past the bucket's count.
    pub pad_perm: Vec<u32>,
    /// Tokens past the bound in (bucket, rank) order (empty under the drop policy).
    pub overflow: Vec<u32>,
    /// Tokens past the bound (overflowed or dropped).
    pub over_bound: u32,
}

impl BucketLayout {
    /// Allocates the bucket layout for `tokens` tokens.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero bound; [`Error::LimitExceeded`] for slots past
    /// u32 indices or the adapter's limits; [`DispatchLayout::new`]'s errors.
    pub fn new(ctx: &Context, cfg: BucketConfig, tokens: u32) -> Result<Self> {
        Self::with_scratch(Scratch::Own(ctx), cfg, tokens)
    }

    /// The grouping underneath a bucket layout of `cfg`.
    pub(super) fn grouping(cfg: BucketConfig) -> DispatchConfig {
        DispatchConfig { experts: cfg.n_caps, k: 1, tile: 1 }
    }

    /// The bytes of each of the buffers of a bucket layout for `tokens` tokens (the regions
    /// [`Self::new`] takes, its grouping's first).
    ///
    /// # Errors
    /// As [`DispatchLayout::scratch_bytes`].
    pub(crate) fn scratch_bytes(cfg: BucketConfig, tokens: u32) -> Result<Vec<(ScratchKey, u64)>> {
        let mut bytes = DispatchLayout::scratch_bytes(Self::grouping(cfg), tokens)?.to_vec();
        let slots = Self::slots_region(cfg)?;
        bytes.push((slots.key, slots.bytes));
        let overflow = Self::overflow_region(tokens);
        bytes.push((overflow.key, overflow.bytes));
        Ok(bytes)
    }

    /// The slots' region (`pad_perm`): `bound` u32 entries per bucket.
    pub(super) fn slots_region(cfg: BucketConfig) -> Result<RegionSize> {
        let bytes = size::product(
            "bucket slots (n_caps × bound)",
            &[u64::from(cfg.n_caps), u64::from(cfg.bound), U32],
        )?;
        Ok(RegionSize { key: ScratchKey::BUCKET_SLOTS, bytes })
    }

    /// The overflow list's region: one u32 entry per entry of the layout.
    pub(super) fn overflow_region(tokens: u32) -> RegionSize {
        RegionSize { key: ScratchKey::BUCKET_OVERFLOW, bytes: u64::from(tokens) * U32 }
    }

    /// [`Self::new`] with its buffers taken from `scratch`.
    pub(crate) fn with_scratch(scratch: Scratch<'_>, cfg: BucketConfig, tokens: u32) -> Result<Self> {
        let ctx = scratch.ctx();
        if cfg.bound == 0 {
            return Err(Error::invalid("bucket bound must be at least 1"));
        }
        let layout = DispatchLayout::with_scratch(scratch, Self::grouping(cfg), tokens, cfg.bound)?;
        let slots_region = Self::slots_region(cfg)?;
        let slots = u64::from(cfg.n_caps) * u64::from(cfg.bound);
        if slots_region.bytes > ctx.limits().max_storage_buffer_binding_size {
            return Err(Error::limit(
                "pad_perm bytes (n_caps x bound)",
                slots_region.bytes,
                ctx.limits().max_storage_buffer_binding_size,
                "max_storage_buffer_binding_size",
            ));
        }
        if slots > u64::from(u32::MAX) {
            return Err(Error::limit("n_caps x bound", slots, u32::MAX.into(), "u32 slot indices"));
        }
        Ok(BucketLayout {
            cfg,
            winners_per_token: 1,
            pad_perm: scratch.take(slots_region)?,
            overflow: scratch.take(Self::overflow_region(tokens))?,
            layout,
        })
    }

    /// The layout for `n` winners per token of a plan's live count (a layer's k): its
    /// dispatches then follow that count.
    pub(crate) fn with_winners_per_token(self, n: u32) -> Self {
        BucketLayout { winners_per_token: n, ..self }
    }

    /// The bucket configuration.
    pub fn config(&self) -> BucketConfig {
        self.cfg
    }
    /// The grouping underneath (k = 1, tile = 1).
    pub fn layout(&self) -> &DispatchLayout {
        &self.layout
    }
    /// `pad_perm[n_caps * bound]`.
    pub fn pad_perm(&self) -> BufferView<'_> {
        self.pad_perm.view()
    }
    /// Overflow list (its length is the layout's over-bound count).
    pub fn overflow(&self) -> BufferView<'_> {
        self.overflow.view()
    }

    /// Dispatches that fill the bucket layout from `winners[tokens]` (u32).
    ///
    /// # Errors
    /// As [`DispatchLayout::plan`].
    pub fn plan<'b>(&self, ctx: &Context, winners: impl Into<BufferView<'b>>) -> Result<Vec<Dispatch>> {
        let winners = winners.into();
        let tokens = LiveCount::tokens().times(self.winners_per_token);
        let mut ds = self.layout.plan_for(ctx, winners, tokens)?;
        let slots = u64::from(self.cfg.n_caps) * u64::from(self.cfg.bound);
        let extra = |binding: u32| match binding {
            11 => Some(self.pad_perm.bind(binding, slots * U32)),
            12 => Some(self.overflow.bind(binding, u64::from(self.layout.tokens.max(1)) * U32)),
            _ => None,
        };
        let mut specs = vec![(&BUCKET_SLOTS, slots)];
        if self.cfg.policy == OverflowPolicy::Overflow {
            specs.push((&BUCKET_OVERFLOW, u64::from(self.layout.entries)));
        }
        for (spec, threads) in specs {
            let kernel = ctx.kernel(spec, &[])?;
            let bindings = spec
                .bindings
                .iter()
                .map(|&(b, _)| extra(b).map_or_else(|| self.layout.bind(b, winners), Ok))
                .collect::<Result<Vec<_>>>()?;
            let grid = match spec.entry == BUCKET_OVERFLOW.entry {
                true => LiveGrid::Spilled(spec.live_groups(self.layout.live_entries(tokens))?),
                false => LiveGrid::Fixed,
            };
            let d = ctx.dispatch(&kernel, &bindings, ctx.grid(spec.groups(threads)?, spec.entry)?)?;
            ds.push(d.sized(self.layout.sizing(grid, tokens)));
        }
        Ok(ds)
    }

    /// Reads the bucket lists back.
    ///
    /// # Errors
    /// A device error while reading back.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&self, ctx: &Context) -> Result<HostBuckets> {
        let meta = Meta::from_words(&ctx.read_back::<u32>(self.layout.meta(), META_WORDS as usize)?);
        let slots = (self.cfg.n_caps * self.cfg.bound) as usize;
        Ok(HostBuckets {
            pad_perm: ctx.read_back(self.pad_perm.view(), slots)?,
            overflow: match self.cfg.policy {
                OverflowPolicy::Overflow => ctx.read_back(self.overflow.view(), meta.overflow as usize)?,
                OverflowPolicy::Drop => Vec::new(),
            },
            over_bound: meta.overflow,
        })
    }
}
