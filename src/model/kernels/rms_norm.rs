//! RMS normalisation of rows, `x / sqrt(mean(x²) + eps) · w`, on host slices, alone or fused
//! with the residual add before it.
//!
//! Why it exists: candle's CPU norm sums a row's squares as one chain of dependent adds (576 of
//! them for the default model, ~0.5 µs a row), and a forward runs 61 norms per token:
//! `forward-bench --ops` put norms at a tenth of what a verified token adds to a forward. Here
//! the squares are summed in 16 lanes and the lanes folded in a fixed tree, with separate
//! multiplies and adds (never fused), so the compiler vectorizes the loop at any width and every
//! instruction set gives the same bits; each row is computed alone, so a token's result does not
//! depend on its batch.

/// Lanes of the sum of squares (element `i` of every 16-element block goes to lane `i mod 16`).
const LANES: usize = 16;

/// The factor a row is scaled by: `1 / sqrt(Σx² / n + eps)`, the squares summed as the module
/// doc says.
#[inline(always)]
fn inverse_rms(row: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let blocks = row.chunks_exact(LANES);
    let tail = blocks.remainder();
    for block in blocks {
        for (l, v) in lanes.iter_mut().zip(block) {
            *l += v * v;
        }
    }
    for (l, v) in lanes.iter_mut().zip(tail) {
        *l += v * v;
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    1.0 / (lanes[0] / row.len() as f32 + eps).sqrt()
}

#[inline(always)]
fn norm_rows_generic(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (row, dst) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let inv = inverse_rms(row, eps);
        for ((o, v), g) in dst.iter_mut().zip(row).zip(w) {
            *o = (v * inv) * g;
        }
    }
}

#[inline(always)]
fn add_norm_rows_generic(x: &mut [f32], add: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for ((row, a), dst) in x
        .chunks_exact_mut(n)
        .zip(add.chunks_exact(n))
        .zip(out.chunks_exact_mut(n))
    {
        for (v, a) in row.iter_mut().zip(a) {
            *v += a;
        }
        let inv = inverse_rms(row, eps);
        for ((o, v), g) in dst.iter_mut().zip(&*row).zip(w) {
            *o = (v * inv) * g;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn norm_rows_avx512(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    norm_rows_generic(x, w, eps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn norm_rows_avx2(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    norm_rows_generic(x, w, eps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_norm_rows_avx512(x: &mut [f32], add: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    add_norm_rows_generic(x, add, w, eps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_norm_rows_avx2(x: &mut [f32], add: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    add_norm_rows_generic(x, add, w, eps, out)
}

/// The widest vector level the loops may be compiled for (the same bits at every level).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Width {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

fn width() -> Width {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::model::kernels::packed_gemm::enabled;
        if enabled("TANDEM_DISABLE_AVX512", || {
            is_x86_feature_detected!("avx512f")
        }) {
            return Width::Avx512;
        }
        if enabled("TANDEM_DISABLE_AVX2", || is_x86_feature_detected!("avx2")) {
            return Width::Avx2;
        }
    }
    Width::Portable
}

fn check(x: usize, w: usize, out: usize) {
    assert!(
        w > 0 && x.is_multiple_of(w) && out == x,
        "rows of {w} values"
    );
}

/// `out = rms_norm(x) · w` for every row of `x` (rows of `w.len()` values).
pub fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    check(x.len(), w.len(), out.len());
    norm_rows_at(width(), x, w, eps, out)
}

fn norm_rows_at(width: Width, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    match width {
        Width::Portable => norm_rows_generic(x, w, eps, out),
        // SAFETY: `width()` checked the CPU feature.
        #[cfg(target_arch = "x86_64")]
        Width::Avx2 => unsafe { norm_rows_avx2(x, w, eps, out) },
        #[cfg(target_arch = "x86_64")]
        Width::Avx512 => unsafe { norm_rows_avx512(x, w, eps, out) },
    }
}

/// The residual add and the next norm in one pass: `x += add`, then `out = rms_norm(x) · w`,
/// row by row.
pub fn add_norm_rows(x: &mut [f32], add: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    check(x.len(), w.len(), out.len());
    assert_eq!(add.len(), x.len());
    add_norm_rows_at(width(), x, add, w, eps, out)
}

fn add_norm_rows_at(
    width: Width,
    x: &mut [f32],
    add: &[f32],
    w: &[f32],
    eps: f32,
    out: &mut [f32],
) {
    match width {
        Width::Portable => add_norm_rows_generic(x, add, w, eps, out),
        // SAFETY: `width()` checked the CPU feature.
        #[cfg(target_arch = "x86_64")]
        Width::Avx2 => unsafe { add_norm_rows_avx2(x, add, w, eps, out) },
        #[cfg(target_arch = "x86_64")]
        Width::Avx512 => unsafe { add_norm_rows_avx512(x, add, w, eps, out) },
    }
}

/// [`norm_rows`] on a tensor: on the host for contiguous f32 rows on the CPU, by candle's own
/// norm elsewhere (a GPU).
pub fn rms_norm(
    x: &candle_core::Tensor,
    w: &candle_core::Tensor,
    eps: f32,
) -> candle_core::Result<candle_core::Tensor> {
    if x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && w.dtype() == candle_core::DType::F32
    {
        return x
            .contiguous()?
            .apply_op2_no_bwd(&w.contiguous()?, &RowNorm(eps));
    }
    candle_nn::ops::rms_norm(x, w, eps)
}

/// Calls `f` with the values of a contiguous f32 tensor on the CPU, borrowed from its storage
/// (a norm's weight, read on every forward: no copy).
pub fn with_host<R>(
    t: &candle_core::Tensor,
    f: impl FnOnce(&[f32]) -> R,
) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) => {
            Ok(f(&v[a..b]))
        }
        _ => candle_core::bail!("expected contiguous f32 values on the CPU"),
    }
}

struct RowNorm(f32);

impl candle_core::CustomOp2 for RowNorm {
    fn name(&self) -> &'static str {
        "row-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &candle_core::CpuStorage,
        xl: &candle_core::Layout,
        ws: &candle_core::CpuStorage,
        wl: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (
            Some((xa, xb)),
            Some((wa, wb)),
            candle_core::CpuStorage::F32(x),
            candle_core::CpuStorage::F32(w),
        ) = (xl.contiguous_offsets(), wl.contiguous_offsets(), xs, ws)
        else {
            candle_core::bail!("row-norm takes contiguous f32 rows and weights");
        };
        let (x, w) = (&x[xa..xb], &w[wa..wb]);
        if w.is_empty() || !x.len().is_multiple_of(w.len()) {
            candle_core::bail!(
                "row-norm: rows of {} values, weight of {}",
                x.len(),
                w.len()
            );
        }
        let mut out = vec![0f32; x.len()];
        norm_rows(x, w, self.0, &mut out);
        Ok((candle_core::CpuStorage::F32(out), xl.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::packed_gemm::test_support::random;

    fn widths() -> Vec<Width> {
        let mut out = vec![Width::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                out.push(Width::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                out.push(Width::Avx512);
            }
        }
        out
    }

    #[test]
    fn every_width_gives_the_same_bits_and_rows_stand_alone() {
        // 576 values (the default model), and 70 (a tail past the last block of 16).
        for n in [576usize, 70] {
            let rows = 5;
            let x = random(11, rows * n);
            let w = random(12, n);
            let add = random(13, rows * n);
            let mut want = vec![0f32; rows * n];
            norm_rows_at(Width::Portable, &x, &w, 1e-5, &mut want);
            for width in widths() {
                let mut out = vec![0f32; rows * n];
                norm_rows_at(width, &x, &w, 1e-5, &mut out);
                assert_eq!(bits(&out), bits(&want), "{width:?}, n = {n}");
                // The fused add: the same bits as the add, then the norm.
                let (mut xs, mut fused) = (x.clone(), vec![0f32; rows * n]);
                add_norm_rows_at(width, &mut xs, &add, &w, 1e-5, &mut fused);
                let summed: Vec<f32> = x.iter().zip(&add).map(|(a, b)| a + b).collect();
                let mut apart = vec![0f32; rows * n];
                norm_rows_at(Width::Portable, &summed, &w, 1e-5, &mut apart);
                assert_eq!(bits(&xs), bits(&summed));
                assert_eq!(bits(&fused), bits(&apart), "{width:?}, n = {n}");
            }
            // A row normed alone is the same bits as in a batch.
            let mut alone = vec![0f32; n];
            norm_rows(&x[2 * n..3 * n], &w, 1e-5, &mut alone);
            assert_eq!(bits(&alone), bits(&want[2 * n..3 * n]));
        }
    }

    #[test]
    fn matches_the_definition_and_candles_norm() {
        let (rows, n) = (3usize, 576usize);
        let x = random(21, rows * n);
        let w = random(22, n);
        let xt =
            candle_core::Tensor::from_vec(x.clone(), (rows, n), &candle_core::Device::Cpu).unwrap();
        let wt = candle_core::Tensor::from_vec(w.clone(), n, &candle_core::Device::Cpu).unwrap();
        let ours: Vec<f32> = rms_norm(&xt, &wt, 1e-5)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let candles: Vec<f32> = candle_nn::ops::rms_norm(&xt, &wt, 1e-5)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for r in 0..rows {
            let row = &x[r * n..(r + 1) * n];
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            for i in 0..n {
                let exact = row[i] as f64 * inv * w[i] as f64;
                let got = ours[r * n + i] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                    "{got} vs {exact}"
                );
                assert!((got - candles[r * n + i] as f64).abs() < 1e-5);
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
