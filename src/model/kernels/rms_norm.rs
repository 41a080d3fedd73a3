//! RMS normalisation of rows, `x / sqrt(mean(x²) + eps) · w`, on host slices, alone or fused
//! with the residual add before it.
//!
//! Why it exists: the own forward keeps its residual stream as host rows, and a candle norm
//! per call (a tensor in, an allocation, a custom op's dispatch, a tensor out) cost more than
//! the norm's arithmetic at a decode step's one row. The arithmetic is candle's own, operation
//! for operation (the squares summed in order from the first value, `m = sqrt(sum / n + eps)`,
//! then `(x / m) · w`), so every output is the bits candle's norm gives and greedy outputs are
//! unchanged; each row is computed alone, so a token's result does not depend on its batch.

/// The most rows whose sums of squares run side by side: each sum is a chain of dependent
/// additions (the order is candle's), so one row's sum waits on the adder's latency, while
/// independent chains of other rows run beside it for free: a verification's rows (at most 12
/// a weight load in the matmuls) cost one chain. `forward-bench --ops` had a 9-row norm cost
/// four times a 1-row one before.
const SUM_ROWS: usize = 12;

/// `Σx²` of each of `R` rows of `n` values (`rows` holds them back to back), every row's
/// squares added in order from its first value (candle's `rms_norm`), the rows' chains
/// interleaved so they run at once. Each sum is the bits it would be alone.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn sums_of_squares<const R: usize>(rows: &[f32], n: usize) -> [f32; R] {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &rows[r * n..][..n]);
    let mut sums = [0f32; R];
    for i in 0..n {
        for r in 0..R {
            let v = rows[r][i];
            sums[r] += v * v;
        }
    }
    sums
}

/// `dst = x / sqrt(Σx² / n + eps) · w` for a group of at most [`SUM_ROWS`] rows.
#[inline(always)]
fn norm_group(x: &[f32], w: &[f32], eps: f32, dst: &mut [f32]) {
    let n = w.len();
    let mut sums = [0f32; SUM_ROWS];
    let k = x.len() / n;
    macro_rules! sums_for {
        ($($r:literal)*) => {
            match k {
                $($r => sums[..$r].copy_from_slice(&sums_of_squares::<$r>(x, n)),)*
                _ => unreachable!("a group holds 1 to {SUM_ROWS} rows"),
            }
        };
    }
    sums_for!(1 2 3 4 5 6 7 8 9 10 11 12);
    for ((row, out), sum2) in x.chunks_exact(n).zip(dst.chunks_exact_mut(n)).zip(sums) {
        let m = (sum2 / n as f32 + eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(row).zip(w) {
            *o = v / m * g;
        }
    }
}

#[inline(always)]
fn norm_rows_generic(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let group = SUM_ROWS * w.len();
    for (rows, dst) in x.chunks(group).zip(out.chunks_mut(group)) {
        norm_group(rows, w, eps, dst);
    }
}

#[inline(always)]
fn add_norm_rows_generic(x: &mut [f32], add: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let group = SUM_ROWS * w.len();
    for ((rows, a), dst) in x
        .chunks_mut(group)
        .zip(add.chunks(group))
        .zip(out.chunks_mut(group))
    {
        for (v, a) in rows.iter_mut().zip(a) {
            *v += a;
        }
        norm_group(rows, w, eps, dst);
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

/// The widest vector level the loops may be compiled for: the divisions and products vectorize
/// (the same bits at every level; the ordered sum stays a chain).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Width {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Chosen once: the switches are environment variables, too slow to read on every norm.
fn width() -> Width {
    static WIDTH: std::sync::OnceLock<Width> = std::sync::OnceLock::new();
    *WIDTH.get_or_init(|| {
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
    })
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

/// `rows ← norm_rows(rows) · w` for the weight tensor `w` (on the CPU), through `scratch` (at
/// least as long as `rows`).
pub fn norm_in_place(
    w: &candle_core::Tensor,
    rows: &mut [f32],
    eps: f32,
    scratch: &mut [f32],
) -> candle_core::Result<()> {
    let scratch = &mut scratch[..rows.len()];
    with_host(w, |w| norm_rows(rows, w, eps, scratch))?;
    rows.copy_from_slice(scratch);
    Ok(())
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
            // Fifteen rows: a full group of twelve side by side, then three.
            let rows = 15;
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
            // A row normed alone is the same bits as in a batch, in either group.
            for r in [2, 13] {
                let mut alone = vec![0f32; n];
                norm_rows(&x[r * n..(r + 1) * n], &w, 1e-5, &mut alone);
                assert_eq!(bits(&alone), bits(&want[r * n..(r + 1) * n]), "row {r}");
                let row = &x[r * n..(r + 1) * n];
                let sum2 = row.iter().map(|v| v * v).sum::<f32>();
                let m = (sum2 / n as f32 + 1e-5).sqrt();
                let reference: Vec<f32> = row.iter().zip(&w).map(|(v, g)| v / m * g).collect();
                assert_eq!(bits(&alone), bits(&reference), "row {r}: candle's order");
            }
        }
    }

    #[test]
    fn gives_candles_bits() {
        for (rows, n) in [(3usize, 576usize), (40, 64)] {
            let x = random(21, rows * n);
            let w = random(22, n);
            let dev = candle_core::Device::Cpu;
            let xt = candle_core::Tensor::from_vec(x.clone(), (rows, n), &dev).unwrap();
            let wt = candle_core::Tensor::from_vec(w.clone(), n, &dev).unwrap();
            let ours = rms_norm(&xt, &wt, 1e-5).unwrap();
            let candles = candle_nn::ops::rms_norm(&xt, &wt, 1e-5).unwrap();
            let flat = |t: candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(
                bits(&flat(ours)),
                bits(&flat(candles)),
                "{rows} rows of {n}"
            );
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
