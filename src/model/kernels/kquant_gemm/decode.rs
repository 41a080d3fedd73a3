//! GGUF K-quant super-blocks read into their integer parts (quantized values, sub-block scales
//! and minimums, the f16 super-block scales), which the tiles are packed from.

use crate::model::kernels::k_rows::QK_K;

/// One super-block of 256 values, each `d · sc[j] · q - dmin · m[j]` for the sub-block `j` it
/// falls in (Q6_K: `q` is the stored 6 bits, so its offset of 32 is `dmin = d`, `m = 32 · sc`,
/// which the kernels apply through the scales).
pub(crate) struct Decoded {
    /// The super-block scale, f16 bits.
    pub d: u16,
    /// The super-block minimum's scale, f16 bits (0 for Q6_K).
    pub dmin: u16,
    /// Sub-block scales (8 of 32 values for Q4_K and Q5_K, 16 of 16 for Q6_K).
    pub sc: [i8; 16],
    /// Sub-block minimums (Q4_K and Q5_K).
    pub m: [u8; 8],
    /// The 256 unsigned quantized values.
    pub q: [u8; QK_K],
}

impl Decoded {
    fn new(d: u16, dmin: u16) -> Self {
        Self {
            d,
            dmin,
            sc: [0; 16],
            m: [0; 8],
            q: [0; QK_K],
        }
    }
}

/// Q4_K's 12 bytes of 6-bit scales and minimums: sub-block `j`'s pair.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

fn f16_bits(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

/// A Q4_K block (144 bytes: d, dmin, 12 bytes of scales, 128 of nibbles): each 64 values
/// are 32 bytes, the first 32 values in their low nibbles, the next 32 in the high ones.
pub(crate) fn q4_k(b: &[u8]) -> Decoded {
    with_minimums(b, &b[16..144], None)
}

/// A Q5_K block (176 bytes: d, dmin, 12 bytes of scales, 32 of high bits, 128 of nibbles):
/// Q4_K's layout, value `l` of the `i`-th 32 adding bit `i` of high byte `l` as 16.
pub(crate) fn q5_k(b: &[u8]) -> Decoded {
    with_minimums(b, &b[48..176], Some(&b[16..48]))
}

/// Q4_K's and Q5_K's shared layout: the scales and minimums after `d` and `dmin`, then the
/// nibbles `qs` and, for Q5_K, the fifth bits `qh`.
fn with_minimums(b: &[u8], qs: &[u8], qh: Option<&[u8]>) -> Decoded {
    let mut out = Decoded::new(f16_bits(&b[0..]), f16_bits(&b[2..]));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        (out.sc[j], out.m[j]) = (sc as i8, m);
    }
    for chunk in 0..4 {
        for l in 0..32 {
            let byte = qs[chunk * 32 + l];
            let high = |bit: usize| qh.map_or(0, |qh| ((qh[l] >> bit) & 1) << 4);
            out.q[chunk * 64 + l] = (byte & 0xf) | high(2 * chunk);
            out.q[chunk * 64 + 32 + l] = (byte >> 4) | high(2 * chunk + 1);
        }
    }
    out
}

/// A Q6_K block (210 bytes: 128 of low nibbles, 64 of high bit pairs, 16 signed scales, d):
/// each 128 values take 64 low bytes and 32 high ones, value `32 · k + l` (k < 4, l < 32)
/// the low or high nibble of low byte `l` or `l + 32` and bits `2k` of high byte `l`.
pub(crate) fn q6_k(b: &[u8]) -> Decoded {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let mut out = Decoded::new(f16_bits(&b[208..]), 0);
    for (s, &v) in out.sc.iter_mut().zip(scales) {
        *s = v as i8;
    }
    for half in 0..2 {
        let (ql, qh) = (&ql[half * 64..], &qh[half * 32..]);
        for l in 0..32 {
            let at = half * 128 + l;
            let high = |k: usize| ((qh[l] >> (2 * k)) & 3) << 4;
            out.q[at] = (ql[l] & 0xf) | high(0);
            out.q[at + 32] = (ql[l + 32] & 0xf) | high(1);
            out.q[at + 64] = (ql[l] >> 4) | high(2);
            out.q[at + 96] = (ql[l + 32] >> 4) | high(3);
        }
    }
    out
}
