//! Draft heads: one decoder layer that drafts from the target's own hidden states (EAGLE, and
//! EAGLE-3: see `eagle3`).
//!
//! A head's input at position `t` is `fc([embed(x(t+1)), f(t)])`: the target's embedding of
//! the token that follows `t` and the target's last hidden state at `t` (after the final norm,
//! what the output head reads). One Llama layer (its input taken as it is, no norm) turns it
//! into a state that stands in for `f(t+1)`, which the target's output head, or its rows of a
//! reduced draft vocabulary, turns into the draft's logits; that state is also the next
//! position's input feature while a chain is drafted. The head keeps its own one-layer KV
//! cache, in slots like the target's.
//!
//! It exists as its own type (not a one-layer `Decoder`) because its input is not a token and its
//! output head is borrowed: the target's embedding and output weights are read from the target
//! at every step, so a head file holds only its own layer and projection.

mod checkpoint;
mod draft_head;
pub mod eagle3;
mod init;
mod tensors;
pub mod train;

pub use checkpoint::{load_head, save_head};
pub use draft_head::{DraftHead, HeadStep};
pub use eagle3::Eagle3Parts;
pub use tensors::{default_head_dir, head_hparams, HeadTensors, DEFAULT_HEAD};
