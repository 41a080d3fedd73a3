//! Linear layers and the weight types they can be converted to at load time.
//!
//! Q8_0, Q4_0, f16 and f32 weights run on our own batch-invariant AVX2 kernels (`q8_gemm`,
//! `q4_gemm`, `float_gemm`) where the CPU has them. Every other type is held as a candle `QTensor`
//! (bf16 included) and multiplied with candle's CPU quantized matmul: that kernel quantizes
//! each activation row on its own and computes each (row, column) dot product with the same code
//! whatever the row count. Either way a token's output does not depend on how many tokens share the pass (batch
//! invariance). Dense weights are deliberately *not* turned into gemm matmuls, whose blocking
//! changes with shape.
//!
//! The tensor backend (`tensor_forward`) holds every weight as a candle `QMatMul` on its device:
//! quantized types through candle's quantized matmul; on a GPU, float types become dense
//! tensors multiplied by its BLAS.

use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::model::decoder::device::ForwardKind;
pub use crate::model::decoder::weights_dtype::WeightsDtype;
use crate::model::kernels::float_gemm::{self, FloatElem, PackedFloat};
use crate::model::kernels::kquant_gemm::{self, KFormat, PackedK};
use crate::model::kernels::packed_gemm::{PackedLinear, PackedWeight};
use crate::model::kernels::q4_gemm::{self, PackedQ4, Q4Format};
use crate::model::kernels::q8_gemm::{self, PackedQ8};
pub use crate::model::load::raw_weight::RawWeight;
use crate::model::{ModelError, Result};

/// The matmul that runs a linear layer.
enum Kernel {
    /// candle's quantized matmul (any ggml type).
    Candle(QMatMul),
    /// One of our batch-invariant AVX2 kernels (`q8_gemm`, `q4_gemm`, `float_gemm`, ...).
    Packed(PackedLinear),
    /// The runs of a fused projection whose parts differ in type, each on its own kernel,
    /// their outputs side by side in this order.
    Split(Vec<Linear>),
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
        if targets.iter().any(|&t| t != targets[0]) {
            return Self::split(parts, &targets, want, device, kind, in_features);
        }
        let qtensor = Self::stacked(&parts, targets[0], out_features, in_features)?;
        Self::packed(qtensor, targets[0], device, kind, out_features, in_features)
    }

    /// A fused projection whose parts end up as different types (a llama.cpp `Q4_K_M` file
    /// keeps v and down at higher precision than q, k, gate and up): each run of neighbouring
    /// parts of one type is fused on its own kernel, and their outputs sit side by side, so no
    /// weight is re-rounded to make the types agree.
    fn split(
        parts: Vec<RawWeight>,
        targets: &[GgmlDType],
        want: WeightsDtype,
        device: &Device,
        kind: ForwardKind,
        in_features: usize,
    ) -> Result<Self> {
        let mut runs: Vec<Linear> = Vec::new();
        let mut run: Vec<RawWeight> = Vec::new();
        for (i, part) in parts.into_iter().enumerate() {
            run.push(part);
            if targets.get(i + 1) != Some(&targets[i]) {
                runs.push(Self::fuse(std::mem::take(&mut run), want, device, kind)?);
            }
        }
        Ok(Self {
            out_features: runs.iter().map(|r| r.out_features).sum(),
            dtype: targets[0],
            kernel: Kernel::Split(runs),
            in_features,
        })
    }

    /// The parts (all converting to `target`) stacked into one `(out, in)` quantized tensor.
    fn stacked(
        parts: &[RawWeight],
        target: GgmlDType,
        out_features: usize,
        in_features: usize,
    ) -> Result<QTensor> {
        let host = Device::Cpu;
        let all_quantized_as_is = parts
            .iter()
            .all(|p| matches!(p, RawWeight::Quantized(q) if q.dtype() == target));
        Ok(if all_quantized_as_is {
            // Same type as stored: concatenate the blocks so no requantization loses anything.
            let mut bytes = Vec::new();
            for p in parts {
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
        })
    }

    /// A uniform weight on the kernel that runs it best: one of ours where the CPU and the
    /// type allow, else candle's.
    fn packed(
        qtensor: QTensor,
        target: GgmlDType,
        device: &Device,
        kind: ForwardKind,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self> {
        if kind == ForwardKind::Tensor {
            return Self::on_device(qtensor, target, device, out_features, in_features);
        }
        let packed: Option<Arc<dyn PackedWeight>> = match target {
            GgmlDType::Q8_0 if q8_gemm::available() => {
                PackedQ8::from_q8_0_bytes(&qtensor.data()?, out_features, in_features)
                    .map(|p| Arc::new(p) as _)
            }
            GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1
                if q4_gemm::available() =>
            {
                let format = match target {
                    GgmlDType::Q4_0 => Q4Format::Q4_0,
                    GgmlDType::Q4_1 => Q4Format::Q4_1,
                    GgmlDType::Q5_0 => Q4Format::Q5_0,
                    _ => Q4Format::Q5_1,
                };
                PackedQ4::from_gguf_bytes(format, &qtensor.data()?, out_features, in_features)
                    .map(|p| Arc::new(p) as _)
            }
            GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K if kquant_gemm::available() => {
                let format = match target {
                    GgmlDType::Q4K => KFormat::Q4K,
                    GgmlDType::Q5K => KFormat::Q5K,
                    _ => KFormat::Q6K,
                };
                PackedK::from_gguf_bytes(format, &qtensor.data()?, out_features, in_features)
                    .map(|p| Arc::new(p) as _)
            }
            GgmlDType::F16 | GgmlDType::F32 if float_gemm::available() => {
                let elem = match target {
                    GgmlDType::F16 => FloatElem::F16,
                    _ => FloatElem::F32,
                };
                PackedFloat::from_le_bytes(elem, &qtensor.data()?, out_features, in_features)
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
            Kernel::Split(runs) => {
                let outs: Vec<Tensor> = runs.iter().map(|r| r.forward(x)).collect::<Result<_>>()?;
                Tensor::cat(&outs, x.rank() - 1)?
            }
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
            Kernel::Split(runs) => self.split_rows_into(runs, x, m, dst)?,
        }
        Ok(())
    }

    /// Each run's output for the `m` rows, placed at its columns of `dst`; the runs' outputs
    /// pass through memory the calling thread keeps across calls.
    fn split_rows_into(&self, runs: &[Linear], x: &[f32], m: usize, dst: &mut [f32]) -> Result<()> {
        thread_local! {
            static PART: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        PART.with(|part| {
            let mut fresh = Vec::new();
            // A run is never itself split, so the thread's buffer is free; fresh memory else.
            let mut held = part.try_borrow_mut();
            let part = match held.as_deref_mut() {
                Ok(p) => p,
                Err(_) => &mut fresh,
            };
            let mut col = 0;
            for run in runs {
                run.forward_rows_into(x, m, part)?;
                let n = run.out_features;
                for (r, row) in part.chunks_exact(n).enumerate() {
                    dst[r * self.out_features + col..][..n].copy_from_slice(row);
                }
                col += n;
            }
            Ok(())
        })
    }

    /// Each uniform part of this layer (the layer itself unless a fused projection's parts
    /// differ in type): its ggml type and the kernel that runs it (`"candle"` for candle's
    /// generic quantized matmul), for reports and the start-up warning.
    pub fn parts(&self) -> Vec<(GgmlDType, &'static str)> {
        match &self.kernel {
            Kernel::Candle(_) => vec![(self.dtype, "candle")],
            Kernel::Packed(p) => vec![(self.dtype, p.0.kernel_name())],
            Kernel::Split(runs) => runs.iter().flat_map(|r| r.parts()).collect(),
        }
    }

    /// The ggml types of the layer's weights, in their order.
    pub fn dtypes(&self) -> Vec<GgmlDType> {
        self.parts().into_iter().map(|(t, _)| t).collect()
    }

    /// Bytes of the weight in its ggml types (or fewer, where the kernel packs it smaller):
    /// what a forward must at least stream from memory.
    pub fn weight_bytes(&self) -> usize {
        let typed = || {
            self.out_features * self.in_features / self.dtype.block_size() * self.dtype.type_size()
        };
        match &self.kernel {
            Kernel::Split(runs) => runs.iter().map(|r| r.weight_bytes()).sum(),
            Kernel::Packed(p) => p.0.packed_bytes().unwrap_or_else(typed),
            Kernel::Candle(_) => typed(),
        }
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
    use super::*;

    fn quantized(seed: u64, rows: usize, cols: usize, dtype: GgmlDType) -> RawWeight {
        let mut state = seed;
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        let t = Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap();
        RawWeight::Quantized(QTensor::quantize(&t, dtype).unwrap())
    }

    fn own(w: RawWeight) -> Linear {
        Linear::convert(w, WeightsDtype::AsIs, &Device::Cpu, ForwardKind::Own).unwrap()
    }

    /// A fused projection whose parts differ in type (a `Q4_K_M` file's q, k and v) keeps each
    /// part's type, and each of its output columns has the bits that part gives alone, on the
    /// host rows and through tensors.
    #[test]
    fn parts_of_different_types_run_side_by_side_with_their_own_bits() {
        let (k, m) = (512usize, 5usize);
        let parts = || {
            vec![
                quantized(1, 48, k, GgmlDType::Q4K),
                quantized(2, 16, k, GgmlDType::Q4K),
                quantized(3, 16, k, GgmlDType::Q6K),
            ]
        };
        let fused =
            Linear::fuse(parts(), WeightsDtype::AsIs, &Device::Cpu, ForwardKind::Own).unwrap();
        assert_eq!(fused.out_features(), 80);
        assert_eq!(fused.dtypes(), vec![GgmlDType::Q4K, GgmlDType::Q6K]);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let mut out = Vec::new();
        fused.forward_rows_into(&x, m, &mut out).unwrap();
        let tensor = fused
            .forward(&Tensor::from_slice(&x, (m, k), &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(out, tensor);
        let mut col = 0;
        for part in parts() {
            let alone = own(part);
            let mut want = Vec::new();
            alone.forward_rows_into(&x, m, &mut want).unwrap();
            let n = alone.out_features();
            for r in 0..m {
                assert_eq!(out[r * 80 + col..][..n], want[r * n..][..n], "row {r}");
            }
            col += n;
        }
        assert_eq!(
            fused.weight_bytes(),
            64 * 2 * GgmlDType::Q4K.type_size() + 16 * 2 * GgmlDType::Q6K.type_size()
        );
    }

    /// A type no own kernel runs (Q3_K) loads on candle's quantized matmul and says so
    /// through `parts`, with the product of its exact weights.
    #[test]
    fn a_type_without_an_own_kernel_runs_on_candles_matmul() {
        let (n, k) = (8usize, 256usize);
        let w = quantized(4, n, k, GgmlDType::Q3K);
        let values: Vec<f32> = match &w {
            RawWeight::Quantized(q) => q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap(),
            RawWeight::Dense(_) => unreachable!(),
        };
        let lin = own(w);
        assert_eq!(lin.parts(), vec![(GgmlDType::Q3K, "candle")]);
        let x: Vec<f32> = (0..k).map(|i| (i % 7) as f32 / 7.0 - 0.5).collect();
        let mut out = Vec::new();
        lin.forward_rows_into(&x, 1, &mut out).unwrap();
        for (c, o) in out.iter().enumerate() {
            let exact: f32 = (0..k).map(|i| x[i] * values[c * k + i]).sum();
            assert!((o - exact).abs() < 0.1, "column {c}: {o} vs {exact}");
        }
    }
}
