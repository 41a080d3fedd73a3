//! The prefill price of the target model on this machine, from timing its kernels at start-up.
//!
//! Why it exists: the scheduler sizes each round's prompt chunks by what their tokens cost at
//! their depth ([`PrefillPrice`]), and that depends on how fast this machine runs the model's
//! matmuls against its attention. Both kernels are timed alone on the model's own shapes (a
//! few milliseconds), so the price needs no deep context and no speculation to exist.

use std::sync::Arc;

use crate::engine::scheduler::prefill_price::PrefillPrice;
use crate::model::decoder::op_profile::Op;
use crate::model::{Decoder, ForwardKind};

/// Timed calls per kernel; the best is kept.
const REPEATS: usize = 5;

/// The target's prefill price: its matmuls' multiply-adds per token (the output head left out:
/// a prompt's chunk needs only its last row's logits) at its matmul kernel's rate, and each
/// layer's attention multiply-adds per key at its attention kernel's rate. Flat on candle's
/// tensors (their kernels are not ours to time this way) or where a timing fails.
pub fn prefill_price(target: &Decoder) -> PrefillPrice {
    if target.forward_kind() != ForwardKind::Own {
        return PrefillPrice::flat();
    }
    let Ok(matmul_rate) = target.matmul_peak_macs_per_s(REPEATS) else {
        return PrefillPrice::flat();
    };
    let attention_rate = target.attention_macs_per_s(REPEATS);
    let weight_macs: usize = target
        .macs_per_token()
        .iter()
        .filter(|(op, _)| *op != Op::LmHead)
        .map(|&(_, macs)| macs)
        .sum();
    let hp = target.hparams();
    // A key and a value multiply-add per head dimension, every head.
    let key_macs = (2 * hp.num_heads * hp.head_dim) as f64;
    let layers: Vec<(f64, Option<usize>)> = (0..hp.num_layers)
        .map(|l| (key_macs / attention_rate, hp.window(l)))
        .collect();
    let price = PrefillPrice::new(weight_macs as f64 / matmul_rate, &layers);
    tracing::info!(
        matmul_gmacs = matmul_rate / 1e9,
        attention_gmacs = attention_rate / 1e9,
        token_at_context_len = price.relative(target.context_len().saturating_sub(1)),
        "prefill priced by depth (a token deep in the context against one at its start)"
    );
    price
}

/// [`prefill_price`] on a blocking thread: the timed kernels are forwards' work, never the
/// async runtime's.
pub(super) async fn prefill_price_off_runtime(target: &Arc<Decoder>) -> PrefillPrice {
    let target = Arc::clone(target);
    tokio::task::spawn_blocking(move || prefill_price(&target))
        .await
        .unwrap_or_else(|_| PrefillPrice::flat())
}
