//! The tuner's cache: its typed key ([`TuneKey`]) and its JSON file of entries, one per key,
//! each the kernels chosen and the timings that chose them.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::dtype::WeightDtype;
use super::ffn::ExpertFfn;
use super::variant::{GemmOrder, GemmVariant};
use crate::context::Context;
use crate::shader::FNV1A_BASIS;

/// What a tuning choice holds for: the adapter (name, driver and its version string), the wgpu
/// version, a hash of the kernels' source (so a changed kernel is tuned again), and the
/// problem's class (weight dtype and native f16 loads, order, shape, the rows per expert timed).
/// On disk it is written as one line ([`fmt::Display`], a stable format): `name | driver |
/// driver info | wgpu V | kernels HASH | Dtype[ native] | Order | E=… H=… F=… rows=…`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TuneKey {
    /// The adapter's name.
    pub adapter: String,
    /// The adapter's driver.
    pub driver: String,
    /// The driver's version string.
    pub driver_info: String,
    /// The wgpu version moeflow is built against.
    pub wgpu: &'static str,
    /// FNV-1a over the source of every kernel the tuner can choose.
    pub kernels: u64,
    /// The weights' dtype.
    pub dtype: WeightDtype,
    /// Whether f16 weights load natively.
    pub native_f16: bool,
    /// The accumulation order.
    pub order: GemmOrder,
    /// Experts.
    pub experts: u32,
    /// Hidden size.
    pub hidden: u32,
    /// FFN size.
    pub ffn: u32,
    /// Mean rows per expert the choice was timed on.
    pub rows: u32,
}

impl TuneKey {
    /// The key of tuning `ffn` in `order` on `ctx` at `rows` rows per expert.
    pub(super) fn new(ctx: &Context, ffn: &ExpertFfn, order: GemmOrder, rows: u32) -> Self {
        let a = ctx.adapter();
        TuneKey {
            adapter: a.name.clone(),
            driver: a.driver.clone(),
            driver_info: a.driver_info.clone(),
            wgpu: crate::context::WGPU_VERSION,
            kernels: kernel_revision(),
            dtype: ffn.gate.dtype,
            native_f16: ffn.gate.native_f16,
            order,
            experts: ffn.experts(),
            hidden: ffn.hidden(),
            ffn: ffn.ffn(),
            rows,
        }
    }
}

impl fmt::Display for TuneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let TuneKey {
            adapter,
            driver,
            driver_info,
            wgpu,
            kernels,
            dtype,
            native_f16,
            order,
            experts,
            hidden,
            ffn,
            rows,
        } = self;
        write!(
            f,
            "{adapter} | {driver} | {driver_info} | wgpu {wgpu} | kernels {kernels:016x} | {dtype:?}{} | {order:?} | \
             E={experts} H={hidden} F={ffn} rows={rows}",
            if *native_f16 { " native" } else { "" },
        )
    }
}

/// FNV-1a over the source of every kernel the tuner can choose (both orders, both weight
/// paths): a new kernel revision gets new cache keys.
pub(super) fn kernel_revision() -> u64 {
    static REV: OnceLock<u64> = OnceLock::new();
    *REV.get_or_init(|| super::specs::shaders().iter().fold(FNV1A_BASIS, |h, s| s.fnv1a(h)))
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct CacheFile {
    entries: BTreeMap<String, CacheEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct CacheEntry {
    pub(super) up: GemmVariant,
    pub(super) down: GemmVariant,
    /// `(variant name, up seconds, down seconds)` as measured.
    pub(super) timings: Vec<(String, f64, f64)>,
}

impl CacheFile {
    /// The entry for `key`.
    pub(super) fn get(&self, key: &TuneKey) -> Option<&CacheEntry> {
        self.entries.get(&key.to_string())
    }

    /// Sets the entry for `key`.
    pub(super) fn insert(&mut self, key: &TuneKey, entry: CacheEntry) {
        self.entries.insert(key.to_string(), entry);
    }
}

pub(super) fn read_cache(path: &Path) -> CacheFile {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheFile::default(),
        Err(e) => {
            log::warn!("moeflow: ignoring the tuning cache {}: {e}", path.display());
            CacheFile::default()
        }
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            log::warn!("moeflow: ignoring the tuning cache {} (not a cache file: {e})", path.display());
            CacheFile::default()
        }),
    }
}

pub(super) fn write_cache(path: &Path, cache: &CacheFile) {
    let write = || -> std::io::Result<()> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::Builder::new().prefix(".moeflow-tune-").tempfile_in(dir)?;
        tmp.write_all(&serde_json::to_vec_pretty(cache).map_err(std::io::Error::other)?)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    };
    if let Err(e) = write() {
        log::warn!("moeflow: could not write the tuning cache {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key's disk form is the one the cache files written before the typed key hold.
    #[test]
    fn the_key_is_written_in_its_stable_form() {
        let key = TuneKey {
            adapter: "GPU".into(),
            driver: "drv".into(),
            driver_info: "1.2".into(),
            wgpu: "30.0.2",
            kernels: 0xab,
            dtype: WeightDtype::F16,
            native_f16: true,
            order: GemmOrder::Fast,
            experts: 8,
            hidden: 64,
            ffn: 96,
            rows: 32,
        };
        let want = "GPU | drv | 1.2 | wgpu 30.0.2 | kernels 00000000000000ab | F16 native | Fast | E=8 H=64 F=96 rows=32";
        assert_eq!(key.to_string(), want);
        let exact = TuneKey { native_f16: false, dtype: WeightDtype::Bf16, order: GemmOrder::Strict, ..key };
        assert!(exact.to_string().contains("| Bf16 | Strict |"), "{exact}");
    }
}
