//! The glue between candle and our own CPU matmul kernels (`q8_gemm`, `q4_gemm`, `float_gemm`).
//!
//! Why it exists: candle runs f16/Q8_0 weights one (row, column) dot product at a time, so a
//! multi-token forward (prefill, speculative verification) re-reads every weight once per token.
//! Our kernels repack weights at load time so one weight load serves several activation rows,
//! and stay batch-invariant: every output element is computed by the same sequence of
//! operations whatever the number of rows. This module holds what they share: the weight trait,
//! and the candle custom op that calls them.

use std::sync::Arc;

use candle_core::{CpuStorage, Layout, Shape};

/// A weight `(n, k)` repacked for one of our kernels.
pub trait PackedWeight: Send + Sync {
    /// Output features (`n`).
    fn out_features(&self) -> usize;
    /// Input features (`k`).
    fn in_features(&self) -> usize;
    /// `dst (m, n) = x (m, k) · Wᵀ`.
    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]);
    /// The kernel's name, for reports.
    fn kernel_name(&self) -> &'static str;
    /// Bytes the packed weight holds where they are fewer than its ggml type's (4-bit E2M1
    /// codes of MXFP4 experts read as Q5_0): what a forward streams.
    fn packed_bytes(&self) -> Option<usize> {
        None
    }
}

/// A packed weight applied to candle tensors as a custom op.
#[derive(Clone)]
pub struct PackedLinear(pub Arc<dyn PackedWeight>);

impl candle_core::CustomOp1 for PackedLinear {
    fn name(&self) -> &'static str {
        self.0.kernel_name()
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if !layout.is_contiguous() {
            candle_core::bail!("{} input must be contiguous", self.name())
        }
        let (n, k) = (self.0.out_features(), self.0.in_features());
        let dims = layout.shape().dims();
        let cols = *dims.last().unwrap_or(&0);
        if cols != k {
            candle_core::bail!(
                "{}: input has {cols} columns, weight expects {k}",
                self.name()
            )
        }
        let m = layout.shape().elem_count() / k;
        let x = &storage.as_slice::<f32>()?[layout.start_offset()..layout.start_offset() + m * k];
        let mut dst = vec![0f32; m * n];
        self.0.matmul(x, m, &mut dst);
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank >= 1") = n;
        Ok((CpuStorage::F32(dst), Shape::from(out_dims)))
    }
}

/// Whether an x86 CPU feature set is present and the kernel is not switched off by `env_off`
/// or by `TANDEM_DISABLE_AVX2` (any non-empty value other than `0`), which runs every kernel
/// as on a CPU without AVX2: candle's portable matmuls and scalar attention.
pub fn enabled(env_off: &str, has_features: impl FnOnce() -> bool) -> bool {
    if switched_off(env_off) || switched_off("TANDEM_DISABLE_AVX2") {
        return false;
    }
    has_features()
}

fn switched_off(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether this CPU has AVX2, FMA and F16C, what the 8-bit and 4-bit kernels need (their
/// tiles keep scales in f16).
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// What the kernels' tests share: random inputs, and the comparison with candle's quantized
/// matmul.
#[cfg(test)]
pub(super) mod test_support {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// `n` values uniform in [-1, 1) from a seeded generator.
    pub fn random(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = crate::sampling::SeededRng::new(seed);
        (0..n).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect()
    }

    /// Row counts whose chunks take every const row count of every tile kernel (1 to 12 on
    /// AVX-512, 1 to 4 on 256-bit kernels) and several chunks.
    pub const ROW_COUNTS: [usize; 13] = [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 25];

    /// Asserts that `run(x, m, dst, isa)` gives every row the bits it has alone on AVX2, for
    /// each of [`ROW_COUNTS`] and each instruction set this CPU has: batch invariance and the
    /// same bits on every path.
    pub fn assert_rows_and_isas_agree(
        n: usize,
        k: usize,
        run: impl Fn(&[f32], usize, &mut [f32], crate::model::kernels::tile_driver::DotIsa),
    ) {
        use crate::model::kernels::tile_driver::DotIsa;
        for m in ROW_COUNTS {
            let x = random(100 + m as u64, m * k);
            let alone: Vec<Vec<f32>> = (0..m)
                .map(|r| {
                    let mut one = vec![0f32; n];
                    run(&x[r * k..(r + 1) * k], 1, &mut one, DotIsa::Avx2);
                    one
                })
                .collect();
            for isa in DotIsa::available() {
                let mut out = vec![0f32; m * n];
                run(&x, m, &mut out, isa);
                for (r, one) in alone.iter().enumerate() {
                    assert!(
                        out[r * n..(r + 1) * n] == one[..],
                        "{isa:?}: row {r} of {m} differs from the row alone on AVX2"
                    );
                }
            }
        }
    }

    /// candle's dequantization of `w` quantized to `dtype`, with the raw bytes.
    pub fn quantized(w: &Tensor, dtype: GgmlDType) -> (Vec<u8>, Vec<f32>) {
        let qt = QTensor::quantize(w, dtype).unwrap();
        let values = qt
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        (qt.data().unwrap().to_vec(), values)
    }

    /// The largest absolute errors of `ours` (`x (m, k)` times the `(n, k)` weight `w`
    /// quantized to `dtype`) and of candle's quantized matmul on the same weights, both against
    /// the exact product with the dequantized weights.
    pub fn errors_against_candle(
        w: &Tensor,
        dtype: GgmlDType,
        x: &[f32],
        m: usize,
        ours: &[f32],
    ) -> (f64, f64) {
        let (n, k) = w.dims2().unwrap();
        let (_, wd) = quantized(w, dtype);
        let qt = QTensor::quantize(w, dtype).unwrap();
        let xt = Tensor::from_vec(x.to_vec(), (m, k), &Device::Cpu).unwrap();
        let theirs: Vec<f32> = QMatMul::QTensor(std::sync::Arc::new(qt))
            .forward(&xt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (mut err_ours, mut err_theirs) = (0f64, 0f64);
        for r in 0..m {
            for c in 0..n {
                let exact: f64 = (0..k)
                    .map(|i| x[r * k + i] as f64 * wd[c * k + i] as f64)
                    .sum();
                err_ours = err_ours.max((ours[r * n + c] as f64 - exact).abs());
                err_theirs = err_theirs.max((theirs[r * n + c] as f64 - exact).abs());
            }
        }
        (err_ours, err_theirs)
    }
}
