//! gpt-oss's answers in OpenAI's harmony format, split into reasoning and content.
//!
//! Why it exists: gpt-oss writes its answer as messages on channels, each
//! `<|channel|>NAME[ to=RECIPIENT][ <|constrain|>FORMAT]<|message|>BODY` ended by `<|end|>`
//! (another message follows, after `<|start|>assistant`), `<|return|>` or `<|call|>`. Its
//! chain of thought is the `analysis` channel and the answer the `final` one; shown as they
//! come, a client would read the markup and the reasoning as the answer. This splitter routes
//! each message's body by its channel (`analysis` → reasoning, anything else → content) and
//! drops the markup, as text arrives in pieces of any size: a marker split across pieces is
//! held back until it is whole. Pure logic: no tokenizer, no I/O.

/// Ends a message's header; its body follows.
const MESSAGE: &str = "<|message|>";
/// Names the channel in a header.
const CHANNEL: &str = "<|channel|>";
/// End a message's body: another message follows, the answer is done, or a tool is called.
const BODY_ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];

/// A model answers in harmony's format when its vocabulary has these as special tokens.
pub const SPECIAL_TOKENS: [&str; 2] = [CHANNEL, MESSAGE];

/// A piece of an answer, by where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// The `analysis` channel: the model's reasoning.
    Reasoning(String),
    /// Every other channel (`final`, `commentary`): the answer.
    Content(String),
}

/// Where the current message's body goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    Reasoning,
    Content,
}

/// Splits an answer's text, fed in pieces, into reasoning and content.
#[derive(Debug, Default)]
pub struct HarmonySplit {
    /// The current header's text (between messages), until `<|message|>`.
    header: String,
    /// Where the body being read goes; `None` while reading a header.
    sink: Option<Sink>,
    /// The end of the last piece that may be the start of a marker, held back.
    held: String,
}

impl HarmonySplit {
    /// The reasoning and content in `text`, the next piece of the answer (adjacent pieces of
    /// one kind merged).
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(text);
        let mut out = Vec::new();
        let mut at = 0;
        while at < rest.len() {
            let tail = &rest[at..];
            match self.sink {
                None => {
                    // The marker may have begun in an earlier piece: look in the whole header.
                    let mut from = self.header.len().saturating_sub(MESSAGE.len() - 1);
                    while !self.header.is_char_boundary(from) {
                        from -= 1;
                    }
                    self.header.push_str(tail);
                    match self.header[from..].find(MESSAGE) {
                        Some(i) => {
                            let end = from + i;
                            // What followed the marker in this piece is the body's start.
                            let body_len = self.header.len() - end - MESSAGE.len();
                            self.header.truncate(end);
                            self.sink = Some(route(&self.header));
                            self.header.clear();
                            at = rest.len() - body_len;
                        }
                        None => at = rest.len(),
                    }
                }
                Some(sink) => match first_end(tail) {
                    Some((i, marker)) => {
                        emit(&mut out, sink, &tail[..i]);
                        self.sink = None;
                        at += i + marker.len();
                    }
                    None => {
                        let keep = partial_marker(tail);
                        emit(&mut out, sink, &tail[..tail.len() - keep]);
                        self.held = tail[tail.len() - keep..].to_string();
                        at = rest.len();
                    }
                },
            }
        }
        out
    }

    /// What is left once the answer has ended: a held-back tail that never became a marker.
    /// A header without a body is markup and is dropped, unless it holds no marker at all: an
    /// answer written without harmony's markup is all content, never lost.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let header = std::mem::take(&mut self.header);
        let mut out = Vec::new();
        match self.sink {
            Some(sink) => emit(&mut out, sink, &held),
            None if !header.contains("<|") => emit(&mut out, Sink::Content, &header),
            None => {}
        }
        out
    }

    /// A whole answer's reasoning and content.
    pub fn split(text: &str) -> (String, String) {
        let mut split = Self::default();
        let mut pieces = split.push(text);
        pieces.extend(split.finish());
        join(pieces)
    }
}

/// Pieces gathered into all their reasoning and all their content.
fn join(pieces: Vec<Piece>) -> (String, String) {
    let (mut reasoning, mut content) = (String::new(), String::new());
    for p in pieces {
        match p {
            Piece::Reasoning(t) => reasoning.push_str(&t),
            Piece::Content(t) => content.push_str(&t),
        }
    }
    (reasoning, content)
}

/// A header's channel decides where its body goes: `analysis` is reasoning, anything else
/// the answer.
fn route(header: &str) -> Sink {
    let channel = header
        .rsplit_once(CHANNEL)
        .map(|(_, c)| c)
        .unwrap_or("")
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()
        .unwrap_or("");
    match channel {
        "analysis" => Sink::Reasoning,
        _ => Sink::Content,
    }
}

fn emit(out: &mut Vec<Piece>, sink: Sink, text: &str) {
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), sink) {
        (Some(Piece::Reasoning(t)), Sink::Reasoning) | (Some(Piece::Content(t)), Sink::Content) => {
            t.push_str(text)
        }
        (_, Sink::Reasoning) => out.push(Piece::Reasoning(text.to_string())),
        (_, Sink::Content) => out.push(Piece::Content(text.to_string())),
    }
}

/// The first marker ending a body in `text`, and where.
fn first_end(text: &str) -> Option<(usize, &'static str)> {
    BODY_ENDS
        .iter()
        .filter_map(|m| text.find(m).map(|i| (i, *m)))
        .min_by_key(|&(i, _)| i)
}

/// The length of the longest end of `text` that begins a body-ending marker.
fn partial_marker(text: &str) -> usize {
    BODY_ENDS
        .iter()
        .flat_map(|m| (1..m.len()).map(move |n| &m[..n]))
        .filter(|prefix| text.ends_with(prefix))
        .map(str::len)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "<|channel|>analysis<|message|>User asks 2+2. Simple ✓.<|end|>\
        <|start|>assistant<|channel|>final<|message|>2 + 2 = 4 (vier, quatre, четыре).";

    #[test]
    fn analysis_is_reasoning_and_final_is_content_without_markup() {
        assert_eq!(
            HarmonySplit::split(ANSWER),
            (
                "User asks 2+2. Simple ✓.".to_string(),
                "2 + 2 = 4 (vier, quatre, четыре).".to_string()
            )
        );
        // The end markers, whichever ends the answer.
        for end in ["<|return|>", "<|end|>", "<|call|>"] {
            let (_, content) = HarmonySplit::split(&format!("{ANSWER}{end}"));
            assert_eq!(content, "2 + 2 = 4 (vier, quatre, четыре).");
        }
    }

    #[test]
    fn pieces_of_any_size_give_the_same_split() {
        let want = HarmonySplit::split(ANSWER);
        for size in 1..12 {
            let mut split = HarmonySplit::default();
            let chars: Vec<char> = ANSWER.chars().collect();
            let mut pieces = Vec::new();
            for chunk in chars.chunks(size) {
                pieces.extend(split.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(split.finish());
            assert_eq!(join(pieces), want, "pieces of {size} characters");
        }
    }

    #[test]
    fn text_that_only_looks_like_a_marker_is_kept() {
        let text = "<|channel|>final<|message|>a <| b <|en";
        assert_eq!(HarmonySplit::split(text).1, "a <| b <|en");
        let mut split = HarmonySplit::default();
        assert_eq!(
            split.push("<|channel|>final<|message|>x<|en"),
            [Piece::Content("x".into())]
        );
        assert_eq!(split.push("d|>"), []);
        assert_eq!(split.finish(), []);
    }

    #[test]
    fn commentary_is_content_and_an_unfinished_header_is_dropped() {
        let text = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|chan";
        assert_eq!(
            HarmonySplit::split(text),
            (String::new(), "Checking.".to_string())
        );
        // Cut by the token limit inside the reasoning: all of it is reasoning.
        assert_eq!(
            HarmonySplit::split("<|channel|>analysis<|message|>Let me think"),
            ("Let me think".to_string(), String::new())
        );
        // No markup at all: the whole answer is content.
        assert_eq!(
            HarmonySplit::split("Plain words."),
            (String::new(), "Plain words.".to_string())
        );
    }
}
