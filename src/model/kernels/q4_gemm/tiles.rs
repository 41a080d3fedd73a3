//! The tiles the 4-bit kernel reads: the GGUF block formats it takes, one tile's layout (16
//! output columns of one 32-value block, in exactly the file's bytes), and packing a weight's
//! blocks into tiles, MXFP4's Q5_0 blocks into 4-bit codes where they allow it.

use half::f16;

use crate::model::kernels::tile_driver::{QK, TILE_N};

/// One 32-value block of 16 output columns: per-column scales and minimums (f16 bits, as in
/// the file), then four 64-byte vectors. Vector `p` holds value group `2p` (values `4 · 2p..`
/// of the block) in its low nibbles and group `2p + 1` in its high ones, each laid out
/// `[column (16)][4 values]`; its two 32-byte halves are the tiles of columns 0-7 and 8-15 that
/// a 256-bit kernel takes one at a time. `H` is the bytes of fifth bits (0 for 4-bit formats,
/// 64 for 5-bit ones: byte `[column][value]` holds group `g`'s fifth bit in bit `g`).
#[repr(C, align(64))]
#[derive(Clone)]
pub(super) struct Tile<const H: usize> {
    pub(super) scales: [u16; TILE_N],
    pub(super) mins: [u16; TILE_N],
    pub(super) qs: [u8; QK * TILE_N / 2],
    pub(super) qh: [u8; H],
}

/// The GGUF 32-value block types this kernel packs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q4Format {
    /// f16 scale, 16 bytes of nibbles; value `d · (q - 8)`.
    Q4_0,
    /// f16 scale, f16 minimum, 16 bytes of nibbles; value `d · q + m`.
    Q4_1,
    /// f16 scale, 4 bytes of fifth bits, 16 bytes of nibbles; value `d · (q - 16)`.
    Q5_0,
    /// f16 scale, f16 minimum, 4 bytes of fifth bits, 16 bytes of nibbles; `d · q + m`.
    Q5_1,
}

impl Q4Format {
    /// Bytes before the nibbles: the scale, the minimum (Q4_1, Q5_1), the fifth bits.
    pub(super) fn header_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 2,
            Self::Q4_1 => 4,
            Self::Q5_0 => 6,
            Self::Q5_1 => 8,
        }
    }

    /// The minimum as a multiple of the scale for formats that store none (`-8`, `-16`).
    fn implied_min(self) -> Option<f32> {
        match self {
            Self::Q4_0 => Some(-8.0),
            Self::Q5_0 => Some(-16.0),
            Self::Q4_1 | Self::Q5_1 => None,
        }
    }

    pub(super) fn five_bits(self) -> bool {
        matches!(self, Self::Q5_0 | Self::Q5_1)
    }
}

/// One format's tiles: column tile `t`'s block `b` at `t · (k / 32) + b`.
pub(super) struct Tiles<const H: usize> {
    pub(super) tiles: Vec<Tile<H>>,
    pub(super) n: usize,
    pub(super) k: usize,
}

/// MXFP4's E2M1 values doubled (integers), by 4-bit code, plus 12: unsigned, at most 24. A
/// tile of codes is `d · lookup[code] − 12 d`.
pub(super) const E2M1_LOOKUP: [u8; 16] =
    [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// The code of a doubled E2M1 value, if it is one.
fn e2m1_code(value: i32) -> Option<u8> {
    let code = E2M1_LOOKUP.iter().position(|&l| l as i32 - 12 == value)?;
    Some(code as u8)
}

/// Q5_0 tiles as E2M1 codes, when every value `q − 16` is a doubled E2M1 value and every
/// minimum `−12 d` is exact in f16: the same weights, read from 4 bits a value.
pub(super) fn as_e2m1(t: &Tiles<64>) -> Option<Tiles<0>> {
    let kb = t.k / QK;
    let mut out = Vec::with_capacity(t.tiles.len());
    for (index, tile) in t.tiles.iter().enumerate() {
        // Columns past `n` pad the last tile: zeros, left as zeros.
        let cols = (t.n - index / kb * TILE_N).min(TILE_N);
        let mut codes = Tile::<0> {
            scales: tile.scales,
            mins: [0; TILE_N],
            qs: [0; QK * TILE_N / 2],
            qh: [],
        };
        for c in 0..cols {
            let d = f16::from_bits(tile.scales[c]).to_f32();
            let m = f16::from_f32(-12.0 * d);
            if m.to_f32() != -12.0 * d {
                return None;
            }
            codes.mins[c] = m.to_bits();
        }
        // Byte `(g / 2) · 64 + c · 4 + j` holds groups g and g + 1 of (column c, value j); the
        // fifth bits of both are bits g and g + 1 of `qh[c · 4 + j]`.
        for (byte, &q) in tile.qs.iter().enumerate() {
            if (byte % 64) / 4 >= cols {
                continue;
            }
            let high = tile.qh[byte % 64];
            let mut packed = 0u8;
            for half in 0..2 {
                let g = 2 * (byte / 64) + half;
                let q5 = ((q >> (4 * half)) & 0x0f) | (((high >> g) & 1) << 4);
                packed |= e2m1_code(q5 as i32 - 16)? << (4 * half);
            }
            codes.qs[byte] = packed;
        }
        out.push(codes);
    }
    Some(Tiles {
        tiles: out,
        n: t.n,
        k: t.k,
    })
}

/// Every column's blocks of `bytes` in tiles.
pub(super) fn pack<const H: usize>(
    format: Q4Format,
    bytes: &[u8],
    n: usize,
    k: usize,
) -> Option<Tiles<H>> {
    let (kb, header) = (k / QK, format.header_bytes());
    let block_bytes = header + QK / 2;
    let zero = Tile::<H> {
        scales: [0; TILE_N],
        mins: [0; TILE_N],
        qs: [0; QK * TILE_N / 2],
        qh: [0; H],
    };
    let mut tiles = vec![zero; n.div_ceil(TILE_N) * kb];
    for col in 0..n {
        let (t, c) = (col / TILE_N, col % TILE_N);
        for b in 0..kb {
            let blk = &bytes[(col * kb + b) * block_bytes..(col * kb + b + 1) * block_bytes];
            let tile = &mut tiles[t * kb + b];
            tile.scales[c] = u16::from_le_bytes([blk[0], blk[1]]);
            tile.mins[c] = match format.implied_min() {
                Some(factor) => {
                    // Exact in f16 (a power-of-two multiple) unless it overflows.
                    let d = f16::from_bits(tile.scales[c]).to_f32();
                    let m = f16::from_f32(factor * d);
                    if m.to_f32() != factor * d {
                        return None;
                    }
                    m.to_bits()
                }
                None => u16::from_le_bytes([blk[2], blk[3]]),
            };
            // GGUF keeps value i in the low nibble of byte i and value i + 16 in the high
            // nibble of byte i; a 5-bit format's fifth bit of value i is bit i of the 32-bit
            // word before the nibbles.
            let nibble = |i: usize| {
                let byte = blk[header + i % 16];
                if i < 16 {
                    byte & 0x0f
                } else {
                    byte >> 4
                }
            };
            let high = if H > 0 {
                u32::from_le_bytes(blk[header - 4..header].try_into().expect("4 bytes"))
            } else {
                0
            };
            for i in 0..QK {
                let (g, j) = (i / 4, i % 4);
                tile.qs[(g / 2) * 64 + c * 4 + j] |= nibble(i) << (4 * (g % 2));
                if H > 0 {
                    tile.qh[c * 4 + j] |= (((high >> i) & 1) as u8) << g;
                }
            }
        }
    }
    Some(Tiles { tiles, n, k })
}
