//! A q8_0 layer buffer: keys or values rounded once, as they are appended, to a signed byte
//! per element and an f32 scale per block of 32, so a deep cache is about a quarter of f32's
//! bytes (9 bits an element) and attention reads that much less.
//!
//! The rounding is fixed arithmetic on the appended f32 values (the block's largest magnitude
//! over 127, rounded to f16; each element divided by it and rounded to the nearest integer,
//! ties away from zero), so a token's cached values are the same bits however it was batched.
//! The scale is an f16 value kept as f32: a byte times it is then exact in f32, which is what
//! lets every attention path widen an element to the same number.

use half::f16;

use crate::model::kernels::attention::Q8Rows;

/// Elements per scale.
pub(super) const BLOCK: usize = Q8Rows::BLOCK;

/// One layer's keys or values as q8_0, `quants.len()` a multiple of [`BLOCK`].
#[derive(Default)]
pub(super) struct Q8Buf {
    pub(super) quants: Vec<i8>,
    pub(super) scales: Vec<f32>,
}

impl Q8Buf {
    pub(super) fn len(&self) -> usize {
        self.quants.len()
    }

    pub(super) fn rows(&self) -> Q8Rows<'_> {
        Q8Rows::new(&self.quants, &self.scales)
    }

    pub(super) fn truncate(&mut self, len: usize) {
        debug_assert!(len.is_multiple_of(BLOCK));
        self.quants.truncate(len);
        self.scales.truncate(len / BLOCK);
    }

    pub(super) fn reserve_total(&mut self, want: usize) {
        if self.quants.capacity() < want {
            self.quants.reserve_exact(want - self.quants.len());
            let blocks = want.div_ceil(BLOCK);
            self.scales.reserve_exact(blocks - self.scales.len());
        }
    }

    pub(super) fn capacity_bytes(&self) -> usize {
        self.quants.capacity() + 4 * self.scales.capacity()
    }

    /// Copies row `from` (of `dim` elements, a multiple of [`BLOCK`]) over row `to`.
    pub(super) fn move_row(&mut self, dim: usize, from: usize, to: usize) {
        self.quants
            .copy_within(from * dim..(from + 1) * dim, to * dim);
        let b = dim / BLOCK;
        self.scales.copy_within(from * b..(from + 1) * b, to * b);
    }

    /// Elements `a..b` (block boundaries), in a buffer of exactly that size.
    pub(super) fn copy_range(&self, a: usize, b: usize) -> Q8Buf {
        Q8Buf {
            quants: self.quants[a..b].to_vec(),
            scales: self.scales[a / BLOCK..b / BLOCK].to_vec(),
        }
    }

    /// Keeps elements `..at` (a block boundary; the memory shrunk to them) and returns the rest.
    pub(super) fn split_off(&mut self, at: usize) -> Q8Buf {
        let tail = Q8Buf {
            quants: self.quants.split_off(at),
            scales: self.scales.split_off(at / BLOCK),
        };
        self.quants.shrink_to_fit();
        self.scales.shrink_to_fit();
        tail
    }

    /// Appends the first `n` elements (a block boundary) of `src`.
    pub(super) fn extend_same(&mut self, src: &Q8Buf, n: usize) {
        self.quants.extend_from_slice(&src.quants[..n]);
        self.scales.extend_from_slice(&src.scales[..n / BLOCK]);
    }

    /// Appends `src` (whole blocks) rounded to q8_0.
    pub(super) fn extend(&mut self, src: &[f32]) {
        assert!(
            src.len().is_multiple_of(BLOCK),
            "q8_0 rows are whole blocks"
        );
        for block in src.chunks_exact(BLOCK) {
            let scale = block_scale(block);
            self.scales.push(scale);
            self.quants
                .extend(block.iter().map(|&x| quantize(x, scale)));
        }
    }
}

/// A block's scale: its largest magnitude over 127, rounded to f16 (0 for a block of zeros).
/// A block holding a non-finite value gets a NaN scale, so the forward's finiteness check
/// still sees it.
fn block_scale(block: &[f32]) -> f32 {
    if !block.iter().all(|x| x.is_finite()) {
        return f32::NAN;
    }
    let amax = block.iter().fold(0f32, |m, &x| m.max(x.abs()));
    f16::from_f32(amax / 127.0).to_f32()
}

fn quantize(x: f32, scale: f32) -> i8 {
    if scale == 0.0 || scale.is_nan() {
        return 0;
    }
    (x / scale).round().clamp(-127.0, 127.0) as i8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::attention::KvRows;

    #[test]
    fn elements_round_to_their_block_scale_within_half_a_step() {
        let src: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut buf = Q8Buf::default();
        buf.extend(&src);
        assert_eq!((buf.quants.len(), buf.scales.len()), (96, 3));
        let rows = buf.rows();
        for (b, block) in src.chunks_exact(BLOCK).enumerate() {
            let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = buf.scales[b];
            assert_eq!(scale, f16::from_f32(amax / 127.0).to_f32());
            for (i, &x) in block.iter().enumerate() {
                let got = rows.get(b * BLOCK + i);
                assert!((got - x).abs() <= 0.5 * scale * 1.0001, "{x} -> {got}");
                // The element is the scale times a byte, exactly.
                assert_eq!(got as f64, scale as f64 * buf.quants[b * BLOCK + i] as f64);
            }
        }
        // The largest magnitude lands on ±127 (or next to it, the scale being rounded).
        assert!(buf.quants.iter().any(|q| q.unsigned_abs() >= 126));
    }

    #[test]
    fn zeros_and_non_finite_blocks_are_kept_recognisable() {
        let mut src = vec![0f32; 64];
        src[40] = f32::INFINITY;
        let mut buf = Q8Buf::default();
        buf.extend(&src);
        assert_eq!(buf.scales[0], 0.0);
        assert!(buf.rows().get(3) == 0.0);
        assert!(buf.scales[1].is_nan());
        assert!(buf.rows().get(40).is_nan());
    }

    #[test]
    fn ranges_splits_and_rows_keep_their_scales() {
        let src: Vec<f32> = (0..128)
            .map(|i| (i as f32).sin() * (1 + i / 32) as f32)
            .collect();
        let mut buf = Q8Buf::default();
        buf.extend(&src);
        let whole: Vec<f32> = (0..128).map(|i| buf.rows().get(i)).collect();
        let part = buf.copy_range(32, 96);
        assert_eq!(
            (0..64).map(|i| part.rows().get(i)).collect::<Vec<_>>(),
            whole[32..96]
        );
        let mut joined = Q8Buf::default();
        joined.extend_same(&buf, 64);
        let tail = buf.split_off(64);
        joined.extend_same(&tail, 64);
        assert_eq!(
            (0..128).map(|i| joined.rows().get(i)).collect::<Vec<_>>(),
            whole
        );
        joined.move_row(64, 0, 1);
        assert_eq!(joined.rows().get(64 + 5), whole[5]);
        assert_eq!(joined.rows().skip(64).get(5), whole[5]);
        joined.truncate(64);
        assert_eq!((joined.len(), joined.scales.len()), (64, 2));
    }
}
