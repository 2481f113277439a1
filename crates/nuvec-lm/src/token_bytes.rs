//! The bytes each token stands for, read once from the vocabulary, so that streamed text and
//! stop strings work on exactly the bytes the tokenizer's decoder would produce — including the
//! halves of a character split across tokens, which text decoding would turn into U+FFFD.

use std::collections::HashMap;

use serde_json::Value;

/// Per-token byte strings of one tokenizer.
#[derive(Debug, Clone)]
pub struct TokenBytes {
    pieces: Vec<Vec<u8>>,
    /// Leading spaces the decoder strips from the start of a text (SentencePiece's `Strip`).
    strip_start: usize,
    /// Whether the decoder is byte-level BPE's (`ByteLevel`), whose text mlx-lm's detokenizer
    /// prints without its first leading space.
    byte_level: bool,
}

/// GPT-2's byte-level alphabet: the char that stands for each byte in byte-level BPE
/// vocabularies (printable bytes stand for themselves, the rest are shifted past 255).
pub fn byte_level_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut shifted = 0;
    for b in 0..256u32 {
        let printable =
            (b'!' as u32..=b'~' as u32).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        chars[b as usize] = char::from_u32(c).expect("valid char");
    }
    chars
}

fn byte_level_decoder() -> HashMap<char, u8> {
    byte_level_chars().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect()
}

/// One step of a decoder pipeline, as far as bytes of single tokens are concerned.
enum Step {
    ByteLevel(HashMap<char, u8>),
    Replace(String, String),
    ByteFallback,
}

fn steps(decoder: &Value, out: &mut Vec<Step>, strip_start: &mut usize) -> bool {
    match decoder.get("type").and_then(Value::as_str) {
        Some("ByteLevel") => out.push(Step::ByteLevel(byte_level_decoder())),
        Some("Replace") => {
            let pattern = decoder.pointer("/pattern/String").and_then(Value::as_str);
            let content = decoder.get("content").and_then(Value::as_str);
            match (pattern, content) {
                (Some(p), Some(c)) => out.push(Step::Replace(p.to_string(), c.to_string())),
                _ => return false,
            }
        }
        Some("ByteFallback") => out.push(Step::ByteFallback),
        Some("Fuse") => {}
        Some("Strip") => {
            if decoder.get("content").and_then(Value::as_str) != Some(" ") {
                return false;
            }
            *strip_start += decoder.get("start").and_then(Value::as_u64).unwrap_or(0) as usize;
        }
        Some("Metaspace") => {
            let replacement = decoder.get("replacement").and_then(Value::as_str).unwrap_or("▁");
            out.push(Step::Replace(replacement.to_string(), " ".to_string()));
            let scheme = decoder.get("prepend_scheme").and_then(Value::as_str).unwrap_or("always");
            if scheme != "never" {
                *strip_start += 1;
            }
        }
        Some("Sequence") => {
            for d in decoder.get("decoders").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
                if !steps(d, out, strip_start) {
                    return false;
                }
            }
        }
        _ => return false,
    }
    true
}

/// `<0xAB>` as the byte 0xAB.
fn byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

impl TokenBytes {
    /// Reads every token of `tokenizer` once.
    pub fn new(tokenizer: &tokenizers::Tokenizer) -> Self {
        let decoder = tokenizer.get_decoder().and_then(|d| serde_json::to_value(d).ok());
        let mut pipeline = vec![];
        let mut strip_start = 0;
        let understood = decoder.as_ref().is_some_and(|d| steps(d, &mut pipeline, &mut strip_start));
        let added: HashMap<u32, String> =
            tokenizer.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content)).collect();
        let size = tokenizer.get_vocab_size(true);
        let pieces = (0..size as u32)
            .map(|id| {
                if let Some(content) = added.get(&id) {
                    // tokenizers runs added tokens through the decoder too: a byte-level one
                    // keeps their text (it is not written in its byte alphabet), a SentencePiece
                    // one turns their "▁" into spaces (Gemma's whitespace-run tokens).
                    let mut text = content.clone();
                    for step in pipeline.iter().take_while(|_| understood) {
                        match step {
                            Step::ByteLevel(_) => return content.as_bytes().to_vec(),
                            Step::Replace(from, to) => text = text.replace(from.as_str(), to),
                            Step::ByteFallback => {}
                        }
                    }
                    return text.into_bytes();
                }
                let Some(piece) = tokenizer.id_to_token(id) else {
                    return vec![];
                };
                if !understood {
                    // A decoder we do not model: ask the tokenizer, token by token.
                    return tokenizer.decode(&[id], false).unwrap_or_default().into_bytes();
                }
                let mut text = piece;
                for step in &pipeline {
                    match step {
                        Step::ByteLevel(map) => {
                            return text.chars().map(|c| map.get(&c).copied().unwrap_or(b'?')).collect();
                        }
                        Step::Replace(from, to) => text = text.replace(from.as_str(), to),
                        Step::ByteFallback => {
                            if let Some(b) = byte_token(&text) {
                                return vec![b];
                            }
                        }
                    }
                }
                text.into_bytes()
            })
            .collect();
        let byte_level = decoder.as_ref().is_some_and(|d| d.get("type").and_then(Value::as_str) == Some("ByteLevel"));
        TokenBytes { pieces, strip_start: if understood { strip_start } else { 0 }, byte_level }
    }

    /// The bytes of token `id` (empty for an id outside the vocabulary).
    pub fn get(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Leading spaces the decoder removes from the start of a text.
    pub fn strip_start(&self) -> usize {
        self.strip_start
    }

    /// Whether mlx-lm's streaming detokenizer drops a leading space from its first pieces: its
    /// `BPEStreamingDetokenizer` (byte-level BPE, whose own decoding keeps every space) and its
    /// `SPMStreamingDetokenizer` (a SentencePiece decoder that strips the start) do.
    pub fn mlx_lm_trims_space(&self) -> bool {
        self.byte_level || self.strip_start > 0
    }

    /// Whether the decoder is byte-level BPE's.
    pub fn is_byte_level(&self) -> bool {
        self.byte_level
    }

    /// The longest stop string worth keeping bytes for is bounded by callers; this is the
    /// number of tokens.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}
