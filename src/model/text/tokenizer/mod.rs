//! Text <-> token ids for the models we serve, from either a Hugging Face folder
//! (`tokenizer.json`) or the tokenizer embedded in a GGUF file.
//!
//! The `tokenizers` crate does the BPE work; this module exists because the surrounding
//! facts a server needs are scattered and easy to get subtly wrong:
//!
//! * GGUF only names its pre-tokenizer (`tokenizer.ggml.pre`). Guessing a default for an
//!   unknown name silently produces different token ids than the model was trained on (the
//!   classic symptom: a leading "Ġ" token before the first word), so the pre-tokenizer comes
//!   from an explicit table mirroring llama.cpp, and anything else is refused.
//! * A model has several end-of-generation tokens (`<|im_end|>` *and* `<|endoftext|>`,
//!   `<|eot_id|>` *and* `<|eom_id|>`), but configs usually name only one; stopping on just
//!   that one lets the model run on past its turn.
//! * Whether to prepend BOS is a per-model property (Llama 3 wants it, SmolLM2 does not).
//! * Streaming must never emit half a UTF-8 character, which byte-level BPE tokens routinely
//!   end in ([`IncrementalDecoder`]).
//!
//! `hf` loads a Hugging Face folder, `gguf` builds the tokenizer from GGUF metadata, and
//! `incremental` turns a stream of ids into text; `text_tokenizer` holds what both loaders
//! produce, `error` what they can fail with.

mod error;
mod gguf;
mod hf;
mod incremental;
mod literal;
mod spm;
mod text_tokenizer;
mod token_bytes;

pub use error::TokenizerError;
pub use incremental::IncrementalDecoder;
pub use literal::literal_marker;
pub use text_tokenizer::TextTokenizer;

/// Token texts that end generation when the model has them as special (control) tokens.
/// Configs typically declare only one end id; llama.cpp uses the same list to find the rest.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "</s>",
    "<end_of_turn>",
    // gpt-oss (harmony): the answer is done, or a tool is called. Its `<|end|>` only ends one
    // message of an answer, so it is not here.
    "<|return|>",
    "<|call|>",
];
