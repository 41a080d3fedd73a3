//! Where a forward's time goes, by kind of operation: the per-operation breakdown of
//! `tandem forward-bench`.
//!
//! Why it exists: the cost of a verified token is the sum of what each operation adds for one
//! more row, and only a breakdown says which operation is far from what the machine allows.
//! Off by default; when off, an operation costs one relaxed atomic load more. The totals are
//! process-wide (the bench runs one forward at a time).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A kind of operation in the forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Token embeddings looked up.
    Embed,
    /// RMS norms (before attention, before the MLP, before the head).
    Norm,
    /// The fused q/k/v projection.
    QkvMatmul,
    /// Rotary embeddings of queries and keys.
    Rope,
    /// Keys and values appended to the cache.
    CacheWrite,
    /// Attention over the cache.
    Attention,
    /// The attention output projection.
    OutMatmul,
    /// The fused gate/up projection.
    GateUpMatmul,
    /// SiLU gating and the residual adds.
    Elementwise,
    /// The MLP down projection.
    DownMatmul,
    /// A mixture of experts' router: its logits, the choice of experts, and the gathering
    /// and weighted adding of rows around the experts' matmuls.
    Router,
    /// The output head (logits).
    LmHead,
}

impl Op {
    pub const ALL: [Op; 12] = [
        Op::Embed,
        Op::Norm,
        Op::QkvMatmul,
        Op::Rope,
        Op::CacheWrite,
        Op::Attention,
        Op::OutMatmul,
        Op::GateUpMatmul,
        Op::Elementwise,
        Op::DownMatmul,
        Op::Router,
        Op::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Embed => "embedding",
            Op::Norm => "rms norms",
            Op::QkvMatmul => "q/k/v matmul",
            Op::Rope => "rope",
            Op::CacheWrite => "cache append",
            Op::Attention => "attention",
            Op::OutMatmul => "output-projection matmul",
            Op::GateUpMatmul => "gate/up matmul",
            Op::Elementwise => "SiLU and residuals",
            Op::DownMatmul => "down matmul",
            Op::Router => "expert routing",
            Op::LmHead => "lm_head matmul",
        }
    }

    /// Whether the operation is a matmul over a weight matrix.
    pub fn is_matmul(self) -> bool {
        matches!(
            self,
            Op::QkvMatmul
                | Op::OutMatmul
                | Op::GateUpMatmul
                | Op::DownMatmul
                | Op::Router
                | Op::LmHead
        )
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; Op::ALL.len()] = [const { AtomicU64::new(0) }; Op::ALL.len()];

/// Starts (or stops) accounting, from zero.
pub fn enable(on: bool) {
    for n in &NANOS {
        n.store(0, Ordering::Relaxed);
    }
    ON.store(on, Ordering::Relaxed);
}

/// Seconds spent in each operation since accounting started, and resets them.
pub fn take() -> Vec<(Op, f64)> {
    Op::ALL
        .iter()
        .map(|&op| {
            let ns = NANOS[op as usize].swap(0, Ordering::Relaxed);
            (op, ns as f64 * 1e-9)
        })
        .collect()
}

/// Runs `f`, charging its time to `op` when accounting is on.
#[inline]
pub fn timed<R>(op: Op, f: impl FnOnce() -> R) -> R {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    let t = Instant::now();
    let r = f();
    NANOS[op as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_is_charged_only_while_on() {
        enable(false);
        timed(Op::Rope, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        enable(true);
        assert!(take().iter().all(|&(_, s)| s == 0.0));
        timed(Op::Attention, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        let t = take();
        let attn = t.iter().find(|(op, _)| *op == Op::Attention).unwrap().1;
        assert!(attn >= 0.002, "{attn}");
        assert!(take().iter().all(|&(_, s)| s == 0.0), "take resets");
        enable(false);
    }
}
