//! A constraint compiled against the model's vocabulary: checked against the limits first,
//! refused if it does not compile, allows no token or forces text without end, and then the
//! template each sequence's matcher starts from.

use std::sync::Arc;

use llguidance::Matcher;

use super::reasons::{matcher_reason, reached_limit};
use super::{ConstraintError, ConstraintSpec, ConstraintVocabulary, SequenceConstraint};

/// A request's compiled constraint: each sequence of the request (each of its `n` choices)
/// starts its own matcher from it.
#[derive(Clone)]
pub struct CompiledConstraint {
    template: Arc<Matcher>,
    vocab: usize,
}

impl std::fmt::Debug for CompiledConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledConstraint").finish_non_exhaustive()
    }
}

impl ConstraintVocabulary {
    /// Compiles `spec`; refuses a grammar that does not compile or allows no token at all.
    /// Checks `spec` against `limits` first: call it on a compile thread (`CompilePool`) for
    /// a request's constraint, since what passes the limits may still recurse deeply.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<CompiledConstraint, ConstraintError> {
        super::limits::check(spec)?;
        let parser = self
            .factory
            .create_parser(spec.grammar())
            .map_err(|e| compile_error(&e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(compile_error(&e));
        }
        let start = matcher
            .compute_mask()
            .map_err(|e| compile_error(&e.to_string()))?;
        if start.is_zero() {
            return Err(ConstraintError::Unsatisfiable);
        }
        probe_forced_start(&matcher)?;
        Ok(CompiledConstraint {
            template: Arc::new(matcher),
            vocab: self.vocab,
        })
    }
}

/// The most tokens a grammar may force from its start before the first choice.
const MAX_FORCED_START: usize = 4096;

/// Follows the tokens the grammar forces from its start (on a copy): a grammar that forces
/// text without end (a rule that only recurses, say) or grows too complex to run on its way
/// is refused now, rather than failing at its first tokens.
fn probe_forced_start(matcher: &Matcher) -> Result<(), ConstraintError> {
    let mut probe = matcher.deep_clone();
    let mut forced = 0;
    while !probe.is_stopped() {
        let ff = probe.compute_ff_tokens();
        if let Some(e) = probe.get_error() {
            return Err(compile_error(&e));
        }
        if ff.is_empty() {
            // The first choice: its mask is the first a sequence computes.
            probe
                .compute_mask()
                .map_err(|e| compile_error(&e.to_string()))?;
            return match probe.get_error() {
                Some(e) => Err(compile_error(&e)),
                None => Ok(()),
            };
        }
        forced += ff.len();
        if forced > MAX_FORCED_START {
            return Err(ConstraintError::Grammar(format!(
                "the grammar forces more than {MAX_FORCED_START} tokens from its start without \
                 a choice or an end"
            )));
        }
        probe
            .consume_tokens(&ff)
            .map_err(|e| compile_error(&e.to_string()))?;
    }
    Ok(())
}

/// A compile error in llguidance's words, as a limit reached or a grammar that is wrong.
fn compile_error(e: &str) -> ConstraintError {
    let line = matcher_reason(e);
    if reached_limit(&line) {
        ConstraintError::TooComplex(line)
    } else {
        ConstraintError::Grammar(line)
    }
}

impl CompiledConstraint {
    /// A fresh matcher at the start of the output.
    pub fn start(&self) -> SequenceConstraint {
        SequenceConstraint::new(self.template.deep_clone(), self.vocab)
    }
}
