//! The bytes one token stands for, on its own (OpenAI's `logprobs[].bytes`).
//!
//! Why it exists: a byte-level BPE token may be half a UTF-8 character, so decoding it alone
//! gives U+FFFD; clients that rebuild text from logprobs need the raw bytes. The vocabulary
//! stores byte-level tokens as GPT-2's printable stand-ins for bytes ("Ġ" for a space), which
//! this module maps back; tokens of other vocabularies are decoded.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::spm::piece_bytes;
use super::text_tokenizer::PieceKind;
use super::{TextTokenizer, TokenizerError};

/// GPT-2's byte ↔ printable character table, inverted: each stand-in character to its byte.
static BYTE_OF_CHAR: LazyLock<HashMap<char, u8>> = LazyLock::new(|| {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).expect("below the surrogates");
                next += 1;
                c
            };
            (c, b)
        })
        .collect()
});

impl TextTokenizer {
    /// The bytes token `id` stands for: its text for a special token, the bytes behind a
    /// byte-level token's characters, or its decoding alone for any other vocabulary.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>, TokenizerError> {
        let piece = self.id_to_token(id).ok_or(TokenizerError::UnknownId {
            id,
            vocab_size: self.vocab_size(),
        })?;
        if self.is_special(id) {
            return Ok(piece.into_bytes());
        }
        if self.pieces == PieceKind::SentencePiece {
            return Ok(piece_bytes(&piece));
        }
        if let Some(bytes) = piece
            .chars()
            .map(|c| BYTE_OF_CHAR.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
        {
            return Ok(bytes);
        }
        Ok(self.decode(&[id])?.into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::BYTE_OF_CHAR;

    #[test]
    fn the_table_covers_every_byte_once() {
        assert_eq!(BYTE_OF_CHAR.len(), 256);
        assert_eq!(BYTE_OF_CHAR[&'Ġ'], b' ');
        assert_eq!(BYTE_OF_CHAR[&'Ċ'], b'\n');
        assert_eq!(BYTE_OF_CHAR[&'a'], b'a');
    }
}
