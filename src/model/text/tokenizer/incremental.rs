//! Streaming detokenization: generated ids in, only complete text out.

use super::{TextTokenizer, TokenizerError};

/// Streaming detokenizer: feed generated ids one at a time and get back only text that is
/// complete.
///
/// A byte-level token can end in the middle of a UTF-8 character, and decoding it alone
/// gives U+FFFD. As in Hugging Face text-generation-inference, the decoder remembers two
/// offsets: `prefix_offset..read_offset` is the window already emitted, decoded again only
/// for context, and text is emitted once decoding `prefix_offset..` gives more than the
/// window did and does not end in a replacement character.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one id; returns the newly completed text, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let (prefix, full) = match self.decode_window(tok) {
            Ok(window) => window,
            Err(e) => {
                // Leave the decoder as it was, so one bad id does not poison the stream.
                self.ids.pop();
                return Err(e);
            }
        };
        if full.len() > prefix.len() && !full.ends_with(char::REPLACEMENT_CHARACTER) {
            let new_text = suffix_after(&full, &prefix).to_owned();
            // The window now starts at what was just emitted; everything before it is never
            // decoded again, so it is dropped to keep memory flat over long generations.
            let consumed = self.read_offset;
            self.ids.drain(..consumed);
            self.prefix_offset = 0;
            self.read_offset = self.ids.len();
            Ok(Some(new_text))
        } else {
            Ok(None)
        }
    }

    /// Emits whatever is still held back (at the end of generation), even if it ends in an
    /// incomplete character.
    pub fn flush(&mut self, tok: &TextTokenizer) -> Result<Option<String>, TokenizerError> {
        if self.read_offset >= self.ids.len() {
            return Ok(None);
        }
        let (prefix, full) = self.decode_window(tok)?;
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        let rest = suffix_after(&full, &prefix);
        Ok((!rest.is_empty()).then(|| rest.to_owned()))
    }

    fn decode_window(&self, tok: &TextTokenizer) -> Result<(String, String), TokenizerError> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tok.decode(&self.ids[self.prefix_offset..])?;
        Ok((prefix, full))
    }
}

/// The part of `full` after `prefix`. With byte-level decoding `prefix` always is a prefix of
/// `full`; should a decoder ever rewrite earlier text, fall back to the longest common prefix
/// (on a character boundary) instead of panicking.
fn suffix_after<'a>(full: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let mut common = full
        .bytes()
        .zip(prefix.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !full.is_char_boundary(common) {
        common -= 1;
    }
    &full[common..]
}

#[cfg(test)]
mod tests {
    use super::suffix_after;

    #[test]
    fn suffix_after_never_splits_a_character() {
        assert_eq!(suffix_after("abc", "ab"), "c");
        assert_eq!(suffix_after("aé", "a\u{FFFD}"), "é");
    }
}
