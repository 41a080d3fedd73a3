//! The float kernel's tests: exact products, row invariance and the packed layout, for f16
//! and f32 values alike.

use super::*;
use crate::model::kernels::packed_gemm::test_support::random;
use half::f16;

/// `values` as `elem`'s little-endian bytes, and the values those bytes hold.
fn stored(elem: FloatElem, values: &[f32]) -> (Vec<u8>, Vec<f64>) {
    match elem {
        FloatElem::F16 => (
            values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
            values.iter().map(|&v| f16::from_f32(v).to_f64()).collect(),
        ),
        FloatElem::F32 => (
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            values.iter().map(|&v| f64::from(v)).collect(),
        ),
    }
}

const ELEMS: [FloatElem; 2] = [FloatElem::F16, FloatElem::F32];

#[test]
fn matches_exact_products_and_is_row_invariant() {
    assert!(
        available(),
        "these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine has them)"
    );
    for elem in ELEMS {
        // n = 44 leaves a partial tile and padded tile groups.
        let (n, k) = (44usize, 96usize);
        let (bytes, wr) = stored(elem, &random(1, n * k));
        let packed = PackedFloat::from_le_bytes(elem, &bytes, n, k).unwrap();
        let m = 11;
        let x = random(2, m * k);
        let mut all = vec![0f32; m * n];
        packed.matmul(&x, m, &mut all);
        for r in 0..m {
            for c in 0..n {
                let exact: f64 = (0..k).map(|i| x[r * k + i] as f64 * wr[c * k + i]).sum();
                let got = all[r * n + c] as f64;
                assert!(
                    (got - exact).abs() < 1e-4,
                    "{elem:?} ({r},{c}): {got} vs {exact}"
                );
            }
        }
        // Every prefix of rows (so every grouping of rows into units) gives the same bits.
        for rows in 1..=m {
            let mut part = vec![0f32; rows * n];
            packed.matmul(&x[..rows * k], rows, &mut part);
            assert!(part[..] == all[..rows * n], "{elem:?}: {rows} rows differ");
        }
        for r in 0..m {
            let mut one = vec![0f32; n];
            packed.matmul(&x[r * k..(r + 1) * k], 1, &mut one);
            assert!(
                one[..] == all[r * n..(r + 1) * n],
                "{elem:?}: row {r} differs alone"
            );
        }
    }
}

// Runs where the CPU has AVX-512F and VL (the kernels are chosen at run time); elsewhere
// the wide kernel is never used and the test says so on stderr.
#[test]
fn wide_kernel_gives_the_avx2_kernels_bits() {
    if !wide_available() {
        eprintln!("this CPU lacks AVX-512F/VL (or TANDEM_DISABLE_AVX512 is set): nothing to check");
        return;
    }
    for elem in ELEMS {
        // n = 44: a partial tile and padding; k = 1536 like the MLP's down projection.
        let (n, k) = (44usize, 1536usize);
        let (bytes, _) = stored(elem, &random(3, n * k));
        let packed = PackedFloat::from_le_bytes(elem, &bytes, n, k).unwrap();
        for m in [1, 3, 4, 5, 8, 9, 19] {
            let x = random(4 + m as u64, m * k);
            let mut narrow = vec![0f32; m * n];
            let mut wide = vec![0f32; m * n];
            packed.matmul_on(&x, m, &mut narrow, false);
            packed.matmul_on(&x, m, &mut wide, true);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&narrow), bits(&wide), "{elem:?}, {m} rows");
        }
    }
}

#[test]
fn the_groups_unpack_to_the_files_exact_weights() {
    for elem in ELEMS {
        let (n, k, eb) = (44usize, 96usize, elem.bytes());
        let (bytes, _) = stored(elem, &random(7, n * k));
        let packed = PackedFloat::from_le_bytes(elem, &bytes, n, k).unwrap();
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            for i in 0..k {
                let at = tile_base(&packed, t).wrapping_add((i * GROUP_STEP + c) * eb);
                // SAFETY: inside the packed data (the tile exists, i < k, c < 8).
                let got = unsafe { std::slice::from_raw_parts(at, eb) };
                let want = &bytes[(col * k + i) * eb..(col * k + i + 1) * eb];
                assert_eq!(got, want, "{elem:?}: column {col}, input {i}");
            }
        }
    }
}

#[test]
fn refuses_mismatched_bytes() {
    for elem in ELEMS {
        assert!(PackedFloat::from_le_bytes(elem, &[0; 6], 1, 4).is_none());
        assert!(PackedFloat::from_le_bytes(elem, &[], 0, 4).is_none());
    }
}
