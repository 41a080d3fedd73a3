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

/// The CPU's model name as the kernel reports it (`/proc/cpuinfo`'s `model name`), or the
/// architecture where there is none: what a benchmark record and a remembered price table
/// name the machine by.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The vector instructions the kernels use on this CPU, for the start-up log: e.g.
/// `"AVX2+FMA+F16C, AVX-512F, AVX-512 VNNI"`, or `None` when they run without AVX2 (the CPU
/// lacks it, or `TANDEM_DISABLE_AVX2` is set).
pub fn vector_level() -> Option<String> {
    if !crate::model::kernels::float_gemm::available()
        && !enabled("TANDEM_DISABLE_AVX2", has_avx2_fma)
    {
        return None;
    }
    let mut parts = vec!["AVX2+FMA+F16C"];
    if crate::model::kernels::float_gemm::wide_available() {
        parts.push("AVX-512F");
    }
    let dot = DotIsa::best();
    if dot != DotIsa::Avx2 {
        parts.push(dot.name());
    }
    if crate::model::kernels::attention::bf16_kernels_available() {
        parts.push("AVX-512 BF16");
    }
    Some(parts.join(", "))
}
