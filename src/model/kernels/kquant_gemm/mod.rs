//! A batch-invariant matrix multiply for llama.cpp's K-quant weights (Q4_K, Q5_K, Q6_K) on x86
//! CPUs with AVX2, FMA and F16C: what a `Q4_K_M`, `Q5_K_M` or `Q6_K` file holds, multiplied
//! as the file stores it.
//!
//! Why it exists: candle's K-quant matmul computes one (row, column) dot product at a time, so
//! a verification of γ drafts re-reads every weight γ + 1 times, and a K-quant file ran at
//! half its memory bound where our 4-bit kernel makes a 4-token verification cost a step.
//! Weights are repacked at load into tiles of 16 output columns, one 256-value super-block each
//! (`min_k` for Q4_K and Q5_K, `q6_k` for Q6_K say how), in the file's exact numbers; the
//! activations are quantized once per matmul as ggml's Q8_K (`k_rows`), and the tile driver
//! serves up to 12 rows a weight load. Every output element is computed by the same integer
//! sums and the same two f32 steps a super-block whatever the number of rows (batch
//! invariance), and the AVX2, AVX-VNNI and AVX-512 VNNI kernels give the same bits.

pub(crate) mod decode;
pub(crate) mod grid;
pub(crate) mod min_k;
pub(crate) mod q6_k;

use std::sync::OnceLock;

use crate::model::kernels::k_rows::{with_k_quantized, QK_K};
use crate::model::kernels::packed_gemm::{self, PackedWeight};
use crate::model::kernels::tile_driver::{DotIsa, TILE_N};
use grid::Grid;
use min_k::{Q4KTile, Q5KTile};
use q6_k::Q6KTile;

/// The GGUF K-quant types this kernel packs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KFormat {
    Q4K,
    Q5K,
    Q6K,
}

impl KFormat {
    /// Bytes of one 256-value block in a GGUF file.
    fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }
}

enum Tiles {
    Q4K(Grid<Q4KTile>),
    Q5K(Grid<Q5KTile>),
    Q6K(Grid<Q6KTile>),
}

/// K-quant weights `(n, k)` packed for [`PackedK::matmul`].
pub struct PackedK {
    tiles: Tiles,
    format: KFormat,
    n: usize,
    k: usize,
}

/// Whether this CPU runs the kernel (and `TANDEM_DISABLE_KQUANT_GEMM` is not set).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        packed_gemm::enabled("TANDEM_DISABLE_KQUANT_GEMM", packed_gemm::has_avx2_fma)
    })
}

/// Packs every column's super-blocks of `bytes` into tiles made by `zero` and filled by `put`.
fn pack<T: Clone>(
    format: KFormat,
    bytes: &[u8],
    (n, k): (usize, usize),
    zero: T,
    put: impl Fn(&mut T, usize, &[u8]),
) -> Grid<T> {
    let (kb, bb) = (k / QK_K, format.block_bytes());
    let mut tiles = vec![zero; n.div_ceil(TILE_N) * kb];
    for col in 0..n {
        let (t, c) = (col / TILE_N, col % TILE_N);
        for b in 0..kb {
            put(
                &mut tiles[t * kb + b],
                c,
                &bytes[(col * kb + b) * bb..][..bb],
            );
        }
    }
    Grid { tiles, n, k }
}

impl PackedK {
    /// Packs raw GGUF bytes of an `(n, k)` weight; `None` if the shape does not fit (k not a
    /// multiple of 256, or not as many bytes as the shape takes).
    pub fn from_gguf_bytes(format: KFormat, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if k == 0 || !k.is_multiple_of(QK_K) || bytes.len() != n * (k / QK_K) * format.block_bytes()
        {
            return None;
        }
        let shape = (n, k);
        let tiles = match format {
            KFormat::Q4K => Tiles::Q4K(pack(format, bytes, shape, Q4KTile::zero(), |t, c, b| {
                t.put(c, &decode::q4_k(b))
            })),
            KFormat::Q5K => Tiles::Q5K(pack(format, bytes, shape, Q5KTile::zero(), |t, c, b| {
                t.put(c, &decode::q5_k(b))
            })),
            KFormat::Q6K => Tiles::Q6K(pack(format, bytes, shape, Q6KTile::zero(), |t, c, b| {
                t.put(c, &decode::q6_k(b))
            })),
        };
        Some(Self {
            tiles,
            format,
            n,
            k,
        })
    }

    pub fn format(&self) -> KFormat {
        self.format
    }

    /// [`PackedWeight::matmul`] on the kernel for `isa` (which the CPU must have).
    pub(crate) fn matmul_on(&self, x: &[f32], m: usize, dst: &mut [f32], isa: DotIsa) {
        assert!(available(), "kquant_gemm needs AVX2, FMA and F16C");
        assert_eq!(x.len(), m * self.k);
        assert_eq!(dst.len(), m * self.n);
        with_k_quantized(x, m, |q| match &self.tiles {
            Tiles::Q4K(g) => min_k::run(g, q, m, dst, isa),
            Tiles::Q5K(g) => min_k::run(g, q, m, dst, isa),
            Tiles::Q6K(g) => q6_k::run(g, q, m, dst, isa),
        })
    }
}

impl PackedWeight for PackedK {
    fn out_features(&self) -> usize {
        self.n
    }

    fn in_features(&self) -> usize {
        self.k
    }

    fn kernel_name(&self) -> &'static str {
        "kquant-gemm"
    }

    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        self.matmul_on(x, m, dst, DotIsa::best())
    }
}

#[cfg(test)]
mod tests;
