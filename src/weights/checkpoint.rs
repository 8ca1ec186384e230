//! A checkpoint: one `.safetensors` file, or the shards a `model.safetensors.index.json` names,
//! memory-mapped (nothing is read until a tensor is used) and indexed by tensor name across
//! shards; or one file's bytes already in memory ([`Checkpoint::from_bytes`]: a file a browser
//! page was given, where there is no file system to map).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use safetensors::tensor::{Metadata, TensorView};
use serde::Deserialize;

use super::file_bytes::FileBytes;
use crate::error::{Error, Result};

/// Where tensors come from: one in-memory file or a (sharded) checkpoint.
pub(crate) trait TensorSource {
    /// Every tensor name.
    fn names(&self) -> Vec<&str>;
    /// The tensor `name`, if present.
    fn tensor(&self, name: &str) -> Option<TensorView<'_>>;
    /// What to call the source in messages.
    fn describe(&self) -> String;
    /// The caller is done with the tensor `name` for now: a mapped source may let the
    /// operating system drop its pages (they are read again if the tensor is used again).
    fn release(&self, _name: &str) {}
}

/// One in-memory safetensors file.
pub(crate) struct InMemory<'a> {
    pub st: SafeTensors<'a>,
    pub source: String,
}

impl TensorSource for InMemory<'_> {
    fn names(&self) -> Vec<&str> {
        self.st.names()
    }
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.st.tensor(name).ok()
    }
    fn describe(&self) -> String {
        self.source.clone()
    }
}

/// One shard's bytes with its parsed header.
struct Shard {
    path: PathBuf,
    map: FileBytes,
    header: usize,
    meta: Metadata,
}

impl Shard {
    fn open(path: &Path) -> Result<Self> {
        Shard::parse(path, FileBytes::open(path)?)
    }

    fn parse(path: &Path, map: FileBytes) -> Result<Self> {
        let (header, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
            Error::invalid(format!("{} is not a readable safetensors file: {e}", path.display()))
        })?;
        Ok(Shard { path: path.to_path_buf(), map, header, meta })
    }

    /// Lets the kernel drop the resident pages of `name`'s bytes (where they are mapped).
    fn release(&self, name: &str) {
        if let Some(info) = self.meta.info(name) {
            let (start, end) = info.data_offsets;
            self.map.release(8 + self.header + start, end - start);
        }
    }

    fn view(&self, name: &str) -> Option<TensorView<'_>> {
        let info = self.meta.info(name)?;
        let (start, end) = info.data_offsets;
        let base = 8 + self.header;
        let bytes = self.map.get(base + start..base + end)?;
        TensorView::new(info.dtype, info.shape.clone(), bytes).ok()
    }
}

#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

/// A checkpoint: every tensor of one file or of the shards of an index, mapped, with the
/// shard that holds each tensor.
pub struct Checkpoint {
    root: PathBuf,
    shards: Vec<Shard>,
    index: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("root", &self.root)
            .field("shards", &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>())
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl Checkpoint {
    /// Opens `path`: a `.safetensors` file, a `*.index.json` (or another JSON file with a
    /// `weight_map`) naming shards, or a directory holding `model.safetensors.index.json` or
    /// exactly one `.safetensors` file.
    ///
    /// # Errors
    /// A path that is none of these; an index that is not JSON or names a shard that is
    /// missing or unreadable; a tensor the index places in a shard that does not hold it; a
    /// tensor held by two shards; a shard that is not a complete safetensors file.
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            if index.is_file() {
                return Checkpoint::from_index(&index);
            }
            let files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| Error::Io { path: path.display().to_string(), source })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            return match files.as_slice() {
                [one] => Checkpoint::single(one),
                [] => Err(Error::invalid(format!(
                    "{} holds neither model.safetensors.index.json nor a .safetensors file",
                    path.display()
                ))),
                _ => Err(Error::invalid(format!(
                    "{} holds {} .safetensors files and no model.safetensors.index.json saying how they fit together",
                    path.display(),
                    files.len()
                ))),
            };
        }
        let name = path.to_string_lossy();
        // An index by its name (`*.index.json`), or any JSON file with a weight map; any other
        // file (a config.json given by mistake among them) must be safetensors.
        let is_index = name.ends_with(".index.json")
            || (name.ends_with(".json")
                && std::fs::read(path).is_ok_and(|b| serde_json::from_slice::<IndexFile>(&b).is_ok()));
        if is_index { Checkpoint::from_index(path) } else { Checkpoint::single(path) }
    }

    fn single(path: &Path) -> Result<Self> {
        Checkpoint::of_shard(Shard::open(path)?)
    }

    /// One safetensors file's bytes, already in memory, called `name` in messages (a file a
    /// browser page was given, or one fetched). Nothing is copied.
    ///
    /// # Errors
    /// Bytes that are not a complete safetensors file.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Checkpoint::of_shard(Shard::parse(Path::new(name), FileBytes::Owned(bytes))?)
    }

    fn of_shard(shard: Shard) -> Result<Self> {
        let index = shard.meta.offset_keys().into_iter().map(|n| (n, 0)).collect();
        Ok(Checkpoint { root: shard.path.clone(), shards: vec![shard], index })
    }

    fn from_index(path: &Path) -> Result<Self> {
        let bytes =
            std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        let idx: IndexFile = serde_json::from_slice(&bytes).map_err(|e| {
            Error::invalid(format!("{} is not a safetensors index (with a weight_map): {e}", path.display()))
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut files: Vec<&String> = idx.weight_map.values().collect();
        files.sort();
        files.dedup();
        let mut shards = Vec::new();
        let mut shard_of: BTreeMap<&str, usize> = BTreeMap::new();
        for f in files {
            let p = dir.join(f);
            if !p.is_file() {
                return Err(Error::invalid(format!(
                    "{} names the shard {f}, which is not in {}",
                    path.display(),
                    dir.display()
                )));
            }
            shard_of.insert(f.as_str(), shards.len());
            shards.push(Shard::open(&p)?);
        }
        // Every tensor must be where the index says, and in no other shard.
        let mut holder: BTreeMap<String, usize> = BTreeMap::new();
        for (i, s) in shards.iter().enumerate() {
            for name in s.meta.offset_keys() {
                if let Some(&j) = holder.get(&name) {
                    return Err(Error::invalid(format!(
                        "tensor `{name}` is in two shards: {} and {}",
                        shards[j].path.display(),
                        s.path.display()
                    )));
                }
                holder.insert(name, i);
            }
        }
        let mut index = BTreeMap::new();
        for (name, file) in &idx.weight_map {
            let i = shard_of[file.as_str()];
            if holder.get(name) != Some(&i) {
                return Err(Error::invalid(format!(
                    "{} places `{name}` in {file}, which does not hold it",
                    path.display()
                )));
            }
            index.insert(name.clone(), i);
        }
        Ok(Checkpoint { root: path.to_path_buf(), shards, index })
    }

    /// The files it reads: the index (if any) and every shard.
    pub fn files(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = self.shards.iter().map(|s| s.path.as_path()).collect();
        if !out.contains(&self.root.as_path()) && self.root.is_file() {
            out.push(&self.root);
        }
        out
    }

    /// Layer prefixes (`model.layers.N.`) of every MoE layer (a layer with a router tensor),
    /// by layer index.
    pub fn moe_layers(&self) -> BTreeMap<usize, String> {
        moe_layers(self.index.keys().map(String::as_str))
    }
}

/// MoE layers among `names`: layer index -> prefix (`...layers.N.`).
pub(crate) fn moe_layers<'a>(names: impl Iterator<Item = &'a str>) -> BTreeMap<usize, String> {
    let mut out = BTreeMap::new();
    for n in names {
        let Some(prefix) = super::naming::router_prefix(n) else {
            continue;
        };
        let layer = prefix.trim_end_matches('.').rsplit('.').next().and_then(|s| s.parse::<usize>().ok());
        if let Some(l) = layer {
            out.insert(l, prefix.to_string());
        }
    }
    out
}

impl TensorSource for Checkpoint {
    fn names(&self) -> Vec<&str> {
        self.index.keys().map(String::as_str).collect()
    }
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.shards[*self.index.get(name)?].view(name)
    }
    fn describe(&self) -> String {
        self.root.display().to_string()
    }
    fn release(&self, name: &str) {
        if let Some(&i) = self.index.get(name) {
            self.shards[i].release(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;

    /// A file's bytes give the checkpoint its file gives: the same tensors, layers and values;
    /// bytes that are no safetensors file are an error naming the source.
    #[test]
    fn a_checkpoint_from_bytes_is_the_checkpoint_of_its_file() {
        let router: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = TensorView::new(Dtype::F32, vec![1, 2], &router).unwrap();
        let name = "model.layers.3.mlp.gate.weight";
        let bytes = safetensors::serialize([(name, view)], None).unwrap();
        let file = tempfile::Builder::new().suffix(".safetensors").tempfile().unwrap();
        std::fs::write(file.path(), &bytes).unwrap();
        let mapped = Checkpoint::open(file.path()).unwrap();
        let held = Checkpoint::from_bytes("layer.safetensors", bytes).unwrap();
        assert_eq!(held.names(), mapped.names());
        assert_eq!(held.moe_layers(), mapped.moe_layers());
        assert_eq!(held.moe_layers().get(&3).map(String::as_str), Some("model.layers.3."));
        assert_eq!(held.tensor(name).unwrap().data(), mapped.tensor(name).unwrap().data());
        assert_eq!(held.describe(), "layer.safetensors");
        let err = Checkpoint::from_bytes("page upload", vec![7; 12]).unwrap_err().to_string();
        assert!(err.contains("page upload"), "{err}");
    }
}
