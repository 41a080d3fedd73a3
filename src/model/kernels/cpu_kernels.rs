//! Which instruction sets tandem's kernels run on, said once at start.
//!
//! Why it exists: one binary serves every x86-64 CPU, each kernel choosing its path at run
//! time (`packed_gemm::enabled`). An operator needs to see which paths this machine got, and a
//! CPU without AVX2, which runs everything on portable code, must be warned about.

use crate::model::kernels::packed_gemm::{enabled, has_avx2_fma};
use crate::model::kernels::tile_driver::DotIsa;

/// What tandem says when its kernels run without AVX2.
pub const PORTABLE_WARNING: &str = "CPU kernels: portable (this CPU lacks AVX2/FMA/F16C, or \
     TANDEM_DISABLE_AVX2 is set): candle's matmuls and scalar attention, about 10x slower";

/// The vector instructions the kernels use on this CPU, for the start-up log: e.g.
/// `"AVX2+FMA+F16C, AVX-512F, AVX-512 VNNI"`, or `None` when they run without AVX2 (the CPU
/// lacks it, or `TANDEM_DISABLE_AVX2` is set).
pub fn vector_level() -> Option<String> {
    if !crate::model::kernels::f16_gemm::available()
        && !enabled("TANDEM_DISABLE_AVX2", has_avx2_fma)
    {
        return None;
    }
    let mut parts = vec!["AVX2+FMA+F16C"];
    if crate::model::kernels::f16_gemm::wide_available() {
        parts.push("AVX-512F");
    }
    let dot = DotIsa::best();
    if dot != DotIsa::Avx2 {
        parts.push(dot.name());
    }
    Some(parts.join(", "))
}
