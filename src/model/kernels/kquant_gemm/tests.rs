use super::*;
use crate::model::kernels::k_rows::quantize_k_rows;
use crate::model::kernels::packed_gemm::test_support::{
    assert_rows_and_isas_agree, errors_against_candle, quantized, random,
};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use half::f16;

const FORMATS: [(KFormat, GgmlDType); 3] = [
    (KFormat::Q4K, GgmlDType::Q4K),
    (KFormat::Q5K, GgmlDType::Q5K),
    (KFormat::Q6K, GgmlDType::Q6K),
];

fn decode_block(format: KFormat, b: &[u8]) -> decode::Decoded {
    match format {
        KFormat::Q4K => decode::q4_k(b),
        KFormat::Q5K => decode::q5_k(b),
        KFormat::Q6K => decode::q6_k(b),
    }
}

/// The kernels' arithmetic one output element at a time, from the file's blocks: per
/// sub-block the exact integer sum, scaled by the sub-block scale into an f32 sum (a fused
/// multiply-add a sub-block, in order); per super-block `acc += Σ · (d · da)` and
/// `acc -= Σm · (dmin · da)` as fused multiply-adds, the minimums' sum `Σm` exact
/// (Q6_K: `dmin · da` is `d · da · 32`).
fn reference(format: KFormat, bytes: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let q = quantize_k_rows(x, m);
    let (kb, bb) = (k / QK_K, format.block_bytes());
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut acc = 0f32;
            for b in 0..kb {
                let blk = decode_block(format, &bytes[(c * kb + b) * bb..][..bb]);
                let at = q.at(r, b);
                let a = &q.qs[at * QK_K..][..QK_K];
                let sub = if format == KFormat::Q6K { 16 } else { 32 };
                let (mut fsum, mut msum) = (0f32, 0i32);
                for j in 0..QK_K / sub {
                    let dot: i32 = (j * sub..(j + 1) * sub)
                        .map(|i| blk.q[i] as i32 * a[i] as i32)
                        .sum();
                    fsum = (dot as f32).mul_add(blk.sc[j] as f32, fsum);
                    msum += if format == KFormat::Q6K {
                        blk.sc[j] as i32 * q.sums16[at * 16 + j] as i32
                    } else {
                        blk.m[j] as i32 * q.sums32[at * 8 + j] as i32
                    };
                }
                let da = q.scales[at];
                let dd = f16::from_bits(blk.d).to_f32() * da;
                let dm = if format == KFormat::Q6K {
                    dd * 32.0
                } else {
                    f16::from_bits(blk.dmin).to_f32() * da
                };
                acc = fsum.mul_add(dd, acc);
                acc = (-(msum as f32)).mul_add(dm, acc);
            }
            out[r * n + c] = acc;
        }
    }
    out
}

fn need_cpu() {
    if !available() {
        panic!("these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine)");
    }
}

#[test]
fn every_instruction_set_gives_the_scalar_references_bits_for_every_row_count() {
    need_cpu();
    for (format, dtype) in FORMATS {
        // n = 44 ends in a 12-column tile (a 256-bit kernel's second half holds 4), 21 in a
        // 5-column one.
        for (n, k) in [(44usize, 512usize), (21, 256)] {
            let w = Tensor::from_vec(random(3, n * k), (n, k), &Device::Cpu).unwrap();
            let (bytes, _) = quantized(&w, dtype);
            let packed = PackedK::from_gguf_bytes(format, &bytes, n, k).unwrap();
            let m = 13;
            let x = random(4, m * k);
            let want = reference(format, &bytes, n, k, &x, m);
            for isa in DotIsa::available() {
                let mut ours = vec![0f32; m * n];
                packed.matmul_on(&x, m, &mut ours, isa);
                for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{format:?} {isa:?} ({n}, {k}): element {i}: {a} vs reference {b}"
                    );
                }
            }
            assert_rows_and_isas_agree(n, k, |x, m, dst, isa| packed.matmul_on(x, m, dst, isa));
        }
    }
}

#[test]
fn as_close_to_the_exact_product_as_candles_k_quant_matmul() {
    need_cpu();
    for (format, dtype) in FORMATS {
        let (n, k) = (40usize, 768usize);
        let w = Tensor::from_vec(random(8, n * k), (n, k), &Device::Cpu).unwrap();
        let (bytes, _) = quantized(&w, dtype);
        let packed = PackedK::from_gguf_bytes(format, &bytes, n, k).unwrap();
        let m = 5;
        let x = random(9, m * k);
        let mut ours = vec![0f32; m * n];
        packed.matmul(&x, m, &mut ours);
        let (err_ours, err_theirs) = errors_against_candle(&w, dtype, &x, m, &ours);
        assert!(err_ours < 0.2, "{format:?}: max error {err_ours}");
        assert!(
            err_ours <= err_theirs * 1.25 + 1e-3,
            "{format:?}: ours {err_ours} vs candle {err_theirs}"
        );
    }
}

#[test]
fn the_tiles_hold_the_files_exact_weights() {
    for (format, dtype) in FORMATS {
        let (n, k) = (19usize, 512usize);
        let w = Tensor::from_vec(random(5, n * k), (n, k), &Device::Cpu).unwrap();
        let (bytes, values) = quantized(&w, dtype);
        let packed = PackedK::from_gguf_bytes(format, &bytes, n, k).unwrap();
        let kb = k / QK_K;
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            for i in 0..k {
                let (b, v) = (i / QK_K, i % QK_K);
                let f = |h: u16| f16::from_bits(h).to_f32();
                // ggml's dequantization: `(d · sc) · q - dmin · m`, Q6_K `(d · sc) · (q - 32)`.
                let value = match &packed.tiles {
                    Tiles::Q4K(g) => {
                        let (q, sc, m, d, dmin) = g.tiles[t * kb + b].value(c, v);
                        f(d) * sc as f32 * q as f32 - f(dmin) * m as f32
                    }
                    Tiles::Q5K(g) => {
                        let (q, sc, m, d, dmin) = g.tiles[t * kb + b].value(c, v);
                        f(d) * sc as f32 * q as f32 - f(dmin) * m as f32
                    }
                    Tiles::Q6K(g) => {
                        let (q, sc, d) = g.tiles[t * kb + b].value(c, v);
                        f(d) * sc as f32 * (q as i32 - 32) as f32
                    }
                };
                let want = values[col * k + i];
                assert!(
                    value == want,
                    "{format:?}: column {col} value {i}: {value} in the tile, {want} in the file"
                );
            }
        }
    }
}

#[test]
fn extreme_values_and_activations_do_not_overflow() {
    need_cpu();
    // Every quantized value and scale at its largest against activations all at ±127: the
    // largest sums any lane holds (Q6_K also at its most negative scale).
    let (n, k) = (16usize, 512usize);
    for format in [KFormat::Q4K, KFormat::Q5K, KFormat::Q6K] {
        let mut block = vec![0xffu8; format.block_bytes()];
        let one = f16::from_f32(1.0).to_le_bytes();
        match format {
            KFormat::Q6K => {
                block[192..208].fill(0x80); // scales -128
                block[208..210].copy_from_slice(&one);
            }
            _ => {
                block[0..2].copy_from_slice(&one);
                block[2..4].copy_from_slice(&f16::from_f32(0.0).to_le_bytes());
            }
        }
        let bytes: Vec<u8> = (0..n * k / QK_K).flat_map(|_| block.clone()).collect();
        let packed = PackedK::from_gguf_bytes(format, &bytes, n, k).unwrap();
        // One value: Q4_K 63 · 15, Q5_K 63 · 31, Q6_K -128 · 31.
        let weight = match format {
            KFormat::Q4K => 63.0 * 15.0,
            KFormat::Q5K => 63.0 * 31.0,
            KFormat::Q6K => -128.0 * 31.0,
        };
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; k];
            let want = sign * weight * k as f32;
            for isa in DotIsa::available() {
                let mut out = vec![0f32; n];
                packed.matmul_on(&x, 1, &mut out, isa);
                for &o in &out {
                    assert!(
                        (o - want).abs() <= want.abs() * 1e-6,
                        "{format:?} {isa:?}: {o} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn refuses_shapes_it_cannot_pack() {
    assert!(PackedK::from_gguf_bytes(KFormat::Q4K, &[0; 144], 1, 128).is_none());
    assert!(PackedK::from_gguf_bytes(KFormat::Q4K, &[0; 143], 1, 256).is_none());
    assert!(PackedK::from_gguf_bytes(KFormat::Q6K, &[0; 210], 2, 256).is_none());
    assert!(PackedK::from_gguf_bytes(KFormat::Q6K, &[0; 210], 1, 256).is_some());
}
