//! The two scans a greedy step runs over a whole vocabulary-sized row: where its first NaN or
//! +inf is, and where its maximum first is.
//!
//! Why it exists: written as loops with a branch per value they compiled to one value at a
//! time, two passes of tens of microseconds over a 49,152-value row, and a verification runs
//! both on every one of its γ + 1 rows (`perf` on a prompt-lookup bench put them at a few
//! percent of the engine thread). The vector paths read eight values a step in four
//! independent chains and answer exactly what the scalar loops answer: the lowest index in
//! both cases (equal maxima, `-0.0` and `0.0` among them, resolve to the first).

/// The index of the first NaN or +inf in `row`.
pub(crate) fn first_invalid(row: &[f32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if crate::model::kernels::fast_exp::vector_available() {
        // SAFETY: AVX2 was checked; every read is inside `row`.
        return unsafe { first_invalid_avx2(row) };
    }
    first_invalid_scalar(row)
}

fn first_invalid_scalar(row: &[f32]) -> Option<usize> {
    row.iter().position(|v| v.is_nan() || *v == f32::INFINITY)
}

/// The first index of `row`'s maximum and the maximum, `None` when it is empty; `row` holds no
/// NaN (see [`first_invalid`]).
pub(crate) fn first_max(row: &[f32]) -> Option<(usize, f32)> {
    #[cfg(target_arch = "x86_64")]
    if crate::model::kernels::fast_exp::vector_available() {
        // SAFETY: AVX2 was checked; every read is inside `row`.
        return unsafe { first_max_avx2(row) };
    }
    first_max_scalar(row)
}

fn first_max_scalar(row: &[f32]) -> Option<(usize, f32)> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best
}

/// Values a vector step reads: four registers of eight.
const STEP: usize = 32;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_invalid_avx2(row: &[f32]) -> Option<usize> {
    use std::arch::x86_64::*;
    let inf = _mm256_set1_ps(f32::INFINITY);
    let p = row.as_ptr();
    let full = row.len() / STEP * STEP;
    for i in (0..full).step_by(STEP) {
        let mut bad = _mm256_setzero_ps();
        for r in 0..4 {
            let x = _mm256_loadu_ps(p.add(i + 8 * r));
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_EQ_OQ>(x, inf));
        }
        if _mm256_movemask_ps(bad) != 0 {
            return first_invalid_scalar(&row[i..i + STEP]).map(|j| i + j);
        }
    }
    first_invalid_scalar(&row[full..]).map(|j| full + j)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_max_avx2(row: &[f32]) -> Option<(usize, f32)> {
    use std::arch::x86_64::*;
    let p = row.as_ptr();
    let full = row.len() / STEP * STEP;
    if full == 0 {
        return first_max_scalar(row);
    }
    // The maximum is exact in any order (no NaN); then its first index.
    let mut m = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    for i in (0..full).step_by(STEP) {
        for (r, acc) in m.iter_mut().enumerate() {
            *acc = _mm256_max_ps(*acc, _mm256_loadu_ps(p.add(i + 8 * r)));
        }
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(
        lanes.as_mut_ptr(),
        _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])),
    );
    let mut best = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for &v in &row[full..] {
        best = best.max(v);
    }
    let target = _mm256_set1_ps(best);
    for i in (0..full).step_by(8) {
        let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_loadu_ps(p.add(i)), target);
        let mask = _mm256_movemask_ps(eq);
        if mask != 0 {
            return Some((
                i + mask.trailing_zeros() as usize,
                row[i + mask.trailing_zeros() as usize],
            ));
        }
    }
    let j = row[full..].iter().position(|&v| v == best)?;
    Some((full + j, row[full + j]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for n in [0usize, 1, 7, 31, 32, 33, 100, 49_152] {
            out.push(
                (0..n)
                    .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 0.01)
                    .collect(),
            );
        }
        // Ties at the maximum (the first wins), zeros of both signs as the maximum, all -inf,
        // and a maximum in the scalar tail.
        let mut ties = vec![1.0f32; 70];
        ties[40] = 2.0;
        ties[65] = 2.0;
        out.push(ties);
        let mut zeros = vec![-1.0f32; 50];
        zeros[10] = -0.0;
        zeros[12] = 0.0;
        out.push(zeros);
        out.push(vec![f32::NEG_INFINITY; 40]);
        let mut tail = vec![0.5f32; 67];
        tail[66] = 9.0;
        out.push(tail);
        out
    }

    #[test]
    fn the_vector_scans_answer_as_the_scalar_loops() {
        for row in rows() {
            assert_eq!(first_invalid(&row), first_invalid_scalar(&row));
            let (fast, slow) = (first_max(&row), first_max_scalar(&row));
            assert_eq!(fast.map(|f| f.0), slow.map(|s| s.0), "row of {}", row.len());
            // Every invalid value at every place of a block and of the tail.
            for bad in [f32::NAN, f32::INFINITY] {
                for at in [0, 5, 31, 32, 47, row.len().saturating_sub(1)] {
                    if at < row.len() {
                        let mut r = row.clone();
                        r[at] = bad;
                        if at > 3 {
                            r[3] = bad;
                        }
                        let want = first_invalid_scalar(&r);
                        assert_eq!(first_invalid(&r), want);
                        assert_eq!(want, Some(at.min(3)));
                    }
                }
            }
        }
        assert_eq!(first_max(&[]), None);
        // -inf is a value: the first of an all -inf row is its maximum.
        assert_eq!(first_max(&[f32::NEG_INFINITY; 3]).map(|m| m.0), Some(0));
    }
}
