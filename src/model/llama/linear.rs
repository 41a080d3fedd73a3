//! Linear layers and the weight types they can be converted to at load time.
//!
//! Q8_0, Q4_0 and f16 weights run on our own batch-invariant AVX2 kernels (`q8_gemm`,
//! `q4_gemm`, `f16_gemm`) where the CPU has them. Every other type is held as a candle `QTensor`
//! (f32/bf16 included) and multiplied with candle's CPU quantized matmul: that kernel quantizes
//! each activation row on its own and computes each (row, column) dot product with the same code
//! whatever the row count. Either way a token's output does not depend on how many tokens share the pass (batch
//! invariance). Dense weights are deliberately *not* turned into gemm matmuls, whose blocking
//! changes with shape.
//!
//! The tensor backend (`tensor_forward`) holds every weight as a candle `QMatMul` on its device:
//! quantized types through candle's quantized matmul; on a GPU, float types become dense
//! tensors multiplied by its BLAS.

use std::str::FromStr;
use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::model::kernels::f16_gemm::{self, PackedF16};
use crate::model::kernels::packed_gemm::{PackedLinear, PackedWeight};
use crate::model::kernels::q4_gemm::{self, PackedQ4, Q4Format};
use crate::model::kernels::q8_gemm::{self, PackedQ8};
use crate::model::llama::device::ForwardKind;
use crate::model::{ModelError, Result};

/// The type linear weights are converted to when a model is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightsDtype {
    /// Keep the file's own type (a Q4_1 GGUF stays Q4_1; safetensors keep F32/F16/BF16).
    #[default]
    AsIs,
    /// Keep weights the file already quantized (a Q4_1 GGUF stays Q4_1, on our 4-bit kernel)
    /// and convert float ones (F32, F16, BF16) to Q8_0: the file's own numbers where its
    /// publisher chose a quantization, the fast 8-bit kernel where it did not. The default
    /// model steps 1.6–1.8x faster as-is than converted to Q8_0, on exactly its weights.
    /// On a GPU, f16 (`Llama::load_on`: candle's quantized kernels there are not
    /// batch-invariant).
    Auto,
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    /// Q4_1 (the default model's own type: loaded as it is, no weight is re-rounded).
    Q4_1,
    /// Q4_K; rows whose length is not a multiple of 256 fall back to Q4_0.
    Q4K,
}

impl WeightsDtype {
    pub const NAMES: &'static [&'static str] = &[
        "as-is", "auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4k",
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::AsIs => "as-is",
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q4K => "q4k",
        }
    }

    /// The ggml type a weight of type `src` with rows of `k` values ends up as.
    pub fn target(self, src: GgmlDType, k: usize) -> GgmlDType {
        let want = match self {
            Self::AsIs => src,
            Self::Auto => match src {
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => GgmlDType::Q8_0,
                quantized => quantized,
            },
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::BF16 => GgmlDType::BF16,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q4K => GgmlDType::Q4K,
        };
        if k.is_multiple_of(want.block_size()) {
            want
        } else if want == GgmlDType::Q4K && k.is_multiple_of(GgmlDType::Q4_0.block_size()) {
            GgmlDType::Q4_0
        } else {
            GgmlDType::F32
        }
    }
}

impl std::fmt::Display for WeightsDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightsDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "as-is" | "asis" | "as_is" | "native" => Self::AsIs,
            "auto" => Self::Auto,
            "f32" => Self::F32,
            "f16" => Self::F16,
            "bf16" => Self::BF16,
            "q8_0" | "q8" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q4k" | "q4_k" => Self::Q4K,
            other => {
                return Err(format!(
                    "unknown weights dtype '{other}' (expected one of {})",
                    Self::NAMES.join(", ")
                ))
            }
        })
    }
}

/// A weight as it comes out of a file, before conversion.
pub enum RawWeight {
    Quantized(QTensor),
    Dense(Tensor),
}

impl RawWeight {
    fn dims2(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Self::Quantized(q) => q.shape().dims2()?,
            Self::Dense(t) => t.dims2()?,
        })
    }

    fn src_dtype(&self) -> GgmlDType {
        match self {
            Self::Quantized(q) => q.dtype(),
            Self::Dense(t) => match t.dtype() {
                candle_core::DType::F16 => GgmlDType::F16,
                candle_core::DType::BF16 => GgmlDType::BF16,
                _ => GgmlDType::F32,
            },
        }
    }

    fn dequantize(&self, device: &Device) -> Result<Tensor> {
        Ok(match self {
            Self::Quantized(q) => q.dequantize(device)?,
            Self::Dense(t) => t.to_dtype(candle_core::DType::F32)?,
        })
    }

    fn raw_bytes(&self) -> Result<Vec<u8>> {
        match self {
            Self::Quantized(q) => Ok(q.data()?.into_owned()),
            Self::Dense(_) => Err(ModelError::BadInput(
                "dense weight has no raw blocks".into(),
            )),
        }
    }
}

/// The matmul that runs a linear layer.
enum Kernel {
    /// candle's quantized matmul (any ggml type).
    Candle(QMatMul),
    /// One of our batch-invariant AVX2 kernels (`q8_gemm`, `q4_gemm`, `f16_gemm`).
    Packed(PackedLinear),
}

/// `y = x Wᵀ` for `x` of shape `(rows, in_features)`.
pub struct Linear {
    kernel: Kernel,
    dtype: GgmlDType,
    out_features: usize,
    in_features: usize,
}

impl Linear {
    /// Converts one weight (`(out, in)`, read on the CPU) to the chosen type, for the forward
    /// `kind` on `device`.
    pub fn convert(
        w: RawWeight,
        want: WeightsDtype,
        device: &Device,
        kind: ForwardKind,
    ) -> Result<Self> {
        Self::fuse(vec![w], want, device, kind)
    }

    /// Stacks several weights with the same input size along the output dimension and converts
    /// them: one matmul then computes all of them (q/k/v, gate/up). Each output column is
    /// computed exactly as it would be alone.
    pub fn fuse(
        parts: Vec<RawWeight>,
        want: WeightsDtype,
        device: &Device,
        kind: ForwardKind,
    ) -> Result<Self> {
        let host = Device::Cpu;
        let mut in_features = None;
        let mut out_features = 0;
        for p in &parts {
            let (o, i) = p.dims2()?;
            if *in_features.get_or_insert(i) != i {
                return Err(ModelError::BadConfig(format!(
                    "fused weights disagree on input size ({i} vs {})",
                    in_features.unwrap_or(0)
                )));
            }
            out_features += o;
        }
        let in_features =
            in_features.ok_or_else(|| ModelError::BadInput("no weights to fuse".into()))?;
        let targets: Vec<GgmlDType> = parts
            .iter()
            .map(|p| want.target(p.src_dtype(), in_features))
            .collect();
        let target = targets[0];
        if targets.iter().any(|&t| t != target) {
            return Err(ModelError::Unsupported(format!(
                "fused weights have different types {targets:?}; convert them with --weights-dtype"
            )));
        }
        let all_quantized_as_is = parts
            .iter()
            .all(|p| matches!(p, RawWeight::Quantized(q) if q.dtype() == target));
        let qtensor = if all_quantized_as_is {
            // Same type as stored: concatenate the blocks so no requantization loses anything.
            let mut bytes = Vec::new();
            for p in &parts {
                bytes.extend_from_slice(&p.raw_bytes()?);
            }
            qtensor_from_ggml(target, &bytes, vec![out_features, in_features], &host)?
        } else {
            let dense: Vec<Tensor> = parts
                .iter()
                .map(|p| p.dequantize(&host))
                .collect::<Result<_>>()?;
            let stacked = if dense.len() == 1 {
                dense.into_iter().next().expect("one part")
            } else {
                Tensor::cat(&dense, 0)?
            };
            QTensor::quantize(&stacked, target)?
        };
        if kind == ForwardKind::Tensor {
            return Self::on_device(qtensor, target, device, out_features, in_features);
        }
        let packed: Option<Arc<dyn PackedWeight>> = match target {
            GgmlDType::Q8_0 if q8_gemm::available() => {
                PackedQ8::from_q8_0_bytes(&qtensor.data()?, out_features, in_features)
                    .map(|p| Arc::new(p) as _)
            }
            GgmlDType::Q4_0 | GgmlDType::Q4_1 if q4_gemm::available() => {
                let format = if target == GgmlDType::Q4_0 {
                    Q4Format::Q4_0
                } else {
                    Q4Format::Q4_1
                };
                PackedQ4::from_gguf_bytes(format, &qtensor.data()?, out_features, in_features)
                    .map(|p| Arc::new(p) as _)
            }
            GgmlDType::F16 if f16_gemm::available() => {
                PackedF16::from_f16_bytes(&qtensor.data()?, out_features, in_features)
                    .map(|p| Arc::new(p) as _)
            }
            _ => None,
        };
        let kernel = match packed {
            Some(p) => Kernel::Packed(PackedLinear(p)),
            // The QTensor variant is built directly: `QMatMul::from_qtensor` would turn f32/f16
            // weights into gemm matmuls, which are not batch-invariant.
            None => Kernel::Candle(QMatMul::QTensor(Arc::new(qtensor))),
        };
        Ok(Self {
            kernel,
            dtype: target,
            out_features,
            in_features,
        })
    }

    /// The tensor backend's layer: the weight moved to `device` as it is. On the CPU it stays a
    /// `QTensor` (row-wise dot products, batch-invariant like the own kernels); on a GPU, float
    /// types become dense tensors for its BLAS and quantized ones use candle's kernels.
    fn on_device(
        qtensor: QTensor,
        target: GgmlDType,
        device: &Device,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        let kernel = if device.is_cpu() {
            QMatMul::QTensor(Arc::new(qtensor))
        } else {
            let moved = qtensor_from_ggml(
                target,
                &qtensor.data()?,
                vec![out_features, in_features],
                device,
            )?;
            QMatMul::from_qtensor(moved)?
        };
        Ok(Self {
            kernel: Kernel::Candle(kernel),
            dtype: target,
            out_features,
            in_features,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match &self.kernel {
            Kernel::Candle(q) => q.forward(x)?,
            Kernel::Packed(p) => x.apply_op1_no_bwd(p)?,
        })
    }

    /// [`Self::forward`] on `m` host rows into `dst`: straight into the packed kernel where
    /// there is one (no tensor around the input or the output), else through candle. `dst` is
    /// resized to the output and keeps its memory: the kernel writes every element, so what a
    /// forward's buffers already hold is not cleared.
    pub fn forward_rows_into(&self, x: &[f32], m: usize, dst: &mut Vec<f32>) -> Result<()> {
        let n = m * self.out_features;
        if dst.len() < n {
            dst.resize(n, 0.0);
        }
        dst.truncate(n);
        match &self.kernel {
            Kernel::Packed(p) => p.0.matmul(x, m, dst),
            Kernel::Candle(_) => {
                let t = Tensor::from_slice(x, (m, self.in_features), &Device::Cpu)?;
                dst.copy_from_slice(&self.forward(&t)?.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        Ok(())
    }

    /// Which kernel runs this layer, for reporting.
    pub fn kernel_name(&self) -> &'static str {
        match &self.kernel {
            Kernel::Candle(_) => "candle",
            Kernel::Packed(p) => p.0.kernel_name(),
        }
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// Bytes of the weight in its ggml type: what a forward must at least stream from memory.
    pub fn weight_bytes(&self) -> usize {
        self.out_features * self.in_features / self.dtype.block_size() * self.dtype.type_size()
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }
}

#[cfg(test)]
mod tests {
    use super::{GgmlDType, WeightsDtype};

    #[test]
    fn auto_keeps_quantized_weights_and_converts_float_ones_to_q8_0() {
        let auto: WeightsDtype = "auto".parse().unwrap();
        assert_eq!(auto, WeightsDtype::Auto);
        for q in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K] {
            assert_eq!(auto.target(q, 768), q);
        }
        for f in [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16] {
            assert_eq!(auto.target(f, 768), GgmlDType::Q8_0);
        }
        // Rows that no 32-value block fits stay f32, as for an explicit q8_0.
        assert_eq!(auto.target(GgmlDType::F16, 40), GgmlDType::F32);
        assert_eq!(
            WeightsDtype::AsIs.target(GgmlDType::F16, 576),
            GgmlDType::F16
        );
    }
}
