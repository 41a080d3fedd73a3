//! The scans a step runs over a whole vocabulary-sized row: where its first NaN or +inf is
//! (a logits row's check), where its first value that is no probability is (NaN, an infinity
//! or a negative value: a probability row's check), its maximum, and where that maximum
//! first is.
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
        return unsafe { first_flagged_avx2::<NOT_A_LOGIT>(row) };
    }
    first_invalid_scalar(row)
}

fn first_invalid_scalar(row: &[f32]) -> Option<usize> {
    row.iter().position(|v| v.is_nan() || *v == f32::INFINITY)
}

/// The index of the first value of `row` that is not a probability: NaN, an infinity or a
/// negative value (`-0.0` is a probability).
pub(crate) fn first_not_probability(row: &[f32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if crate::model::kernels::fast_exp::vector_available() {
        // SAFETY: AVX2 was checked; every read is inside `row`.
        return unsafe { first_flagged_avx2::<NOT_A_PROBABILITY>(row) };
    }
    first_not_probability_scalar(row)
}

fn first_not_probability_scalar(row: &[f32]) -> Option<usize> {
    row.iter().position(|v| !(v.is_finite() && *v >= 0.0))
}

/// The first index of `row`'s maximum and the maximum, `None` when it is empty; `row` holds no
/// NaN (see [`first_invalid`]).
pub(crate) fn first_max(row: &[f32]) -> Option<(usize, f32)> {
    if row.is_empty() {
        return None;
    }
    let best = max_value(row);
    #[cfg(target_arch = "x86_64")]
    if crate::model::kernels::fast_exp::vector_available() {
        // SAFETY: AVX2 was checked; every read is inside `row`.
        let i = unsafe { first_equal_avx2(row, best) };
        return Some((i, row[i]));
    }
    let i = row.iter().position(|&v| v == best)?;
    Some((i, row[i]))
}

/// The largest value of `row` (`-inf` when it is empty); `row` holds no NaN. A maximum is
/// exact in any order, so the vector path's is the scalar fold's.
pub(crate) fn max_value(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::model::kernels::fast_exp::vector_available() {
        // SAFETY: AVX2 was checked; every read is inside `row`.
        return unsafe { max_value_avx2(row) };
    }
    row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// The scalar loop [`first_max`] answers as (the tests' definition).
#[cfg(test)]
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

/// What [`first_flagged_avx2`] looks for.
#[cfg(target_arch = "x86_64")]
const NOT_A_LOGIT: bool = false;
#[cfg(target_arch = "x86_64")]
const NOT_A_PROBABILITY: bool = true;

/// The first value of `row` that is no logit (NaN or +inf) or, with `PROBABILITY`, no
/// probability (not ≥ 0, which takes NaN and -inf too, or +inf): whole blocks tested, the
/// scalar loop finding the value in the first block that holds one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_flagged_avx2<const PROBABILITY: bool>(row: &[f32]) -> Option<usize> {
    use std::arch::x86_64::*;
    let scalar = if PROBABILITY {
        first_not_probability_scalar
    } else {
        first_invalid_scalar
    };
    let zero = _mm256_setzero_ps();
    let inf = _mm256_set1_ps(f32::INFINITY);
    let p = row.as_ptr();
    let full = row.len() / STEP * STEP;
    for i in (0..full).step_by(STEP) {
        let mut bad = _mm256_setzero_ps();
        for r in 0..4 {
            let x = _mm256_loadu_ps(p.add(i + 8 * r));
            let odd = if PROBABILITY {
                _mm256_cmp_ps::<_CMP_NGE_UQ>(x, zero)
            } else {
                _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x)
            };
            bad = _mm256_or_ps(bad, odd);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_EQ_OQ>(x, inf));
        }
        if _mm256_movemask_ps(bad) != 0 {
            return scalar(&row[i..i + STEP]).map(|j| i + j);
        }
    }
    scalar(&row[full..]).map(|j| full + j)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_value_avx2(row: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let p = row.as_ptr();
    let full = row.len() / STEP * STEP;
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
    lanes
        .iter()
        .chain(&row[full..])
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// The first index of `row` holding a value equal to `best`, which `row` holds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_equal_avx2(row: &[f32], best: f32) -> usize {
    use std::arch::x86_64::*;
    let p = row.as_ptr();
    let full = row.len() / 8 * 8;
    let target = _mm256_set1_ps(best);
    for i in (0..full).step_by(8) {
        let mask = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_loadu_ps(p.add(i)),
            target,
        ));
        if mask != 0 {
            return i + mask.trailing_zeros() as usize;
        }
    }
    full + row[full..]
        .iter()
        .position(|&v| v == best)
        .expect("the maximum is in the row")
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
            assert_eq!(
                first_not_probability(&row),
                first_not_probability_scalar(&row)
            );
            let (fast, slow) = (first_max(&row), first_max_scalar(&row));
            assert_eq!(fast.map(|f| f.0), slow.map(|s| s.0), "row of {}", row.len());
            let fold = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(
                max_value(&row).to_bits() & 0x7fff_ffff,
                fold.to_bits() & 0x7fff_ffff
            );
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
    #[test]
    fn a_probability_row_is_checked_as_the_scalar_loop_checks_it() {
        for n in [0usize, 1, 7, 31, 32, 33, 100, 49_152] {
            let row: Vec<f32> = (0..n).map(|i| (i * 7919 % 1009) as f32 * 1e-6).collect();
            assert_eq!(first_not_probability(&row), None, "row of {n}");
            // -0.0 and 0.0 are probabilities; every other bad value at every place of a block
            // and of the tail is found, the first of two.
            let mut zeros = row.clone();
            for (j, z) in zeros.iter_mut().enumerate() {
                if j % 3 == 0 {
                    *z = -0.0;
                }
            }
            assert_eq!(first_not_probability(&zeros), None);
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-30, -1.0] {
                for at in [0, 5, 31, 32, 47, n.saturating_sub(1)] {
                    if at >= n {
                        continue;
                    }
                    let mut r = row.clone();
                    r[at] = bad;
                    if at > 3 {
                        r[3] = -2.0;
                    }
                    let want = first_not_probability_scalar(&r);
                    assert_eq!(want, Some(at.min(3)), "{bad} at {at} of {n}");
                    assert_eq!(first_not_probability(&r), want, "{bad} at {at} of {n}");
                }
            }
        }
    }
}
