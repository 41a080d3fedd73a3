//! The forward's elementwise work on host slices: the MLP's SiLU gate and the softmax
//! exponentials of sampling, with one vectorized exponential ([`crate::model::kernels::fast_exp`]) instead of
//! libm's per element.
//!
//! Why it exists: `forward-bench --ops` showed SiLU and the residual adds, a few thousand
//! elements a layer, costing 14% of what a verified token adds to a forward, and the softmax
//! over a 49,152-token vocabulary costing 0.3 ms a row, most of it `expf` one call at a time.
//! Each function computes every element with the same scalar operations on every path, so a
//! value's result does not depend on its batch or its place in a row.

use crate::model::kernels::fast_exp::{softmax_exp, vector_available};

/// `silu(g) · u`, with `silu(g) = g · σ(g)` and `σ` from `e = exp(−|g|)` (never overflows):
/// `g / (1 + e)` for `g ≥ 0`, `g · e / (1 + e)` below.
#[inline]
pub fn silu_times(g: f32, u: f32) -> f32 {
    let e = softmax_exp(-g.abs());
    let d = 1.0 + e;
    let s = if g >= 0.0 { g / d } else { (g * e) / d };
    s * u
}

/// `√(2/π)`, doubled: `tanh(y) = 2σ(2y) − 1`.
const GELU_TWO_C: f32 = 2.0 * 0.797_884_6;
const GELU_CUBIC: f32 = 0.044715;

/// `gelu_tanh(g) · u`: `0.5 · g · (1 + tanh(y))` with `y = √(2/π) · (g + 0.044715 · g³)`,
/// computed as `g · σ(2y)` (the same function) with `σ` as in [`silu_times`].
#[inline]
pub fn gelu_tanh_times(g: f32, u: f32) -> f32 {
    let z = GELU_TWO_C * (g + GELU_CUBIC * g * g * g);
    let e = softmax_exp(-z.abs());
    let d = 1.0 + e;
    let s = if z >= 0.0 { g / d } else { (g * e) / d };
    s * u
}

/// `out[i] = gelu_tanh(gate[i]) · up[i]` ([`gelu_tanh_times`]) for every element.
pub fn gelu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if vector_available() {
        // SAFETY: AVX2 and FMA were checked; every access is inside the three slices of
        // equal length (asserted above).
        done = unsafe { gelu_mul_avx2(gate, up, out) };
    }
    for i in done..out.len() {
        out[i] = gelu_tanh_times(gate[i], up[i]);
    }
}

/// Eight elements at a time of [`gelu_mul`], operation for operation (separate multiplies
/// and adds, as the scalar code rounds them); returns how many it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let full = out.len() / 8 * 8;
    let sign = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let (two_c, cubic) = (_mm256_set1_ps(GELU_TWO_C), _mm256_set1_ps(GELU_CUBIC));
    for i in (0..full).step_by(8) {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        let g3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(cubic, g), g), g);
        let z = _mm256_mul_ps(two_c, _mm256_add_ps(g, g3));
        let e = crate::model::kernels::fast_exp::exp8(_mm256_or_ps(z, sign));
        let d = _mm256_add_ps(one, e);
        let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(z, zero);
        let s = _mm256_div_ps(_mm256_blendv_ps(_mm256_mul_ps(g, e), g, ge), d);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
    }
    full
}

/// `out[i] = silu(gate[i]) · up[i]` ([`silu_times`]) for every element.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if vector_available() {
        // SAFETY: AVX2 and FMA were checked; every access is inside the three slices of
        // equal length (asserted above).
        done = unsafe { silu_mul_avx2(gate, up, out) };
    }
    for i in done..out.len() {
        out[i] = silu_times(gate[i], up[i]);
    }
}

/// Eight elements at a time of [`silu_mul`], operation for operation; returns how many it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let full = out.len() / 8 * 8;
    let sign = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    for i in (0..full).step_by(8) {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        // −|g|: the sign bit set.
        let e = crate::model::kernels::fast_exp::exp8(_mm256_or_ps(g, sign));
        let d = _mm256_add_ps(one, e);
        // g >= 0 divides g, else g · e (a NaN g compares false and takes g · e, NaN too): the
        // numerator is picked before the one division, which gives the bits of dividing each.
        let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(g, zero);
        let s = _mm256_div_ps(_mm256_blendv_ps(_mm256_mul_ps(g, e), g, ge), d);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
    }
    full
}

/// `x ← e^x` for every element, each at most 0 (a logit minus its row's maximum, scaled).
pub fn exp_nonpositive(xs: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if vector_available() {
        // SAFETY: AVX2 and FMA were checked; every access is inside `xs`.
        done = unsafe { exp_nonpositive_avx2(xs) };
    }
    for x in &mut xs[done..] {
        *x = softmax_exp(*x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_nonpositive_avx2(xs: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let full = xs.len() / 8 * 8;
    let p = xs.as_mut_ptr();
    for i in (0..full).step_by(8) {
        _mm256_storeu_ps(
            p.add(i),
            crate::model::kernels::fast_exp::exp8(_mm256_loadu_ps(p.add(i))),
        );
    }
    full
}

/// `out ← e^((v − max) / t)` for every logit `v` of a row, exactly 0 where `v` is −inf (a
/// masked token): a softmax's numerators at temperature `t`, `max` the row's largest logit.
/// One pass where subtracting, dividing, [`exp_nonpositive`] and zeroing the masked tokens took
/// four (and a fill before them); bit for bit what those give, since each lane runs the same
/// IEEE operations and [`exp_nonpositive`]'s vector and scalar parts split the row at the same
/// place. On Gemma 3's 262,144-token rows the passes were most of what sampling a row cost.
pub fn softmax_numerators(logits: &[f32], max: f32, t: f32, out: &mut Vec<f32>) {
    out.clear();
    out.reserve(logits.len());
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if vector_available() {
        // SAFETY: AVX2 and FMA were checked; `out` holds room for every logit, and the first
        // `done` are written before the length is set.
        unsafe {
            done = softmax_numerators_avx2(logits, max, t, out.as_mut_ptr());
            out.set_len(done);
        }
    }
    out.extend(logits[done..].iter().map(|&v| {
        if v == f32::NEG_INFINITY {
            0.0
        } else {
            softmax_exp((v - max) / t)
        }
    }));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_numerators_avx2(logits: &[f32], max: f32, t: f32, out: *mut f32) -> usize {
    use std::arch::x86_64::*;
    let full = logits.len() / 8 * 8;
    let (m, tv) = (_mm256_set1_ps(max), _mm256_set1_ps(t));
    let (masked, zero) = (_mm256_set1_ps(f32::NEG_INFINITY), _mm256_setzero_ps());
    for i in (0..full).step_by(8) {
        let v = _mm256_loadu_ps(logits.as_ptr().add(i));
        let e = crate::model::kernels::fast_exp::exp8(_mm256_div_ps(_mm256_sub_ps(v, m), tv));
        let is_masked = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, masked);
        _mm256_storeu_ps(out.add(i), _mm256_blendv_ps(e, zero, is_masked));
    }
    full
}

/// `silu(gate) · up` of a fused gate/up projection's output `(rows, 2 · inter)` (gate first):
/// on the CPU with f32 rows by [`silu_mul`] straight from the tensor's memory, one output
/// allocation and no strided copies; elsewhere (a GPU) by candle's own operations.
pub(crate) fn silu_gate(gu: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    if gu.device().is_cpu() && gu.dtype() == candle_core::DType::F32 && gu.is_contiguous() {
        return gu.apply_op1_no_bwd(&SiluGate);
    }
    let inter = gu.dim(1)? / 2;
    candle_nn::ops::silu(&gu.narrow(1, 0, inter)?)? * gu.narrow(1, inter, inter)?
}

/// [`silu_gate`] on host rows of `2 · inter` values (gate first), into `out` (one row of
/// `inter` values each). Several rows are split over the compute threads: a verification's
/// 9 rows were a visible share of the serial time its forward spent while the other thread
/// waited, and each row is computed alone either way (the same bits).
pub(crate) fn silu_gate_rows(gu: &[f32], inter: usize, out: &mut [f32]) {
    gate_rows(gu, inter, out, silu_mul)
}

/// `gate_mul(gate, up, out row)` for every row of `2 · inter` values, rows over the threads.
fn gate_rows(gu: &[f32], inter: usize, out: &mut [f32], gate_mul: fn(&[f32], &[f32], &mut [f32])) {
    assert!(inter > 0 && gu.len() == 2 * out.len() && out.len().is_multiple_of(inter));
    let rows = out.len() / inter;
    let out_ptr = out.as_mut_ptr() as usize;
    let row = |r: usize| {
        let src = &gu[r * 2 * inter..][..2 * inter];
        // SAFETY: row r owns out[r · inter..][..inter], inside `out`; each row runs once.
        let dst =
            unsafe { std::slice::from_raw_parts_mut((out_ptr as *mut f32).add(r * inter), inter) };
        gate_mul(&src[..inter], &src[inter..], dst);
    };
    if rows < 2 {
        (0..rows).for_each(row);
    } else {
        crate::model::kernels::parallel::for_each_unit(rows, row);
    }
}

/// [`silu_gate_rows`] with the GELU-tanh gate ([`gelu_mul`]): Gemma's MLP.
pub(crate) fn gelu_gate_rows(gu: &[f32], inter: usize, out: &mut [f32]) {
    gate_rows(gu, inter, out, gelu_mul)
}

/// `bias` (a contiguous f32 tensor on the CPU) added to every host row of `rows`, each
/// `bias.len()` values: the projections' biases.
pub(crate) fn add_bias_rows(
    rows: &mut [f32],
    bias: &candle_core::Tensor,
) -> candle_core::Result<()> {
    crate::model::kernels::rms_norm::with_host(bias, |b| {
        for r in rows.chunks_exact_mut(b.len()) {
            r.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
    })
}

/// gpt-oss's SwiGLU: the sigmoid's slope (`swiglu_alpha`) and the clamp on gate and up
/// (`swiglu_limit`).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// gpt-oss's clamped SwiGLU for one row: `g = min(gate, 7)`,
/// `(clamp(up, ±7) + 1) · g · σ(1.702 · g)`, `σ` as in [`silu_times`].
pub fn swiglu_oai_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    use self::{SWIGLU_OAI_ALPHA as ALPHA, SWIGLU_OAI_LIMIT as LIMIT};
    assert!(gate.len() == up.len() && up.len() == out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let g = g.min(LIMIT);
        let z = ALPHA * g;
        let e = softmax_exp(-z.abs());
        let d = 1.0 + e;
        let s = if z >= 0.0 { g / d } else { (g * e) / d };
        *o = s * (u.clamp(-LIMIT, LIMIT) + 1.0);
    }
}

/// [`silu_gate_rows`] with gpt-oss's clamped SwiGLU ([`swiglu_oai_mul`]).
pub(crate) fn swiglu_oai_gate_rows(gu: &[f32], inter: usize, out: &mut [f32]) {
    gate_rows(gu, inter, out, swiglu_oai_mul)
}

struct SiluGate;

impl candle_core::CustomOp1 for SiluGate {
    fn name(&self) -> &'static str {
        "silu-gate"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (rows, width) = layout.shape().dims2()?;
        let (Some((start, end)), candle_core::CpuStorage::F32(data)) =
            (layout.contiguous_offsets(), storage)
        else {
            candle_core::bail!("silu-gate takes contiguous f32 rows");
        };
        let mut out = vec![0f32; rows * (width / 2)];
        silu_gate_rows(&data[start..end], width / 2, &mut out);
        Ok((candle_core::CpuStorage::F32(out), (rows, width / 2).into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values over the whole range SiLU sees, and its edges.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..4003).map(|i| (i as f32 - 2001.0) * 0.0173).collect();
        v.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            88.0,
            -88.0,
            150.0,
            -150.0,
            f32::MIN_POSITIVE,
        ]);
        v
    }

    #[test]
    fn silu_is_close_to_the_exact_one_and_the_same_bits_on_every_path() {
        let g = inputs();
        let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mut out = vec![0f32; g.len()];
        silu_mul(&g, &u, &mut out);
        for i in 0..g.len() {
            let scalar = silu_times(g[i], u[i]);
            assert_eq!(
                out[i].to_bits(),
                scalar.to_bits(),
                "element {i}: g = {}",
                g[i]
            );
            let (gx, ux) = (g[i] as f64, u[i] as f64);
            let exact = gx / (1.0 + (-gx).exp()) * ux;
            let err = (out[i] as f64 - exact).abs();
            // (Below g = -87 the exponential clamps: a SiLU of about -1e-36 instead of less.)
            assert!(
                err <= 4e-7 * exact.abs() + 1e-35,
                "g = {}: {} vs {exact}",
                g[i],
                out[i]
            );
        }
        // Any offset into a row gives the same bits (the vector and the scalar tail agree).
        let mut shifted = vec![0f32; g.len() - 3];
        silu_mul(&g[3..], &u[3..], &mut shifted);
        assert_eq!(shifted, out[3..]);
        let mut nan = [0f32; 9];
        silu_mul(&[f32::NAN; 9], &[1.0; 9], &mut nan);
        assert!(nan.iter().all(|x| x.is_nan()));
    }

    #[test]
    fn swiglu_oai_clamps_gate_and_up_and_is_close_to_the_exact_one() {
        let g: Vec<f32> = inputs().into_iter().filter(|x| x.abs() < 40.0).collect();
        let u: Vec<f32> = (0..g.len())
            .map(|i| -12.0 + (i % 97) as f32 * 0.25)
            .collect();
        let mut out = vec![0f32; g.len()];
        swiglu_oai_mul(&g, &u, &mut out);
        for i in 0..g.len() {
            let gx = (g[i] as f64).min(7.0);
            let ux = (u[i] as f64).clamp(-7.0, 7.0);
            let exact = gx / (1.0 + (-1.702 * gx).exp()) * (ux + 1.0);
            let err = (out[i] as f64 - exact).abs();
            assert!(
                err <= 4e-6 * exact.abs() + 1e-30,
                "g = {}, u = {}: {} vs {exact}",
                g[i],
                u[i],
                out[i]
            );
        }
        // Past the limit neither input moves the output.
        let mut a = [0f32; 2];
        swiglu_oai_mul(&[7.0, 9.5], &[-7.0, -30.0], &mut a);
        assert_eq!(a[0].to_bits(), a[1].to_bits());
    }

    #[test]
    fn gelu_tanh_is_close_to_the_exact_one_and_the_same_bits_on_every_path() {
        let g: Vec<f32> = inputs().into_iter().filter(|x| x.abs() < 20.0).collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mut out = vec![0f32; g.len()];
        gelu_mul(&g, &u, &mut out);
        for i in 0..g.len() {
            let scalar = gelu_tanh_times(g[i], u[i]);
            assert_eq!(out[i].to_bits(), scalar.to_bits(), "g = {}", g[i]);
            // PyTorch's gelu(approximate="tanh") in f64, as x·σ(2y) (1 + tanh(y) cancels to
            // 0 in f64 where the value is 1e-30).
            let x = g[i] as f64;
            let y = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            let exact = x / (1.0 + (-2.0 * y).exp()) * u[i] as f64;
            let err = (out[i] as f64 - exact).abs();
            // exp(-|2y|) is as accurate as its f32 argument: relative error grows with |2y|.
            let tol = 4e-7 * (1.0 + 2.0 * y.abs()) * exact.abs() + 1e-35;
            assert!(err <= tol, "g = {}: {} vs {exact}", g[i], out[i]);
        }
        let mut shifted = vec![0f32; g.len() - 3];
        gelu_mul(&g[3..], &u[3..], &mut shifted);
        assert_eq!(shifted, out[3..]);
    }

    #[test]
    fn exponentials_are_the_scalar_bits_on_every_path() {
        let xs: Vec<f32> = inputs().into_iter().map(|x| -x.abs()).collect();
        let mut v = xs.clone();
        exp_nonpositive(&mut v);
        for (x, e) in xs.iter().zip(&v) {
            assert_eq!(e.to_bits(), softmax_exp(*x).to_bits(), "exp({x})");
        }
    }
    #[test]
    fn softmax_numerators_are_the_four_passes_bit_for_bit() {
        for n in [0usize, 1, 7, 8, 9, 63, 1000, 49_157] {
            let logits: Vec<f32> = (0..n)
                .map(|i| match i % 13 {
                    3 => f32::NEG_INFINITY,
                    5 => -1e30,
                    _ => ((i * 7919 % 2003) as f32 - 1001.0) * 0.037,
                })
                .collect();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for t in [1.0f32, 0.8, 0.3, 1.7, 1e-30] {
                let mut want: Vec<f32> = logits
                    .iter()
                    .map(|&v| if t == 1.0 { v - max } else { (v - max) / t })
                    .collect();
                exp_nonpositive(&mut want);
                for (p, &v) in want.iter_mut().zip(&logits) {
                    if v == f32::NEG_INFINITY {
                        *p = 0.0;
                    }
                }
                let mut got = vec![9.0; 3];
                softmax_numerators(&logits, max, t, &mut got);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{n} logits at t = {t}");
            }
        }
    }
}
