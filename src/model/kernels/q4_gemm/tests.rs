use super::*;
use crate::model::kernels::packed_gemm::test_support::{
    assert_rows_and_isas_agree, errors_against_candle, quantized, random,
};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use half::f16;

const FORMATS: [(Q4Format, GgmlDType); 4] = [
    (Q4Format::Q4_0, GgmlDType::Q4_0),
    (Q4Format::Q4_1, GgmlDType::Q4_1),
    (Q4Format::Q5_0, GgmlDType::Q5_0),
    (Q4Format::Q5_1, GgmlDType::Q5_1),
];

/// The kernels' arithmetic one output element at a time, from the tiles' values: per block
/// the exact integer sum `Σ q·a`, then `acc += Σ · (d · da)` and `acc += m · (da · Σa)` as
/// fused multiply-adds, blocks in order.
fn reference(w: &PackedQ4, x: &[f32], m: usize) -> Vec<f32> {
    fn parts<const H: usize>(t: &Tiles<H>, block: usize, c: usize, i: usize) -> (u8, u16, u16) {
        let tile = &t.tiles[block];
        let (g, j) = (i / 4, i % 4);
        let mut q = (tile.qs[(g / 2) * 64 + c * 4 + j] >> (4 * (g % 2))) & 0x0f;
        if H > 0 {
            q |= ((tile.qh[c * 4 + j] >> g) & 1) << 4;
        }
        (q, tile.scales[c], tile.mins[c])
    }
    let q = crate::model::kernels::tile_driver::quantize_rows(x, m);
    let (n, kb) = (w.n, w.k / QK);
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            let mut acc = 0f32;
            for b in 0..kb {
                let at = q.at(r, b);
                let (mut sum, mut d, mut mn) = (0i32, 0u16, 0u16);
                for i in 0..QK {
                    let (v, dd, mm) = match (&w.four, &w.five, &w.e2m1) {
                        (Some(t4), _, _) => parts(t4, t * kb + b, c, i),
                        (_, Some(t5), _) => parts(t5, t * kb + b, c, i),
                        (_, _, Some(codes)) => {
                            let (code, d, m) = parts(codes, t * kb + b, c, i);
                            (E2M1_LOOKUP[code as usize], d, m)
                        }
                        _ => unreachable!(),
                    };
                    sum += v as i32 * q.qs[at * QK + i] as i32;
                    (d, mn) = (dd, mm);
                }
                let da = q.scales[at];
                let f = |h: u16| f16::from_bits(h).to_f32();
                acc = (sum as f32).mul_add(f(d) * da, acc);
                acc = f(mn).mul_add(da * q.sums[at] as f32, acc);
            }
            out[r * n + col] = acc;
        }
    }
    out
}

#[test]
fn every_instruction_set_gives_the_scalar_references_bits() {
    if !available() {
        panic!("these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine)");
    }
    for (format, dtype) in FORMATS {
        let (n, k) = (37usize, 96usize);
        let w = Tensor::from_vec(random(13, n * k), (n, k), &Device::Cpu).unwrap();
        let (bytes, _) = quantized(&w, dtype);
        let packed = PackedQ4::from_gguf_bytes(format, &bytes, n, k).unwrap();
        let m = 13;
        let x = random(14, m * k);
        let want = reference(&packed, &x, m);
        for isa in DotIsa::available() {
            let mut ours = vec![0f32; m * n];
            matmul_on(&packed, &x, m, &mut ours, isa);
            for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{format:?} {isa:?}: element {i}: {a} vs reference {b}"
                );
            }
        }
    }
}

#[test]
fn matches_candle_and_is_row_invariant() {
    if !available() {
        panic!("these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine)");
    }
    for (format, dtype) in FORMATS {
        // n = 44 ends in a 12-column tile (a 256-bit kernel's second half holds 4), 37 in
        // a 5-column one; k is a multiple of 64 because candle's Q4_1 kernel takes blocks
        // in pairs.
        for (n, k) in [(44usize, 128usize), (37, 64)] {
            let w = Tensor::from_vec(random(3, n * k), (n, k), &Device::Cpu).unwrap();
            let (bytes, _) = quantized(&w, dtype);
            let packed = PackedQ4::from_gguf_bytes(format, &bytes, n, k).unwrap();
            let m = 9;
            let x = random(4, m * k);
            let mut ours = vec![0f32; m * n];
            matmul(&packed, &x, m, &mut ours);
            // We must be at least as close to the exact product as candle (which rounds
            // activation block scales to f16 where we keep f32).
            let (err_ours, err_theirs) = errors_against_candle(&w, dtype, &x, m, &ours);
            assert!(err_ours < 0.1, "{format:?}: max error {err_ours}");
            assert!(
                err_ours <= err_theirs * 1.05,
                "{format:?}: ours {err_ours} vs candle {err_theirs}"
            );
            assert_rows_and_isas_agree(n, k, |x, m, dst, isa| matmul_on(&packed, x, m, dst, isa));
        }
    }
}

#[test]
fn the_tiles_unpack_to_the_files_exact_weights() {
    for (format, dtype) in FORMATS {
        let (n, k) = (37usize, 128usize);
        let w = Tensor::from_vec(random(5, n * k), (n, k), &Device::Cpu).unwrap();
        let (bytes, values) = quantized(&w, dtype);
        let packed = PackedQ4::from_gguf_bytes(format, &bytes, n, k).unwrap();
        let unpacked = packed.unpack();
        for (i, (a, b)) in unpacked.iter().zip(&values).enumerate() {
            assert!(
                a == b,
                "{format:?}: value {i}: {a} unpacked, {b} in the file"
            );
        }
    }
}

#[test]
fn extreme_nibbles_and_activations_do_not_saturate() {
    // Every value at its largest (15; 31 with the fifth bits) against activations at -127
    // and 127: the largest products the AVX2 path's 16-bit pair sums must hold. Blocks
    // with d = 1, m = 0.5: each weight 15.5 (Q4_1) or 31.5 (Q5_1).
    let (n, k) = (8usize, 64usize);
    for (format, weight) in [(Q4Format::Q4_1, 15.5f32), (Q4Format::Q5_1, 31.5)] {
        let mut bytes = Vec::new();
        for _ in 0..n * (k / QK) {
            bytes.extend_from_slice(&f16::from_f32(1.0).to_le_bytes());
            bytes.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
            if format == Q4Format::Q5_1 {
                bytes.extend_from_slice(&[0xffu8; 4]);
            }
            bytes.extend_from_slice(&[0xffu8; QK / 2]);
        }
        let packed = PackedQ4::from_gguf_bytes(format, &bytes, n, k).unwrap();
        // Mixed signs, then every activation at 127 and at -127: the largest block sums
        // the AVX2 path's 16-bit lanes hold.
        let rows: [Vec<f32>; 3] = [
            (0..k)
                .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect(),
            vec![1.0; k],
            vec![-1.0; k],
        ];
        for x in &rows {
            let want: f32 = x.iter().map(|v| weight * v).sum();
            for isa in DotIsa::available() {
                let mut out = vec![0f32; n];
                matmul_on(&packed, x, 1, &mut out, isa);
                for &o in &out {
                    assert!((o - want).abs() < 1e-3, "{format:?} {isa:?}: {o} vs {want}");
                }
            }
        }
    }
}

#[test]
fn refuses_shapes_it_cannot_pack() {
    // A Q4_0 scale whose minimum, -8 · d, overflows f16.
    let mut huge = f16::from_f32(60000.0).to_le_bytes().to_vec();
    huge.extend_from_slice(&[0; QK / 2]);
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_0, &huge, 1, 32).is_none());
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_0, &[0; 18], 1, 33).is_none());
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_0, &[0; 17], 1, 32).is_none());
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_1, &[0; 18], 1, 32).is_none());
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q5_0, &[0; 18], 1, 32).is_none());
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q5_0, &[0; 22], 1, 32).is_some());
    assert!(PackedQ4::from_gguf_bytes(Q4Format::Q5_1, &[0; 24], 1, 32).is_some());
}

/// Q5_0 bytes of an `(n, k)` weight holding what MXFP4 holds (`load/mxfp4` writes them so):
/// doubled E2M1 values (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) times a power-of-two scale, codes
/// drawn from `seed` (`all`: every value that code), and the values.
fn e2m1_as_q5_0(seed: u64, n: usize, k: usize, all: Option<u8>) -> (Vec<u8>, Vec<f32>) {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |bound: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % bound
    };
    let (mut bytes, mut values) = (Vec::new(), Vec::new());
    for _ in 0..n * (k / QK) {
        let d = f16::from_f32(2f32.powi(-(next(8) as i32) - 2));
        let q: Vec<u8> = (0..QK)
            .map(|_| {
                let code = all.unwrap_or_else(|| next(16) as u8);
                (E2M1_LOOKUP[code as usize] as i32 - 12 + 16) as u8
            })
            .collect();
        bytes.extend_from_slice(&d.to_le_bytes());
        let high = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (i, &v)| h | (u32::from(v >> 4) << i));
        bytes.extend_from_slice(&high.to_le_bytes());
        bytes.extend((0..QK / 2).map(|i| (q[i] & 0x0f) | ((q[i + 16] & 0x0f) << 4)));
        values.extend(q.iter().map(|&v| d.to_f32() * (v as f32 - 16.0)));
    }
    (bytes, values)
}

#[test]
fn mxfp4_values_read_as_q5_0_run_as_4_bit_codes_with_the_same_weights() {
    if !available() {
        panic!("these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine)");
    }
    for (n, k) in [(44usize, 128usize), (37, 64)] {
        let (bytes, values) = e2m1_as_q5_0(7, n, k, None);
        let packed = PackedQ4::from_gguf_bytes(Q4Format::Q5_0, &bytes, n, k).unwrap();
        assert!(packed.is_e2m1());
        assert_eq!(packed.unpack(), values);
        let m = 11;
        let x = random(15, m * k);
        let want = reference(&packed, &x, m);
        for isa in DotIsa::available() {
            let mut ours = vec![0f32; m * n];
            matmul_on(&packed, &x, m, &mut ours, isa);
            let same = ours
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{isa:?} differs from the reference's bits");
        }
        assert_rows_and_isas_agree(n, k, |x, m, dst, isa| matmul_on(&packed, x, m, dst, isa));
    }
    // One value off E2M1's grid (5) keeps the whole weight 5-bit.
    let (mut bytes, _) = e2m1_as_q5_0(8, 16, 64, None);
    bytes[6] = (bytes[6] & 0xf0) | 5;
    bytes[2] &= !1;
    let five = PackedQ4::from_gguf_bytes(Q4Format::Q5_0, &bytes, 16, 64).unwrap();
    assert!(!five.is_e2m1());
}

#[test]
fn the_largest_e2m1_values_do_not_saturate() {
    // Every weight 12 d (looked up as 24) against activations at ±127: the AVX2 path's
    // 16-bit pair sums at their largest.
    let (n, k) = (8usize, 64usize);
    let (bytes, values) = e2m1_as_q5_0(9, n, k, Some(7));
    let packed = PackedQ4::from_gguf_bytes(Q4Format::Q5_0, &bytes, n, k).unwrap();
    assert!(packed.is_e2m1());
    for x in [vec![1.0f32; k], vec![-1.0; k]] {
        for isa in DotIsa::available() {
            let mut out = vec![0f32; n];
            matmul_on(&packed, &x, 1, &mut out, isa);
            for (c, &o) in out.iter().enumerate() {
                let want: f32 = values[c * k..(c + 1) * k]
                    .iter()
                    .zip(&x)
                    .map(|(w, v)| w * v)
                    .sum();
                assert!(
                    (o - want).abs() < 1e-3 * want.abs().max(1.0),
                    "{isa:?}: {o} vs {want}"
                );
            }
        }
    }
}
