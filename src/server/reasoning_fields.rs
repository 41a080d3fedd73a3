//! What a chat request may set, and may not, for a model that reasons before it answers
//! (gpt-oss: harmony's analysis channel, then the final one).

use super::error::ApiError;
use super::startup::Loaded;

/// `reasoning_effort` as a template reads it: `low`, `medium` or `high`, and only for a model
/// whose chat template reads it (gpt-oss's); set for another it would change nothing.
pub(super) fn read_reasoning_effort(
    loaded: &Loaded,
    effort: Option<String>,
) -> Result<Option<String>, ApiError> {
    let Some(effort) = effort else {
        return Ok(None);
    };
    if !["low", "medium", "high"].contains(&effort.as_str()) {
        return Err(ApiError::invalid_param(
            "reasoning_effort",
            format!("reasoning_effort is `low`, `medium` or `high`, not `{effort}`."),
        ));
    }
    let reads = loaded
        .tokenizer
        .chat_template()
        .is_some_and(|t| t.reads_reasoning_effort());
    if !reads {
        return Err(ApiError::invalid_param(
            "reasoning_effort",
            "This model's chat template does not read reasoning_effort (gpt-oss's does); \
             leave it out.",
        ));
    }
    Ok(Some(effort))
}

/// What a chat request to a model answering in harmony's channels (gpt-oss) cannot have
/// yet: a constraint (tools, `response_format`, a grammar) would shape its reasoning channel
/// too, and token sources would mark the channels' markup.
pub(super) fn refuse_with_harmony(
    constraint_field: Option<&'static str>,
    token_sources: bool,
) -> Result<(), ApiError> {
    let field = match (constraint_field, token_sources) {
        (Some(field), _) => field,
        (None, true) => "speculative.token_sources",
        (None, false) => return Ok(()),
    };
    Err(ApiError::invalid_param(
        field,
        format!(
            "{field} cannot go with this model: it answers in harmony's channels (gpt-oss), \
             reasoning then answer, and tandem does not yet constrain or mark them apart."
        ),
    ))
}
