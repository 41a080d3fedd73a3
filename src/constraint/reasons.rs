//! llguidance's errors in a client's words: the reason without the grammar and parser state
//! its messages can carry, its bare stop-reason names in plain words, and whether a message
//! says a limit was reached (the grammar's doing) rather than a grammar that is wrong.

use llguidance::api::StopReason;

/// Phrases of llguidance's errors for a grammar past its limits (`ParserLimits`, the lexer's
/// and regex builder's budgets) rather than a wrong one.
const LIMIT_PHRASES: [&str; 7] = [
    "fuel",
    "items; max is",
    "too many",
    "too large",
    "too big",
    "max_items_in_row",
    "limit",
];

/// Whether an error of llguidance's says a limit was reached.
pub(super) fn reached_limit(e: &str) -> bool {
    let lower = e.to_lowercase();
    LIMIT_PHRASES.iter().any(|p| lower.contains(p))
}

/// llguidance's errors can carry the whole grammar after the first line; a client needs the
/// reason.
pub(super) fn first_line(e: &str) -> String {
    e.lines().next().unwrap_or(e).trim().to_string()
}

/// A matcher's error as a client may read it: its first line, and where that is only the name
/// of llguidance's stop reason (all it says when it stops without a message of its own), the
/// reason in plain words.
pub(super) fn matcher_reason(e: &str) -> String {
    let line = first_line(e);
    let Ok(reason) = serde_json::from_value::<StopReason>(serde_json::Value::String(line.clone()))
    else {
        return line;
    };
    // Exhaustive, so a reason a new llguidance adds gets its words here before it can reach a
    // client as a bare name.
    match reason {
        StopReason::NotStopped => "the grammar stopped without a reason",
        StopReason::MaxTokensTotal | StopReason::MaxTokensParser => {
            "the output reached the grammar's token limit"
        }
        StopReason::NoExtension => "the grammar allows no further text here",
        StopReason::NoExtensionBias => "the grammar allows no further token here",
        StopReason::EndOfSentence => "the grammar's output had already ended",
        StopReason::InternalError => "the grammar engine failed internally",
        StopReason::LexerTooComplex => "the grammar's lexer reached its complexity limit",
        StopReason::ParserTooComplex => "the grammar's parser reached its complexity limit",
        StopReason::Cancelled => "the grammar's work was cancelled",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::{matcher_reason, reached_limit};

    #[test]
    fn llguidance_stop_reasons_reach_clients_in_plain_words() {
        assert_eq!(
            matcher_reason("NoExtensionBias"),
            "the grammar allows no further token here"
        );
        assert_eq!(
            matcher_reason("NoExtension\n<non-verbose/>"),
            "the grammar allows no further text here"
        );
        for name in [
            "NotStopped",
            "MaxTokensTotal",
            "MaxTokensParser",
            "EndOfSentence",
            "InternalError",
            "LexerTooComplex",
            "ParserTooComplex",
            "Cancelled",
        ] {
            let words = matcher_reason(name);
            assert!(words.starts_with("the "), "{name}: {words}");
            assert!(!words.contains(name), "{name}: {words}");
        }
        // Complexity still reads as a limit reached.
        assert!(reached_limit(&matcher_reason("ParserTooComplex")));
        // llguidance's own messages pass as they are, first line only.
        assert_eq!(
            matcher_reason("max_tokens_total reached\n<state>...</state>"),
            "max_tokens_total reached"
        );
    }
}
