//! The model's vocabulary as llguidance sees it: every token's bytes, special tokens marked,
//! the end-of-sequence tokens, and the tokenizer for forced bytes. Built once per model, from
//! tandem's own tokenizer, so GGUF and Hugging Face models work alike.

use std::sync::Arc;

use llguidance::api::ParserLimits;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;

use super::ConstraintError;
use crate::model::TextTokenizer;

/// What every constrained request of one model compiles against.
pub struct ConstraintVocabulary {
    pub(super) factory: ParserFactory,
    pub(super) vocab: usize,
}

impl std::fmt::Debug for ConstraintVocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintVocabulary")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

/// The tokenizer behind llguidance's forced tokens.
struct TokenizerEnvironment {
    trie: TokTrie,
    tokenizer: Arc<TextTokenizer>,
}

impl TokenizerEnv for TokenizerEnvironment {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// llguidance's own limits, set here rather than inherited so they are this server's choice
/// (docs/api.md, "Can a constraint hurt the server?", lists them). Each bounds the work of one compile or one token's mask;
/// a grammar past one is refused at compile time (400) or, found while generating, ends its
/// own sequence only.
fn set_limits(l: &mut ParserLimits) {
    // Earley items in one row: a row holds every alternative open at one position, so an
    // object's optional properties (each a branch) and wide alternations fill it.
    l.max_items_in_row = 2_000;
    // Lexer work building a grammar's lexemes (about 50 per microsecond), and per mask.
    l.initial_lexer_fuel = 1_000_000;
    l.step_lexer_fuel = 200_000;
    l.step_max_items = 50_000;
    l.max_lexer_states = 250_000;
    // Symbols in the grammar's productions (a few megabytes of schema).
    l.max_grammar_size = 500_000;
    l.precompute_large_lexemes = true;
    // Errors go to clients and logs: the reason, not the grammar and the parser's state.
    l.verbose_errors = false;
}

impl ConstraintVocabulary {
    /// The vocabulary of a model whose logits rows have `vocab` entries (a model may pad its
    /// output head past the tokenizer's ids: those tokens are never allowed).
    pub fn new(tokenizer: Arc<TextTokenizer>, vocab: usize) -> Result<Self, ConstraintError> {
        let known = tokenizer.vocab_size();
        let mut words = Vec::with_capacity(vocab.max(known));
        for id in 0..vocab.max(known) as u32 {
            if id as usize >= known {
                words.push(Vec::new());
                continue;
            }
            let bytes = tokenizer
                .token_bytes(id)
                .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
            words.push(if tokenizer.is_special(id) {
                // llguidance's marker for a special token: never matched by text.
                let mut w = Vec::with_capacity(bytes.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(&bytes);
                w
            } else {
                bytes
            });
        }
        let eos = tokenizer.eos_ids();
        let Some(&first_eos) = eos.first() else {
            return Err(ConstraintError::Vocabulary(
                "the model has no end-of-sequence token, so no grammar could end".into(),
            ));
        };
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(TokenizerEnvironment { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        set_limits(factory.limits_mut());
        Ok(Self {
            factory,
            vocab: words.len(),
        })
    }

    /// Entries of a mask (the model's logits width).
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}
