//! A weight as a file holds it, before any conversion: a GGUF's blocks in their ggml type or a
//! safetensors tensor. What the file readers hand the model builder, which converts it to the
//! type its kernels run.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::model::{ModelError, Result};

/// A weight as it comes out of a file, before conversion.
pub enum RawWeight {
    Quantized(QTensor),
    Dense(Tensor),
}

impl RawWeight {
    pub(crate) fn dims2(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Self::Quantized(q) => q.shape().dims2()?,
            Self::Dense(t) => t.dims2()?,
        })
    }

    pub(crate) fn src_dtype(&self) -> GgmlDType {
        match self {
            Self::Quantized(q) => q.dtype(),
            Self::Dense(t) => match t.dtype() {
                candle_core::DType::F16 => GgmlDType::F16,
                candle_core::DType::BF16 => GgmlDType::BF16,
                _ => GgmlDType::F32,
            },
        }
    }

    pub(crate) fn dequantize(&self, device: &Device) -> Result<Tensor> {
        Ok(match self {
            Self::Quantized(q) => q.dequantize(device)?,
            Self::Dense(t) => t.to_dtype(candle_core::DType::F32)?,
        })
    }

    pub(crate) fn raw_bytes(&self) -> Result<Vec<u8>> {
        match self {
            Self::Quantized(q) => Ok(q.data()?.into_owned()),
            Self::Dense(_) => Err(ModelError::BadInput(
                "dense weight has no raw blocks".into(),
            )),
        }
    }
}
