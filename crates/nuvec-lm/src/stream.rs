//! Turning a stream of token ids into text without ever splitting a UTF-8 character.

use crate::tokenizer::Tokenizer;
use crate::Result;

/// Incremental detokenizer: decodes a short window of recent tokens and emits only the text that
/// is final, holding back text that ends in an incomplete character. Decoding a window (rather
/// than single tokens) keeps SentencePiece's leading spaces right.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    tokens: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl StreamDecoder {
    /// Adds `id`; returns the text that became final (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.tokens.push(id);
        let before = tokenizer.decode(&self.tokens[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.tokens[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.starts_with(&before) {
            let new = now[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.tokens.len();
            Ok(new)
        } else if !now.starts_with(&before) && !now.ends_with('\u{FFFD}') {
            // The window re-segmented (rare); emit nothing more for the old part.
            self.prefix = self.read;
            self.read = self.tokens.len();
            Ok(String::new())
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still held back (an incomplete character at the very end decodes as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let before = tokenizer.decode(&self.tokens[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.tokens[self.prefix..])?;
        self.prefix = self.tokens.len();
        self.read = self.tokens.len();
        Ok(now.get(before.len()..).unwrap_or("").to_string())
    }
}
