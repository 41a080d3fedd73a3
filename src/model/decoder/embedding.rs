//! The token embedding, looked up by id. A quantized file's table stays in its own type on the
//! host and only the rows a forward asks for are widened to f32: Gemma 3's 262,144 x 640 table
//! in f32 took 671 MB beside the 178 MB the file holds (its resident memory was 1.37 GB for a
//! 253 MB model), and Llama 3's 128k x 3072 one was rounded to f16 to fit. A row widens through
//! the same dequantization as the whole table would, so its values are the same.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::model::decoder::linear::RawWeight;
use crate::model::{ModelError, Result};

pub(crate) enum Embedding {
    /// Rows in f32 or f16 on the model's device.
    Dense(Tensor),
    /// A quantized table's bytes on the host, `row_bytes` a row.
    Quantized {
        bytes: Vec<u8>,
        dtype: GgmlDType,
        rows: usize,
        hidden: usize,
        row_bytes: usize,
    },
}

impl Embedding {
    /// The table from the file: a quantized one kept as it is where the forward runs on the
    /// host (`quantized_ok`), anything else widened (to f16 when f32 would pass 1 GiB).
    pub fn from_raw(raw: RawWeight, device: &Device, quantized_ok: bool) -> Result<Self> {
        if let (RawWeight::Quantized(q), true) = (&raw, quantized_ok) {
            let dtype = q.dtype();
            if !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
                let (rows, hidden) = q.shape().dims2()?;
                if hidden % dtype.block_size() != 0 {
                    return Err(ModelError::BadConfig(format!(
                        "embedding rows of {hidden} values do not fill {dtype:?} blocks"
                    )));
                }
                let row_bytes = hidden / dtype.block_size() * dtype.type_size();
                let bytes = q.data()?.into_owned();
                return Ok(Self::Quantized {
                    bytes,
                    dtype,
                    rows,
                    hidden,
                    row_bytes,
                });
            }
        }
        let table = match raw {
            RawWeight::Quantized(q) => q.dequantize(&Device::Cpu)?,
            RawWeight::Dense(t) => t.to_dtype(DType::F32)?,
        };
        let table = if table.elem_count() > (1 << 28) {
            table.to_dtype(DType::F16)?
        } else {
            table
        };
        Ok(Self::Dense(table.to_device(device)?))
    }

    /// `(vocabulary, hidden)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Dense(t) => Ok(t.dims2()?),
            Self::Quantized { rows, hidden, .. } => Ok((*rows, *hidden)),
        }
    }

    /// Rows `ids` in f32 on `device` (ids already checked against the vocabulary).
    pub fn rows(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Self::Dense(t) => {
                let idx = Tensor::from_slice(ids, ids.len(), t.device())?;
                Ok(t.index_select(&idx, 0)?
                    .to_dtype(DType::F32)?
                    .to_device(device)?)
            }
            Self::Quantized {
                bytes,
                dtype,
                hidden,
                row_bytes,
                ..
            } => {
                let mut out = Vec::with_capacity(ids.len() * hidden);
                for &id in ids {
                    let row = &bytes[id as usize * row_bytes..][..*row_bytes];
                    let storage = QStorage::from_data(Cow::Borrowed(row), &Device::Cpu, *dtype)?;
                    let q = QTensor::new(storage, *hidden)?;
                    out.extend(q.dequantize(&Device::Cpu)?.to_vec1::<f32>()?);
                }
                Ok(Tensor::from_vec(out, (ids.len(), *hidden), device)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quantized table's looked-up rows are the whole table's dequantized rows, bit for bit,
    /// for 32-value (Q8_0) and 256-value (Q4_K) blocks.
    #[test]
    fn quantized_rows_equal_the_dequantized_table() {
        let (rows, hidden) = (37, 512);
        let values: Vec<f32> = (0..rows * hidden)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 400.0)
            .collect();
        let table = Tensor::from_vec(values, (rows, hidden), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4K] {
            let q = QTensor::quantize(&table, dtype).unwrap();
            let whole = q.dequantize(&Device::Cpu).unwrap();
            let embed = Embedding::from_raw(RawWeight::Quantized(q), &Device::Cpu, true).unwrap();
            assert!(matches!(embed, Embedding::Quantized { .. }));
            assert_eq!(embed.dims().unwrap(), (rows, hidden));
            let ids = [36u32, 0, 5, 5, 17];
            let got = embed.rows(&ids, &Device::Cpu).unwrap();
            let idx = Tensor::from_slice(&ids, ids.len(), &Device::Cpu).unwrap();
            let want = whole.index_select(&idx, 0).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                v.into_iter().map(f32::to_bits).collect()
            };
            assert_eq!(bits(&got), bits(&want), "{dtype:?}");
        }
    }
}
