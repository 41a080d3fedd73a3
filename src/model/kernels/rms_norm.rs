//! RMS normalization of host rows with the sum of squares in 16 lanes.
//!
//! Why it exists: candle's CPU `rms_norm` sums a row's squares in one sequential chain, 576
//! dependent additions a row on SmolLM2, so the 61 norms of a forward cost 0.08 ms at one token
//! and 0.04 ms more for every verified token (`forward-bench --ops`), more than the rope, the
//! cache appends and the embedding together. Here element `i` of a row goes to lane `i mod 16`
//! (fused multiply-adds, whole blocks of 16), the lanes are added in a fixed tree, then the
//! remaining elements one by one: the same bits on every path and for every row whatever its
//! batch, and the chains are 16 times shorter. The elementwise part is candle's,
//! `x / rms · α`.

use candle_core::{CpuStorage, Layout, Shape, Tensor};

/// Lanes of the sum of squares.
const LANES: usize = 16;

/// `x / sqrt(mean(x²) + eps) · alpha` over the last dimension of `x`: this module's kernel for
/// f32 tensors on the CPU, candle's otherwise (other devices run their own).
pub fn rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    if x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && alpha.dtype() == candle_core::DType::F32
    {
        x.contiguous()?
            .apply_op2_no_bwd(&alpha.contiguous()?, &RmsNorm { eps })
    } else {
        candle_nn::ops::rms_norm(x, alpha, eps)
    }
}

struct RmsNorm {
    eps: f32,
}

impl candle_core::CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "lane-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (Some((a1, b1)), Some((a2, b2))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            candle_core::bail!("rms_norm: inputs must be contiguous")
        };
        let src = &s1.as_slice::<f32>()?[a1..b1];
        let alpha = &s2.as_slice::<f32>()?[a2..b2];
        let dim = *l1.shape().dims().last().unwrap_or(&0);
        if dim == 0 || alpha.len() != dim {
            candle_core::bail!("rms_norm: {} weights for rows of {dim}", alpha.len())
        }
        let mut dst = vec![0f32; src.len()];
        for (s, d) in src.chunks_exact(dim).zip(dst.chunks_exact_mut(dim)) {
            normalize_row(s, alpha, self.eps, d);
        }
        Ok((CpuStorage::F32(dst), l1.shape().clone()))
    }
}

/// One row: `dst = src / sqrt(Σ src² / n + eps) · alpha`.
pub fn normalize_row(src: &[f32], alpha: &[f32], eps: f32, dst: &mut [f32]) {
    let sum2 = sum_of_squares(src);
    let m = (sum2 / src.len() as f32 + eps).sqrt();
    for ((d, &s), &a) in dst.iter_mut().zip(src).zip(alpha) {
        *d = s / m * a;
    }
}

/// `Σ x²` in [`LANES`] lanes (see the module doc).
pub fn sum_of_squares(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::model::kernels::packed_gemm::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { sum_of_squares_fma(xs) };
    }
    sum_of_squares_portable(xs)
}

/// The same loop compiled with FMA instructions: `mul_add` becomes one `vfmadd` per lane
/// instead of a libm call, with the same result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_of_squares_fma(xs: &[f32]) -> f32 {
    sum_of_squares_portable(xs)
}

#[inline(always)]
fn sum_of_squares_portable(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let blocks = xs.chunks_exact(LANES);
    let rest = blocks.remainder();
    for block in blocks {
        for (l, &x) in lanes.iter_mut().zip(block) {
            *l = x.mul_add(x, *l);
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    rest.iter().fold(lanes[0], |s, &x| x.mul_add(x, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::packed_gemm::test_support::random;
    use candle_core::Device;

    #[test]
    fn matches_candle_closely_and_each_row_alone() {
        // 37 values: two blocks of 16 and a remainder.
        let (rows, dim) = (5usize, 37usize);
        let x = random(11, rows * dim);
        let alpha = random(12, dim);
        let xt = Tensor::from_vec(x.clone(), (rows, dim), &Device::Cpu).unwrap();
        let at = Tensor::from_vec(alpha.clone(), dim, &Device::Cpu).unwrap();
        let ours: Vec<f32> = rms_norm(&xt, &at, 1e-5)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let theirs: Vec<f32> = candle_nn::ops::rms_norm(&xt, &at, 1e-5)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
        for r in 0..rows {
            let mut one = vec![0f32; dim];
            normalize_row(&x[r * dim..(r + 1) * dim], &alpha, 1e-5, &mut one);
            assert!(
                one[..] == ours[r * dim..(r + 1) * dim],
                "row {r} differs alone"
            );
        }
    }

    #[test]
    fn the_vector_and_portable_sums_agree_bit_for_bit() {
        for n in [1usize, 15, 16, 17, 576, 1000] {
            let x = random(n as u64, n);
            let exact: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let ours = sum_of_squares(&x);
            assert_eq!(ours.to_bits(), sum_of_squares_portable(&x).to_bits(), "{n}");
            assert!((ours as f64 - exact).abs() <= 1e-5 * exact.max(1.0), "{n}");
        }
    }
}
