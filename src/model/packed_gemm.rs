//! The glue between candle and our own CPU matmul kernels (`q8_gemm`, `q4_gemm`, `f16_gemm`).
//!
//! Why it exists: candle runs f16/Q8_0 weights one (row, column) dot product at a time, so a
//! multi-token forward (prefill, speculative verification) re-reads every weight once per token.
//! Our kernels repack weights at load time so one weight load serves several activation rows,
//! and stay batch-invariant: every output element is computed by the same sequence of
//! operations whatever the number of rows. This module holds what they share: the weight trait,
//! and the candle custom op that calls them.

use std::sync::Arc;

use candle_core::{CpuStorage, Layout, Shape};

/// A weight `(n, k)` repacked for one of our kernels.
pub trait PackedWeight: Send + Sync {
    /// Output features (`n`).
    fn out_features(&self) -> usize;
    /// Input features (`k`).
    fn in_features(&self) -> usize;
    /// `dst (m, n) = x (m, k) · Wᵀ`.
    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]);
    /// The kernel's name, for reports.
    fn kernel_name(&self) -> &'static str;
}

/// A packed weight applied to candle tensors as a custom op.
#[derive(Clone)]
pub struct PackedLinear(pub Arc<dyn PackedWeight>);

impl candle_core::CustomOp1 for PackedLinear {
    fn name(&self) -> &'static str {
        self.0.kernel_name()
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if !layout.is_contiguous() {
            candle_core::bail!("{} input must be contiguous", self.name())
        }
        let (n, k) = (self.0.out_features(), self.0.in_features());
        let dims = layout.shape().dims();
        let cols = *dims.last().unwrap_or(&0);
        if cols != k {
            candle_core::bail!(
                "{}: input has {cols} columns, weight expects {k}",
                self.name()
            )
        }
        let m = layout.shape().elem_count() / k;
        let x = &storage.as_slice::<f32>()?[layout.start_offset()..layout.start_offset() + m * k];
        let mut dst = vec![0f32; m * n];
        self.0.matmul(x, m, &mut dst);
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank >= 1") = n;
        Ok((CpuStorage::F32(dst), Shape::from(out_dims)))
    }
}

/// Whether an x86 CPU feature set is present and the kernel is not switched off by `env_off`
/// (any non-empty value other than `0`).
pub fn enabled(env_off: &str, has_features: impl FnOnce() -> bool) -> bool {
    if std::env::var_os(env_off).is_some_and(|v| !v.is_empty() && v != "0") {
        return false;
    }
    has_features()
}
