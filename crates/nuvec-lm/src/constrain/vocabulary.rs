//! A tokenizer's vocabulary as llguidance reads it.

use std::collections::HashMap;
use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Every token's bytes (special tokens marked, so that no text matches them) and llguidance's
/// parser factory over them: what grammars compile against. Build it once per tokenizer (a few
/// hundred milliseconds for 150k tokens) and share it; cloning is cheap.
#[derive(Clone)]
pub struct Vocabulary {
    pub(super) factory: Arc<ParserFactory>,
    /// Tokens the vocabulary has (a model's logits may have more rows: those are never allowed).
    pub(super) size: usize,
    /// The end-of-sequence id llguidance's masks allow where a grammar may end.
    pub(super) eos: u32,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocabulary {{ size: {}, eos: {} }}", self.size, self.eos)
    }
}

/// llguidance's view of the tokenizer: the trie of token bytes, and the tokenizer itself for
/// turning text the grammar forces into tokens.
struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text the tokenizer's own way; bytes that are no text (half a character) greedily.
        match std::str::from_utf8(s).ok().and_then(|text| self.tokenizer.encode(text, false).ok()) {
            Some(encoding) => encoding.get_ids().to_vec(),
            None => self.trie.greedy_tokenize(s),
        }
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer`; an error when it names no end-of-sequence token (where
    /// a grammar ends, the output must be able to).
    pub fn new(tokenizer: &Tokenizer) -> Result<Self> {
        let Some(&eos) = tokenizer.eos_token_ids().first() else {
            return Err(Error::Invalid(
                "the tokenizer names no end-of-sequence token, which a constrained output needs to end; \
                 add one (eos_token in tokenizer_config.json, or --extra-eos-token)"
                    .into(),
            ));
        };
        let bytes = tokenizer.token_bytes();
        let special: HashMap<u32, String> = tokenizer
            .inner()
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        let size = bytes.len().max(special.keys().map(|&id| id as usize + 1).max().unwrap_or(0));
        let words: Vec<Vec<u8>> = (0..size as u32)
            .map(|id| match special.get(&id) {
                Some(content) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], content.as_bytes()].concat(),
                None if (id as usize) < bytes.len() => bytes.get(id).to_vec(),
                None => vec![],
            })
            .collect();
        let info = TokRxInfo::new(size as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: llguidance::toktrie::TokEnv = Arc::new(Env { trie, tokenizer: tokenizer.inner().clone() });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Invalid(format!("building the grammar vocabulary: {e}")))?;
        factory.quiet();
        Ok(Vocabulary { factory: Arc::new(factory), size, eos })
    }

    /// Tokens the vocabulary has.
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether it has none (never, for a loaded tokenizer).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}
