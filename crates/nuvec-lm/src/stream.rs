//! Turning a stream of token ids into text without ever splitting a UTF-8 character.

use crate::tokenizer::Tokenizer;

/// Incremental detokenizer over each token's bytes: emits the longest complete UTF-8 prefix and
/// holds back a character whose bytes are still arriving. Strips the leading space a
/// SentencePiece decoder strips from the start of a text (as mlx-lm's detokenizers do).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    stripped: usize,
    started: bool,
}

/// Splits off the longest valid UTF-8 prefix of `bytes` (invalid sequences become U+FFFD; an
/// incomplete character at the end stays in `bytes`).
pub(crate) fn take_utf8(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = bytes.len();
                break;
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[start..valid]).expect("checked valid"));
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start = valid + n;
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..start);
    out
}

impl StreamDecoder {
    /// Adds the bytes of token `id`; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        let table = tokenizer.token_bytes();
        self.pending.extend_from_slice(table.get(id));
        if !self.started {
            while self.stripped < table.strip_start() && self.pending.first() == Some(&b' ') {
                self.pending.remove(0);
                self.stripped += 1;
            }
            if self.pending.is_empty() {
                return String::new();
            }
            self.started = true;
        }
        take_utf8(&mut self.pending)
    }

    /// Whatever is still held back (an incomplete character at the end becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
