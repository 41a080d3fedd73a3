//! MXFP4 weights (ggml type 39), as llama.cpp writes gpt-oss's experts: blocks of 32 4-bit
//! E2M1 values sharing one E8M0 power-of-two scale, 17 bytes a block.
//!
//! Why it exists: candle's GGUF reader refuses the whole file at the first tensor of a type
//! it does not know, so these tensors are found in the header here (`gguf_header`) and read
//! by their offsets. A block's values, doubled, are the integers `0, ±1, ±2, ±3, ±4, ±6, ±8,
//! ±12` and its scale, halved, a power of two, so each block is exactly a Q5_0 block (32
//! values `d · (q − 16)` with 5-bit `q`, and an f16 scale `d`) wherever that power of two is
//! an f16: the weights then run on the own 4/5-bit kernel (`q4_gemm`) with every value as the
//! file states it, at 22 bytes a block against the file's 17 (Q8_0 would take 34). A tensor
//! with a scale f16 cannot hold (never seen in a real file) is widened to f32 instead,
//! exactly.

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType};
use candle_core::{Device, Tensor};
use half::f16;

use crate::model::load::raw_weight::RawWeight;
use crate::model::Result;

/// ggml's number for MXFP4.
pub const GGML_TYPE_MXFP4: u32 = 39;
/// Values a block.
pub const BLOCK: usize = 32;
/// Bytes a block: the scale's exponent, then 16 bytes of nibbles (value `j` in byte `j`'s
/// low nibble, value `j + 16` in its high one).
pub const BLOCK_BYTES: usize = 17;
/// Bytes of a Q5_0 block: an f16 scale, the 32 fifth bits, 16 bytes of low nibbles.
pub const Q5_0_BYTES: usize = 22;

/// Twice the E2M1 value of each nibble (ggml's `kvalues_mxfp4`).
const DOUBLED_E2M1: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An MXFP4 tensor of a GGUF file: its dimensions (outermost first, as candle orders them)
/// and its offset in the file's tensor data.
#[derive(Clone, Debug, PartialEq)]
pub struct Mxfp4Tensor {
    pub dims: Vec<usize>,
    pub offset: u64,
}

/// The MXFP4 tensors of a GGUF file, by name.
pub type Mxfp4Tensors = std::collections::HashMap<String, Mxfp4Tensor>;

/// Bytes of `elems` MXFP4 values (`None` where they are no whole number of blocks).
pub fn bytes_of(elems: u64) -> Option<u64> {
    (elems.is_multiple_of(BLOCK as u64)).then(|| elems / BLOCK as u64 * BLOCK_BYTES as u64)
}

/// Half the block's scale, `2^(e − 128)`, bit for bit as ggml's `GGML_E8M0_TO_FP32_HALF`.
fn half_scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Element `j` of a block, doubled: an integer.
fn doubled(block: &[u8], j: usize) -> i8 {
    let nibble = match j < BLOCK / 2 {
        true => block[1 + j] & 0x0f,
        false => block[1 + j - BLOCK / 2] >> 4,
    };
    DOUBLED_E2M1[nibble as usize]
}

/// The value of element `j` of a block.
fn value(block: &[u8], j: usize) -> f32 {
    doubled(block, j) as f32 * half_scale(block[0])
}

/// The blocks as Q5_0 blocks holding the same values, or `None` where a scale with nonzero
/// values is no f16. Q5_0 (ggml's `block_q5_0`): value `j` is `d · (q_j − 16)`, `q_j`'s low
/// four bits in byte `j mod 16` (low nibble for `j < 16`, high for the rest) and its fifth in
/// bit `j` of a little-endian `u32`.
fn to_q5_0(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() / BLOCK_BYTES * Q5_0_BYTES);
    for block in bytes.chunks_exact(BLOCK_BYTES) {
        let scale = half_scale(block[0]);
        let qs: [i8; BLOCK] = std::array::from_fn(|j| doubled(block, j));
        let d = f16::from_f32(scale);
        let d = match (d.to_f32() == scale, qs.iter().all(|&q| q == 0)) {
            (true, _) => d,
            (false, true) => f16::ZERO,
            (false, false) => return None,
        };
        // Doubled E2M1 values lie in -12..=12: `q = value + 16` in 4..=28 fits 5 bits.
        let q: [u8; BLOCK] = std::array::from_fn(|j| (qs[j] + 16) as u8);
        let high = (0..BLOCK).fold(0u32, |h, j| h | (u32::from(q[j] >> 4) << j));
        out.extend_from_slice(&d.to_bits().to_le_bytes());
        out.extend_from_slice(&high.to_le_bytes());
        out.extend((0..BLOCK / 2).map(|j| (q[j] & 0x0f) | ((q[j + BLOCK / 2] & 0x0f) << 4)));
    }
    Some(out)
}

/// An `(out, inp)` weight from its MXFP4 blocks: Q5_0 blocks of the same values, or f32.
pub fn weight(bytes: &[u8], (out, inp): (usize, usize)) -> Result<RawWeight> {
    debug_assert_eq!(bytes.len(), out * inp / BLOCK * BLOCK_BYTES);
    if let Some(q5) = to_q5_0(bytes) {
        let q = qtensor_from_ggml(GgmlDType::Q5_0, &q5, vec![out, inp], &Device::Cpu)?;
        return Ok(RawWeight::Quantized(q));
    }
    let values: Vec<f32> = bytes
        .chunks_exact(BLOCK_BYTES)
        .flat_map(|b| (0..BLOCK).map(move |j| value(b, j)))
        .collect();
    Ok(RawWeight::Dense(Tensor::from_vec(
        values,
        (out, inp),
        &Device::Cpu,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block: scale exponent `e`, value `j`'s nibble `nibbles[j]`.
    fn block(e: u8, nibbles: &[u8; 32]) -> Vec<u8> {
        let mut b = vec![e];
        b.extend((0..16).map(|j| nibbles[j] | (nibbles[j + 16] << 4)));
        b
    }

    fn values(w: &RawWeight) -> Vec<f32> {
        w.dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn blocks_become_q5_0_blocks_of_exactly_their_values() {
        let nibbles: [u8; 32] = std::array::from_fn(|j| (j * 7 % 16) as u8);
        // Scales 2^-7 (a real file's), 2^-24 and 2^15 (f16's ends), and a zero block whose
        // scale f16 cannot hold.
        let mut bytes = Vec::new();
        for e in [121u8, 104, 143] {
            bytes.extend(block(e, &nibbles));
        }
        bytes.extend(block(3, &[0; 32]));
        let w = weight(&bytes, (2, 64)).unwrap();
        assert_eq!(w.src_dtype(), GgmlDType::Q5_0);
        let got = values(&w);
        let e2m1 = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for (b, e) in [121i32, 104, 143].iter().enumerate() {
            for j in 0..32 {
                let want = e2m1[nibbles[j] as usize] * 2f32.powi(e - 127);
                assert_eq!(got[b * 32 + j], want, "block {b}, value {j}");
            }
        }
        assert!(got[96..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_scale_f16_cannot_hold_is_read_as_f32() {
        let nibbles: [u8; 32] = std::array::from_fn(|j| (j % 16) as u8);
        for e in [40u8, 160] {
            let w = weight(&block(e, &nibbles), (1, 32)).unwrap();
            assert!(matches!(w, RawWeight::Dense(_)));
            let got = values(&w);
            assert_eq!(got[7], 6.0 * 2f32.powi(e as i32 - 127));
            assert_eq!(got[9], -0.5 * 2f32.powi(e as i32 - 127));
        }
    }
}
