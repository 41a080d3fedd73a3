//! A loaded model's first forward, checked before it serves: the logits of a few tokens must
//! be finite, and where they are not, the first layer whose output goes wrong is named.
//!
//! Why it exists: a model file can be well-formed and still wrong inside (a tensor whose data
//! does not match its type, an offset off by a byte, NaN scales). Such a model loads, and
//! without this every request would fail with non-finite logits while `/health` said ok.

use super::{Decoder, FeatureTaps, LogitsRows, ModelError, Result, SeqInput};

/// Runs `tokens` (ids the model has) through a fresh cache and checks every hidden state
/// between layers and every logit; an error names the first place a value is NaN or infinite.
pub fn check_finite_forward(model: &Decoder, tokens: &[u32]) -> Result<()> {
    let layers = model.hparams().num_layers;
    let hidden = model.hparams().hidden_size;
    let mut cache = model.new_cache(1);
    let slot = cache
        .allocate()
        .ok_or_else(|| ModelError::Cache("no slot for the start-up check".into()))?;
    let batch = [SeqInput {
        slot,
        start_pos: 0,
        tokens,
        logits: LogitsRows::All,
        parents: &[],
    }];
    // The residual stream entering every layer, and the last layer's output.
    let taps = FeatureTaps::LayerInputs((0..=layers).collect());
    let (logits, features) = model.forward_with_features(&mut cache, &batch, &taps)?;
    let states = features.seq(0);
    let width = features.hidden();
    for tap in 0..=layers {
        let bad = (0..tokens.len()).any(|t| {
            let row = &states[t * width + tap * hidden..t * width + (tap + 1) * hidden];
            row.iter().any(|v| !v.is_finite())
        });
        if bad {
            let place = match tap {
                0 => "the token embedding (token_embd / embed_tokens)".to_string(),
                l => format!("layer {} (blk.{})", l - 1, l - 1),
            };
            return Err(ModelError::NonFinite(format!(
                "{place} gives NaN or infinite values on its first forward: a tensor's data is \
                 corrupt or does not match its type"
            )));
        }
    }
    let rows = logits.seq_rows(0)?;
    if rows.iter().flatten().any(|v| !v.is_finite()) {
        return Err(ModelError::NonFinite(
            "the output norm or head (output_norm / output / lm_head) gives NaN or infinite \
             logits on its first forward: a tensor's data is corrupt or does not match its type"
                .into(),
        ));
    }
    Ok(())
}
