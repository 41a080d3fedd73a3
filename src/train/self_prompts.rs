//! Prompts the target writes itself: the chat template opened at a user turn, the target
//! sampling what the user says until its end-of-turn token.
//!
//! Why it exists: a head learns the target's next token in general only from far more of the
//! target's text than the development questions give (192 of them), and the benchmarks' other
//! half may never be trained on. An instruct model continues a user turn with a question of
//! the kind it was tuned to answer, so asking it for user turns yields as many prompts as a
//! run wants, all in the target's own words, with nothing taken from elsewhere.

use super::TrainError;
use crate::model::{ChatMessage, ChatTemplate};

/// Stands in for the user's words while rendering, to find where they would start.
const MARK: &str = "\u{1}tandem-user-turn\u{1}";

/// The rendered text that opens a user turn (the system prompt and any header the template
/// writes before a user's words): the target continues it with a user's message.
pub fn user_turn_opening(template: &ChatTemplate) -> Result<String, TrainError> {
    let rendered = template
        .render(&[ChatMessage::new("user", MARK)], false)
        .map_err(|e| TrainError::Options(format!("the chat template: {e}")))?;
    match rendered.find(MARK) {
        Some(at) => Ok(rendered[..at].to_string()),
        None => Err(TrainError::Options(
            "the chat template does not write a user's message as given".into(),
        )),
    }
}

/// The tokens of a turn the target wrote, up to its end-of-turn token; `None` when it never
/// ended it (cut off at the token limit) or wrote nothing before it.
pub fn finished_turn<'a>(written: &'a [u32], eos_ids: &[u32]) -> Option<&'a [u32]> {
    let end = written.iter().position(|t| eos_ids.contains(t))?;
    (end > 0).then(|| &written[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_ends_at_its_first_end_token() {
        assert_eq!(finished_turn(&[5, 6, 2, 7, 2], &[2]), Some(&[5, 6][..]));
        assert_eq!(finished_turn(&[5, 6, 7], &[2]), None, "cut off");
        assert_eq!(finished_turn(&[2, 5], &[2]), None, "empty");
        assert_eq!(finished_turn(&[5, 9], &[2, 9]), Some(&[5][..]));
    }

    #[test]
    fn the_opening_is_what_precedes_a_users_words() {
        let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                      {% endfor %}";
        let template = ChatTemplate::new(source, None, None).unwrap();
        assert_eq!(user_turn_opening(&template).unwrap(), "<|im_start|>user\n");
        let with_system = "<|im_start|>system\nBe brief.<|im_end|>\n{% for m in messages %}\
                           <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        let template = ChatTemplate::new(with_system, None, None).unwrap();
        assert_eq!(
            user_turn_opening(&template).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        );
        let dropping = "{% for m in messages %}{{ m.role }}{% endfor %}";
        let template = ChatTemplate::new(dropping, None, None).unwrap();
        assert!(user_turn_opening(&template).is_err());
    }
}
