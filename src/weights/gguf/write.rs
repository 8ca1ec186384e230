//! Writing GGUF files: metadata and tensors laid out as ggml's writer lays them out.

use super::values::{GgmlType, GgufValue};

/// Appends `s` as GGUF stores a string: a u64 length and UTF-8 bytes.
pub(super) fn encode_str(s: &str, out: &mut Vec<u8>) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A metadata pair as stored: key, value type number, value bytes.
pub(super) type RawPair = (String, u32, Vec<u8>);
/// A tensor as stored: name, dimensions (innermost first), ggml type number, data.
pub(super) type RawTensor = (String, Vec<u64>, u32, Vec<u8>);

/// The bytes of a GGUF file laid out as ggml's writer lays it out: header, metadata, tensor
/// table, then each tensor's data padded to `alignment`.
pub(super) fn encode_file(version: u32, kv: &[RawPair], tensors: &[RawTensor], alignment: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(version.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kv.len() as u64).to_le_bytes());
    for (k, ty, v) in kv {
        encode_str(k, &mut out);
        out.extend(ty.to_le_bytes());
        out.extend(v);
    }
    let mut offset = 0usize;
    for (name, dims, ty, data) in tensors {
        encode_str(name, &mut out);
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ty.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset += data.len().next_multiple_of(alignment);
    }
    out.resize(out.len().next_multiple_of(alignment), 0);
    for (.., data) in tensors {
        out.extend(data);
        out.resize(out.len().next_multiple_of(alignment), 0);
    }
    out
}

/// Writes GGUF version 3 files (test fixtures, converted layers): metadata pairs and tensors
/// in the order given, data aligned to `general.alignment` when set (32 otherwise).
///
/// ```
/// use moeflow::weights::gguf::{GgmlType, Gguf, GgufValue, GgufWriter};
/// # fn main() -> moeflow::Result<()> {
/// let bytes = GgufWriter::default()
///     .metadata("general.architecture", GgufValue::Str("qwen3moe".into()))
///     .tensor("t", &[2], GgmlType::F32, [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect())
///     .to_bytes();
/// let g = Gguf::parse(&bytes, "t.gguf")?;
/// assert_eq!(g.tensor_f32("t")?, [1.0, 2.0]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// Adds a metadata pair.
    pub fn metadata(mut self, key: &str, value: GgufValue) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor: `dims` innermost first (ggml's `ne`), `data` its stored bytes.
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, v)) => v.as_u64().map_or(32, |a| a as usize),
            None => 32,
        };
        let kv: Vec<RawPair> = self
            .metadata
            .iter()
            .map(|(k, v)| {
                let mut bytes = Vec::new();
                encode_value(v, &mut bytes);
                (k.clone(), v.type_id(), bytes)
            })
            .collect();
        let tensors: Vec<RawTensor> =
            self.tensors.iter().map(|(n, d, t, b)| (n.clone(), d.clone(), t.id(), b.clone())).collect();
        encode_file(3, &kv, &tensors, alignment)
    }
}

/// Appends the value's bytes (without its type number) as GGUF stores them; an array's
/// element type is its first element's (`UINT8` when empty).
fn encode_value(value: &GgufValue, out: &mut Vec<u8>) {
    match value {
        GgufValue::U8(v) => out.push(*v),
        GgufValue::I8(v) => out.extend(v.to_le_bytes()),
        GgufValue::U16(v) => out.extend(v.to_le_bytes()),
        GgufValue::I16(v) => out.extend(v.to_le_bytes()),
        GgufValue::U32(v) => out.extend(v.to_le_bytes()),
        GgufValue::I32(v) => out.extend(v.to_le_bytes()),
        GgufValue::F32(v) => out.extend(v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::Str(v) => encode_str(v, out),
        GgufValue::Array(items) => {
            out.extend(items.first().map_or(0, GgufValue::type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| encode_value(i, out));
        }
        GgufValue::U64(v) => out.extend(v.to_le_bytes()),
        GgufValue::I64(v) => out.extend(v.to_le_bytes()),
        GgufValue::F64(v) => out.extend(v.to_le_bytes()),
    }
}
