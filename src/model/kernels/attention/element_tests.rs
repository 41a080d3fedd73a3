//! f16 and q8_0 keys and values against f32 ones holding the same numbers: every float
//! kernel gives them the same bits (they are widened exactly as they are loaded).

#[cfg(target_arch = "x86_64")]
use super::tests::avx512_kernels_run_here;
use super::tests::{bits, half_and_wide, val, value_sums_by_definition, weighted_values, Q8};
use super::{finish_values, scaled_dots};

/// q8_0 values, and q8_0 keys in the float score kernels, give the bits of f32 ones holding
/// their numbers on every path this CPU runs: the scalar loops (head size 40), AVX2 and
/// AVX-512. (The attention call scores q8_0 keys on the integer units instead: see
/// `q8_score_tests`.)
#[test]
fn q8_elements_give_the_bits_of_their_f32_values_in_the_float_kernels() {
    for dim in [128, 64, 48, 40] {
        for n in [1, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let (kq, vq) = (Q8::of(n * stride, 7), Q8::of(n * stride, 5));
            let mut want = vec![0f32; n];
            scaled_dots(&q, kq.wide.as_slice(), stride, offset, 0.125, &mut want);
            let mut got = vec![0f32; n];
            scaled_dots(&q, kq.rows(), stride, offset, 0.125, &mut got);
            assert_eq!(bits(&got), bits(&want), "scores: head size {dim}, {n} keys");
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want_values =
                value_sums_by_definition(&weights, 0.37, &vq.wide, stride, offset, dim);
            let mut got_values = vec![0f32; dim];
            weighted_values(&weights, 0.37, vq.rows(), stride, offset, &mut got_values);
            assert_eq!(bits(&got_values), bits(&want_values), "values: {dim}, {n}");
            #[cfg(target_arch = "x86_64")]
            {
                let mut acc = vec![0f32; 2 * dim];
                if super::simd_available() && dim % 16 == 0 {
                    unsafe {
                        super::avx2::scaled_dots(&q, kq.rows(), stride, offset, 0.125, &mut got)
                    };
                    assert_eq!(bits(&got), bits(&want), "avx2 scores: {dim}, {n}");
                }
                if super::simd_available() && dim % 32 == 0 {
                    unsafe {
                        super::avx2::accumulate_values(
                            &weights,
                            vq.rows(),
                            stride,
                            offset,
                            &mut acc,
                        )
                    };
                    finish_values(&acc, 0.37, &mut got_values);
                    assert_eq!(
                        bits(&got_values),
                        bits(&want_values),
                        "avx2 values: {dim}, {n}"
                    );
                }
                if super::simd_available() && super::wide_available() && dim % 16 == 0 {
                    unsafe {
                        super::avx512::scaled_dots(&q, kq.rows(), stride, offset, 0.125, &mut got)
                    };
                    assert_eq!(bits(&got), bits(&want), "avx512 scores: {dim}, {n}");
                    if dim % 64 == 0 {
                        acc.fill(0.0);
                        unsafe {
                            super::avx512::accumulate_values(
                                &weights,
                                vq.rows(),
                                stride,
                                offset,
                                &mut acc,
                            )
                        };
                        finish_values(&acc, 0.37, &mut got_values);
                        assert_eq!(
                            bits(&got_values),
                            bits(&want_values),
                            "avx512 values: {dim}, {n}"
                        );
                    }
                }
            }
        }
    }
}

/// f16 keys and values give, on every path, the bits f32 ones holding the same numbers
/// give: the scalar loops (head sizes 40 and 48 for values, 40 for scores) and AVX2 (AVX-512
/// in the test after this one).
#[test]
fn f16_keys_and_values_give_the_bits_of_their_f32_values_on_every_path() {
    for dim in [128, 64, 48, 40] {
        for n in [1, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let (k16, k32) = half_and_wide(n * stride, 7);
            let (v16, v32) = half_and_wide(n * stride, 5);
            let mut want = vec![0f32; n];
            scaled_dots(&q, k32.as_slice(), stride, offset, 0.125, &mut want);
            let mut got = vec![0f32; n];
            scaled_dots(&q, k16.as_slice(), stride, offset, 0.125, &mut got);
            assert_eq!(bits(&got), bits(&want), "scores: head size {dim}, {n} keys");
            #[cfg(target_arch = "x86_64")]
            if super::simd_available() && dim % 16 == 0 {
                unsafe {
                    super::avx2::scaled_dots(&q, k16.as_slice(), stride, offset, 0.125, &mut got)
                };
                assert_eq!(bits(&got), bits(&want), "avx2 scores: {dim}, {n}");
            }
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want =
                value_sums_by_definition(&weights, 0.37, v32.as_slice(), stride, offset, dim);
            let mut got = vec![0f32; dim];
            weighted_values(&weights, 0.37, v16.as_slice(), stride, offset, &mut got);
            assert_eq!(bits(&got), bits(&want), "values: head size {dim}, {n} keys");
            #[cfg(target_arch = "x86_64")]
            if super::simd_available() && dim % 32 == 0 {
                let mut acc = vec![0f32; 2 * dim];
                unsafe {
                    super::avx2::accumulate_values(
                        &weights,
                        v16.as_slice(),
                        stride,
                        offset,
                        &mut acc,
                    )
                };
                finish_values(&acc, 0.37, &mut got);
                assert_eq!(bits(&got), bits(&want), "avx2 values: {dim}, {n}");
            }
        }
    }
}

/// The AVX-512 kernels on f16 keys and values give the bits of the f32 ones.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_f16_keys_and_values_give_the_bits_of_their_f32_values() {
    if !avx512_kernels_run_here() {
        return;
    }
    // Scores take head sizes that are multiples of 16, value sums multiples of 64.
    for dim in [128, 64, 48] {
        for n in [1, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let (k16, k32) = half_and_wide(n * stride, 7);
            let (v16, v32) = half_and_wide(n * stride, 5);
            let mut want = vec![0f32; n];
            scaled_dots(&q, k32.as_slice(), stride, offset, 0.125, &mut want);
            let mut got = vec![0f32; n];
            unsafe {
                super::avx512::scaled_dots(&q, k16.as_slice(), stride, offset, 0.125, &mut got)
            };
            assert_eq!(bits(&got), bits(&want), "avx512 scores: {dim}, {n}");
            if dim % 64 != 0 {
                continue;
            }
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want =
                value_sums_by_definition(&weights, 0.37, v32.as_slice(), stride, offset, dim);
            let mut acc = vec![0f32; 2 * dim];
            unsafe {
                super::avx512::accumulate_values(&weights, v16.as_slice(), stride, offset, &mut acc)
            };
            let mut got = vec![0f32; dim];
            finish_values(&acc, 0.37, &mut got);
            assert_eq!(bits(&got), bits(&want), "avx512 values: {dim}, {n}");
        }
    }
}
