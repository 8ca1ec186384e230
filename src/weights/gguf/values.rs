//! GGUF's typed values: metadata values and ggml tensor types.

use crate::quant;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING`.
    Str(String),
    /// `ARRAY` (of one element type).
    Array(Vec<GgufValue>),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

impl GgufValue {
    /// The GGUF value type number (`UINT8` = 0 .. `FLOAT64` = 12).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::Str(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }
    /// The value as an unsigned integer: any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float: either float type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A tensor's ggml type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    /// `GGML_TYPE_F32` (0).
    F32,
    /// `GGML_TYPE_F16` (1).
    F16,
    /// `GGML_TYPE_Q4_0` (2): [`quant::q4_0_dequantize`]'s blocks.
    Q4_0,
    /// `GGML_TYPE_Q8_0` (8): [`quant::q8_0_dequantize`]'s blocks.
    Q8_0,
    /// `GGML_TYPE_BF16` (30).
    Bf16,
    /// `GGML_TYPE_MXFP4` (39): [`quant::mxfp4_from_ggml`]'s blocks.
    Mxfp4,
    /// Any other type, by its ggml number (k-quants, i-quants, ...).
    Other(u32),
}

impl GgmlType {
    /// The ggml type number.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q8_0 => 8,
            GgmlType::Bf16 => 30,
            GgmlType::Mxfp4 => 39,
            GgmlType::Other(id) => id,
        }
    }

    pub(super) fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            8 => GgmlType::Q8_0,
            30 => GgmlType::Bf16,
            39 => GgmlType::Mxfp4,
            other => GgmlType::Other(other),
        }
    }

    /// (values, bytes) per block, for the types this module decodes.
    pub(super) fn block(self) -> Option<(u64, u64)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::Bf16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((quant::BLOCK_VALUES as u64, quant::Q4_0_BLOCK_BYTES as u64)),
            GgmlType::Q8_0 => Some((quant::BLOCK_VALUES as u64, quant::Q8_0_BLOCK_BYTES as u64)),
            GgmlType::Mxfp4 => Some((quant::BLOCK_VALUES as u64, quant::GGML_MXFP4_BLOCK_BYTES as u64)),
            GgmlType::Other(_) => None,
        }
    }
}
