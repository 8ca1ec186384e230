//! Parsing a GGUF file's bytes: the header, the metadata, the tensor table, and a tensor's
//! values as f32.

use std::collections::BTreeMap;

use half::{bf16, f16};

use super::values::{GgmlType, GgufValue};
use crate::error::{Error, Result};
use crate::quant;

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    /// The tensor's name (`blk.3.ffn_gate_exps.weight`).
    pub name: String,
    /// Dimensions, innermost (contiguous) first, as ggml's `ne`.
    pub dims: Vec<u64>,
    /// The ggml type.
    pub ty: GgmlType,
    /// Byte offset into the data section (a multiple of the file's alignment).
    pub offset: u64,
}

impl GgufTensor {
    /// Values in the tensor.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of its data, for the types [`Gguf::tensor_f32`] decodes.
    pub fn bytes(&self) -> Option<u64> {
        let (values, bytes) = self.ty.block()?;
        Some(self.elements() / values * bytes)
    }
}

/// A parsed GGUF file, borrowing its bytes.
#[derive(Debug)]
pub struct Gguf<'a> {
    /// The format version (2 or 3).
    pub version: u32,
    /// Every metadata pair, by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// The tensor table, in file order.
    pub tensors: Vec<GgufTensor>,
    /// The data section's alignment.
    pub alignment: u64,
    data: &'a [u8],
    source: String,
}

/// Longest dimension list ggml writes (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;

/// A cursor over the file's bytes whose reads fail, naming the place, past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    source: &'a str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let end =
            usize::try_from(n).ok().and_then(|n| self.at.checked_add(n)).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Error::invalid(format!(
                "{} is not a whole GGUF file: {what} at byte {} needs {n} bytes, {} are left",
                self.source,
                self.at,
                self.bytes.len() - self.at
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::invalid(format!("{}: {what} is not UTF-8", self.source)))
    }

    /// A value of metadata type `ty`; `depth` 1 inside an array (arrays do not nest deeper).
    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(what)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(Error::invalid(format!("{}: {what} is a bool of value {b}", self.source))),
            },
            8 => GgufValue::Str(self.string(what)?),
            9 if depth == 0 => {
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte: a count past what is left is a bad file,
                // found before anything is allocated for it.
                if count > (self.bytes.len() - self.at) as u64 {
                    return Err(Error::invalid(format!(
                        "{}: {what} claims {count} elements, more than the {} bytes left",
                        self.source,
                        self.bytes.len() - self.at
                    )));
                }
                let values = (0..count).map(|_| self.value(elem, what, 1)).collect::<Result<Vec<_>>>()?;
                GgufValue::Array(values)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(Error::invalid(format!(
                    "{}: {what} has unknown value type {other}",
                    self.source
                )));
            }
        })
    }
}

impl<'a> Gguf<'a> {
    /// Parses the header, metadata and tensor table of the GGUF file `bytes` (named `source`
    /// in errors) and checks that every tensor this module can size lies inside the data
    /// section.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a file that is not GGUF version 2 or 3, is cut short, has
    /// an unknown metadata type, a bad alignment, a tensor with no or more than four
    /// dimensions, a repeated tensor name, or a tensor whose offset is not aligned or whose
    /// data runs past the end.
    pub fn parse(bytes: &'a [u8], source: &str) -> Result<Self> {
        let mut r = Reader { bytes, at: 0, source };
        if r.take(4, "the magic")? != b"GGUF" {
            return Err(Error::invalid(format!("{source} is not a GGUF file (no `GGUF` magic)")));
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::invalid(format!(
                "{source} is GGUF version {version}; versions 2 and 3 are read"
            )));
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = r.string(&format!("metadata key {i}"))?;
            let ty = r.u32(&format!("the type of `{key}`"))?;
            let value = r.value(ty, &format!("the value of `{key}`"), 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(GgufValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(other) => {
                return Err(Error::invalid(format!(
                    "{source}: general.alignment is {other:?}; a u32 power of two is read"
                )));
            }
        };
        let mut tensors: Vec<GgufTensor> = Vec::new();
        for i in 0..tensor_count {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let n_dims = r.u32(&format!("the dimension count of `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::invalid(format!(
                    "{source}: tensor `{name}` has {n_dims} dimensions; 1 to {MAX_DIMS} are read"
                )));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64(&format!("the dimensions of `{name}`")))
                .collect::<Result<Vec<_>>>()?;
            if dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).is_none() {
                return Err(Error::invalid(format!(
                    "{source}: tensor `{name}` has {dims:?} values, past u64"
                )));
            }
            let ty = GgmlType::from_id(r.u32(&format!("the type of `{name}`"))?);
            let offset = r.u64(&format!("the offset of `{name}`"))?;
            if tensors.iter().any(|t| t.name == name) {
                return Err(Error::invalid(format!("{source}: tensor `{name}` is listed twice")));
            }
            tensors.push(GgufTensor { name, dims, ty, offset });
        }
        let start = (r.at as u64).next_multiple_of(alignment).min(bytes.len() as u64) as usize;
        let data = &bytes[start..];
        let file = Gguf { version, metadata, tensors, alignment, data, source: source.to_string() };
        for t in &file.tensors {
            file.check_extent(t)?;
        }
        Ok(file)
    }

    /// `t`'s offset against the alignment and, for the types this module sizes, its data
    /// against the data section.
    fn check_extent(&self, t: &GgufTensor) -> Result<()> {
        if !t.offset.is_multiple_of(self.alignment) {
            return Err(Error::invalid(format!(
                "{}: tensor `{}` starts at {}, not a multiple of the alignment {}",
                self.source, t.name, t.offset, self.alignment
            )));
        }
        if let Some((values, _)) = t.ty.block()
            && !t.dims[0].is_multiple_of(values)
        {
            return Err(Error::shape(
                format!("tensor `{}` ({:?})", t.name, t.ty),
                format!("rows of a multiple of {values} values"),
                format!("{:?}", t.dims),
            ));
        }
        if let Some(bytes) = t.bytes()
            && t.offset.checked_add(bytes).is_none_or(|end| end > self.data.len() as u64)
        {
            return Err(Error::invalid(format!(
                "{}: tensor `{}` ({bytes} bytes at {}) runs past the data section's {} bytes",
                self.source,
                t.name,
                t.offset,
                self.data.len()
            )));
        }
        Ok(())
    }

    /// What the file is called in messages (the name given to [`Gguf::parse`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The table entry of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The entry of tensor `name`, or an error naming it and the source.
    fn entry(&self, name: &str) -> Result<&GgufTensor> {
        self.tensor(name).ok_or_else(|| Error::invalid(format!("missing tensor `{name}` in {}", self.source)))
    }

    /// The stored bytes of tensor `name`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a missing tensor or one of a type this module does not
    /// size.
    pub fn tensor_data(&self, name: &str) -> Result<&'a [u8]> {
        let t = self.entry(name)?;
        let bytes = t.bytes().ok_or_else(|| self.unsupported(t))?;
        // check_extent made sure this range is inside the data section.
        let start = t.offset as usize;
        Ok(&self.data[start..start + bytes as usize])
    }

    fn unsupported(&self, t: &GgufTensor) -> Error {
        Error::invalid(format!(
            "tensor `{}` in {} is ggml type {:?}; F32, F16, BF16, Q8_0, Q4_0 and MXFP4 are read",
            t.name, self.source, t.ty
        ))
    }

    /// Tensor `name`'s values as f32, row-major with `dims[0]` contiguous (exact: see
    /// [`crate::quant`]).
    ///
    /// # Errors
    /// As [`Self::tensor_data`].
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.entry(name)?;
        let d = self.tensor_data(name)?;
        match t.ty {
            GgmlType::F32 => {
                Ok(d.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
            }
            GgmlType::F16 => {
                Ok(d.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect())
            }
            GgmlType::Bf16 => {
                Ok(d.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect())
            }
            GgmlType::Q8_0 => quant::q8_0_dequantize(d),
            GgmlType::Q4_0 => quant::q4_0_dequantize(d),
            GgmlType::Mxfp4 => {
                let (codes, scales) = quant::mxfp4_from_ggml(d)
                    .map_err(|e| Error::invalid(format!("tensor `{name}` in {}: {e}", self.source)))?;
                quant::mxfp4_dequantize(&codes, &scales)
            }
            GgmlType::Other(_) => Err(self.unsupported(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::write::{GgufWriter, encode_file, encode_str};
    use super::*;

    /// Builds GGUF files for the tests: metadata pairs as (key, type, value bytes), tensors as
    /// (name, dims, type, data), laid out as ggml's writer does (each tensor's data padded to
    /// the alignment).
    struct Writer {
        kv: Vec<(String, u32, Vec<u8>)>,
        tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
        alignment: usize,
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        encode_str(s, &mut out);
        out
    }

    impl Writer {
        fn new() -> Self {
            Writer { kv: Vec::new(), tensors: Vec::new(), alignment: 32 }
        }

        fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
            self.kv.push((key.into(), ty, value));
            self
        }

        fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
            self.tensors.push((name.into(), dims.to_vec(), ty, data));
            self
        }

        fn bytes(&self, version: u32) -> Vec<u8> {
            encode_file(version, &self.kv, &self.tensors, self.alignment)
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn metadata_of_every_type_and_tensors_of_every_decoded_type_read_back() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.0) * 0.173).collect();
        let q8 = quant::q8_0_quantize(&values).unwrap();
        let q4 = quant::q4_0_quantize(&values).unwrap();
        let half: Vec<u8> = values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let brain: Vec<u8> = values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
        let mut array = 4u32.to_le_bytes().to_vec();
        array.extend(3u64.to_le_bytes());
        [7u32, 8, 9].iter().for_each(|v| array.extend(v.to_le_bytes()));
        let file = Writer::new()
            .kv("general.architecture", 8, string("qwen3moe"))
            .kv("qwen3moe.expert_count", 4, 128u32.to_le_bytes().to_vec())
            .kv("qwen3moe.expert_used_count", 5, 8i32.to_le_bytes().to_vec())
            .kv("u8", 0, vec![200])
            .kv("i8", 1, vec![0xff])
            .kv("u16", 2, 513u16.to_le_bytes().to_vec())
            .kv("i16", 3, (-2i16).to_le_bytes().to_vec())
            .kv("f32", 6, 0.5f32.to_le_bytes().to_vec())
            .kv("flag", 7, vec![1])
            .kv("list", 9, array)
            .kv("u64", 10, (1u64 << 40).to_le_bytes().to_vec())
            .kv("i64", 11, (-5i64).to_le_bytes().to_vec())
            .kv("f64", 12, 0.25f64.to_le_bytes().to_vec())
            .tensor("t.f32", &[32, 2], 0, f32_bytes(&values))
            .tensor("t.f16", &[64], 1, half)
            .tensor("t.q4_0", &[32, 2], 2, q4.clone())
            .tensor("t.q8_0", &[64, 1], 8, q8.clone())
            .tensor("t.bf16", &[16, 4], 30, brain)
            .tensor("t.q4_k", &[256], 12, vec![0; 144]);
        for version in [2, 3] {
            let bytes = file.bytes(version);
            let g = Gguf::parse(&bytes, "test.gguf").unwrap();
            assert_eq!((g.version, g.alignment, g.tensors.len()), (version, 32, 6));
            let m = |k: &str| g.metadata.get(k).unwrap_or_else(|| panic!("{k}"));
            assert_eq!(m("general.architecture").as_str(), Some("qwen3moe"));
            assert_eq!(m("qwen3moe.expert_count").as_u64(), Some(128));
            assert_eq!(m("qwen3moe.expert_used_count").as_u64(), Some(8));
            assert_eq!((m("u8").as_u64(), m("i8").as_u64()), (Some(200), None));
            assert_eq!(
                (m("u16").as_u64(), m("i16"), m("u64").as_u64()),
                (Some(513), &GgufValue::I16(-2), Some(1 << 40))
            );
            assert_eq!(
                (m("f32").as_f64(), m("f64").as_f64(), m("flag").as_bool()),
                (Some(0.5), Some(0.25), Some(true))
            );
            assert_eq!(
                m("list"),
                &GgufValue::Array(vec![GgufValue::U32(7), GgufValue::U32(8), GgufValue::U32(9)])
            );
            assert_eq!(m("i64"), &GgufValue::I64(-5));
            assert_eq!(g.tensor_f32("t.f32").unwrap(), values);
            assert_eq!(
                g.tensor_f32("t.f16").unwrap(),
                values.iter().map(|v| f16::from_f32(*v).to_f32()).collect::<Vec<_>>()
            );
            assert_eq!(
                g.tensor_f32("t.bf16").unwrap(),
                values.iter().map(|v| bf16::from_f32(*v).to_f32()).collect::<Vec<_>>()
            );
            assert_eq!(g.tensor_f32("t.q8_0").unwrap(), quant::q8_0_dequantize(&q8).unwrap());
            assert_eq!(g.tensor_f32("t.q4_0").unwrap(), quant::q4_0_dequantize(&q4).unwrap());
            assert_eq!(g.tensor_data("t.q8_0").unwrap(), &q8[..]);
            let q4k = g.tensor("t.q4_k").unwrap();
            assert_eq!((q4k.ty, q4k.elements(), q4k.bytes()), (GgmlType::Other(12), 256, None));
            let err = g.tensor_f32("t.q4_k").unwrap_err().to_string();
            assert!(err.contains("Other(12)") && err.contains("Q8_0"), "{err}");
            assert!(g.tensor_f32("nope").unwrap_err().to_string().contains("missing tensor `nope`"));
        }
    }

    #[test]
    fn the_writer_round_trips_every_value_type_and_tensor() {
        let values = [
            GgufValue::U8(7),
            GgufValue::I8(-7),
            GgufValue::U16(700),
            GgufValue::I16(-700),
            GgufValue::U32(70_000),
            GgufValue::I32(-70_000),
            GgufValue::F32(0.75),
            GgufValue::Bool(true),
            GgufValue::Str("qwen2moe".into()),
            GgufValue::Array(vec![GgufValue::Str("a".into()), GgufValue::Str("bc".into())]),
            GgufValue::Array(vec![]),
            GgufValue::U64(1 << 40),
            GgufValue::I64(-(1 << 40)),
            GgufValue::F64(-0.125),
        ];
        let q8 = quant::q8_0_quantize(&[0.5; 32]).unwrap();
        let mut w = GgufWriter::default().metadata("general.alignment", GgufValue::U32(64));
        for (i, v) in values.iter().enumerate() {
            w = w.metadata(&format!("k{i:02}"), v.clone());
        }
        let bytes = w
            .tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
            .tensor("q", &[32], GgmlType::Q8_0, q8.clone())
            .to_bytes();
        let g = Gguf::parse(&bytes, "w.gguf").unwrap();
        assert_eq!((g.version, g.alignment), (3, 64));
        for (i, v) in values.iter().enumerate() {
            let got = &g.metadata[&format!("k{i:02}")];
            // An empty array reads back as an empty array of UINT8.
            assert_eq!(got, v, "k{i:02}");
        }
        assert_eq!(g.tensor("q").unwrap().offset, 64);
        assert_eq!(g.tensor_f32("a").unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(g.tensor_data("q").unwrap(), q8);
    }

    #[test]
    fn a_custom_alignment_places_the_data() {
        let mut w = Writer::new()
            .kv("general.alignment", 4, 64u32.to_le_bytes().to_vec())
            .tensor("a", &[3], 0, f32_bytes(&[1.0, 2.0, 3.0]))
            .tensor("b", &[2], 0, f32_bytes(&[4.0, 5.0]));
        w.alignment = 64;
        let bytes = w.bytes(3);
        let g = Gguf::parse(&bytes, "aligned.gguf").unwrap();
        assert_eq!(g.alignment, 64);
        assert_eq!(g.tensor("b").unwrap().offset, 64);
        assert_eq!(g.tensor_f32("b").unwrap(), vec![4.0, 5.0]);
    }

    #[test]
    fn bad_files_are_errors_naming_the_problem() {
        let good = Writer::new().kv("k", 4, 1u32.to_le_bytes().to_vec()).tensor(
            "a",
            &[2],
            0,
            f32_bytes(&[1.0, 2.0]),
        );
        let bytes = good.bytes(3);
        let err = |b: &[u8]| Gguf::parse(b, "bad.gguf").unwrap_err().to_string();
        assert!(err(b"GGML").contains("not a GGUF file"));
        let mut v1 = bytes.clone();
        v1[4] = 1;
        assert!(err(&v1).contains("version 1"), "{}", err(&v1));
        // Cut anywhere inside the header or table: an error naming what was being read.
        for cut in [3, 10, 30, 45, 60, 70] {
            assert!(err(&bytes[..cut]).contains("not a whole GGUF file"), "{cut}: {}", err(&bytes[..cut]));
        }
        // Data cut short.
        assert!(err(&bytes[..bytes.len() - 30]).contains("runs past the data section"));
        // An unknown metadata type, a bool that is not 0 or 1, a huge array.
        assert!(err(&Writer::new().kv("k", 13, vec![]).bytes(3)).contains("unknown value type 13"));
        assert!(err(&Writer::new().kv("k", 7, vec![2]).bytes(3)).contains("bool of value 2"));
        let mut huge = 4u32.to_le_bytes().to_vec();
        huge.extend(u64::MAX.to_le_bytes());
        assert!(err(&Writer::new().kv("k", 9, huge).bytes(3)).contains("claims"));
        // Nested arrays are refused (ggml writes none).
        let mut nested = 9u32.to_le_bytes().to_vec();
        nested.extend(1u64.to_le_bytes());
        assert!(err(&Writer::new().kv("k", 9, nested).bytes(3)).contains("unknown value type 9"));
        // Tensor table problems.
        let twice = Writer::new().tensor("a", &[2], 0, f32_bytes(&[1.0, 2.0])).tensor(
            "a",
            &[2],
            0,
            f32_bytes(&[1.0, 2.0]),
        );
        assert!(err(&twice.bytes(3)).contains("listed twice"));
        assert!(
            err(&Writer::new().tensor("a", &[1, 1, 1, 1, 1], 0, f32_bytes(&[1.0])).bytes(3))
                .contains("5 dimensions")
        );
        assert!(err(&Writer::new().tensor("a", &[u64::MAX, 2], 0, vec![]).bytes(3)).contains("past u64"));
        assert!(err(&Writer::new().tensor("q", &[16], 8, vec![0; 34]).bytes(3)).contains("multiple of 32"));
        let odd = Writer::new().kv("general.alignment", 4, 24u32.to_le_bytes().to_vec());
        assert!(err(&odd.bytes(3)).contains("power of two"));
        let mut misaligned = bytes.clone();
        // Tensor `a`'s offset: after the header (24 bytes), the pair (17), its name (9),
        // dimension count (4), dimension (8) and type (4).
        misaligned[66] = 4;
        assert!(err(&misaligned).contains("not a multiple of the alignment"), "{}", err(&misaligned));
    }
}
