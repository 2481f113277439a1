//! SentencePiece vocabularies in GGUF files (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral,
//! Gemma, ...), rebuilt as the byte-fallback BPE tokenizer that transformers makes of the same
//! model, so ids equal the original tokenizer.json's; and Gemma 4's (`"gemma4"`), the same kind
//! of vocabulary with its merges written out.
//!
//! What the file carries, per token: its text, a score and a type (llama.cpp's converter reads
//! them from tokenizer.model, then marks tokenizer_config.json's added tokens CONTROL or
//! USER_DEFINED with score -1000 and writes "▁" as " " in user-defined ones). What a BPE
//! tokenizer needs and the file lacks is the merge list: transformers' slow->fast conversion
//! derives it from the scores (every split of a piece into two pieces of the vocabulary is a
//! merge, ranked by the piece's score, then by longer left and right parts), and so do we.

use std::collections::HashMap;

use nuvec::io::{GgufFile, GgufValue};
use serde_json::{json, Value};
use tokenizers::models::bpe::BPE;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper};

use crate::gguf::meta;
use crate::gguf_tokenizer::finish;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// SentencePiece's piece types, as GGUF's `tokenizer.ggml.token_type` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl Kind {
    fn from_number(n: u64) -> Option<Kind> {
        Some(match n {
            1 => Kind::Normal,
            2 => Kind::Unknown,
            3 => Kind::Control,
            4 => Kind::UserDefined,
            5 => Kind::Unused,
            6 => Kind::Byte,
            _ => return None,
        })
    }
}

/// The vocabulary as read from the file, checked.
struct Vocabulary {
    /// Token texts as the tokenizer sees them (user-defined tokens with "▁" restored).
    pieces: Vec<String>,
    scores: Vec<f32>,
    kinds: Vec<Kind>,
}

fn bad(file: &GgufFile, message: String) -> Error {
    Error::config(file.path().display().to_string(), message)
}

fn read_vocabulary(file: &GgufFile) -> Result<Vocabulary> {
    let array = |key: &str, what: &str| -> Result<&[GgufValue]> {
        let value = file.get(key).ok_or_else(|| {
            bad(
                file,
                format!(
                    "GGUF metadata {key} is missing; a SentencePiece (\"llama\") vocabulary needs its {what} \
                     (re-convert the model with llama.cpp's convert_hf_to_gguf.py)"
                ),
            )
        })?;
        value.as_array().ok_or_else(|| bad(file, format!("GGUF metadata {key} is not an array")))
    };
    let tokens = meta(file, "tokenizer.ggml.tokens")?
        .as_array()
        .ok_or_else(|| bad(file, "GGUF metadata tokenizer.ggml.tokens is not an array".into()))?;
    let scores = array("tokenizer.ggml.scores", "scores (they order the merges)")?;
    let types = array("tokenizer.ggml.token_type", "token types (normal, control, byte, ...)")?;
    for (key, len) in [("tokenizer.ggml.scores", scores.len()), ("tokenizer.ggml.token_type", types.len())] {
        if len != tokens.len() {
            return Err(bad(file, format!("GGUF metadata {key} has {len} entries for {} tokens", tokens.len())));
        }
    }
    let mut vocab = Vocabulary { pieces: vec![], scores: vec![], kinds: vec![] };
    for (id, ((token, score), kind)) in tokens.iter().zip(scores).zip(types).enumerate() {
        let text = token.as_str().ok_or_else(|| bad(file, format!("GGUF token {id} is not a string")))?;
        let score = score
            .as_f64()
            .filter(|s| s.is_finite())
            .ok_or_else(|| bad(file, format!("GGUF token {id} ({text:?}) has score {score:?}, not a finite number")))?;
        let kind = kind.as_u64().and_then(Kind::from_number).ok_or_else(|| {
            bad(
                file,
                format!(
                    "GGUF token {id} ({text:?}) has token type {kind:?}; SentencePiece types are 1 normal, \
                     2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte"
                ),
            )
        })?;
        if kind == Kind::Byte && byte_value(text).is_none() {
            return Err(bad(file, format!("GGUF token {id} ({text:?}) has type byte but is not written <0xNN>")));
        }
        // The converter writes the "▁" of user-defined tokens as spaces (llama.cpp matches
        // them in raw text); tokenizer.json holds them with "▁", as the model saw them.
        let text = if kind == Kind::UserDefined { text.replace(' ', "\u{2581}") } else { text.to_string() };
        vocab.pieces.push(text);
        vocab.scores.push(score as f32);
        vocab.kinds.push(kind);
    }
    Ok(vocab)
}

/// The byte a byte-fallback token `<0xNN>` stands for.
fn byte_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// The merges transformers' slow->fast conversion makes of a SentencePiece BPE vocabulary
/// (`generate_merges` with scores): for each piece, in id order, every split into a left and a
/// right piece of the vocabulary (ordered by their ids), then all of them sorted, stably, by
/// the piece's score, then the left part's length, then the right part's (each descending).
/// User-defined pieces score 0 in a tokenizer.model, above every normal piece, and transformers
/// merges them first; the converter overwrote their score with -1000, so they rank first here.
fn merges(vocab: &Vocabulary, ids: &HashMap<String, u32>) -> Vec<(String, String)> {
    struct Merge {
        left: u32,
        right: u32,
        score: f64,
        left_len: usize,
        right_len: usize,
    }
    let mut all = vec![];
    for (id, piece) in vocab.pieces.iter().enumerate() {
        // Padding tokens are not pieces of the model, and a repeated text is one piece.
        if vocab.kinds[id] == Kind::Unused || ids.get(piece) != Some(&(id as u32)) {
            continue;
        }
        let score = match vocab.kinds[id] {
            Kind::UserDefined => f64::INFINITY,
            _ => f64::from(vocab.scores[id]),
        };
        let mut local: Vec<Merge> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some(Merge {
                    left: *ids.get(l)?,
                    right: *ids.get(r)?,
                    score,
                    left_len: l.chars().count(),
                    right_len: r.chars().count(),
                })
            })
            .collect();
        local.sort_by_key(|m| (m.left, m.right));
        all.extend(local);
    }
    all.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then(b.left_len.cmp(&a.left_len)).then(b.right_len.cmp(&a.right_len))
    });
    all.into_iter().map(|m| (vocab.pieces[m.left as usize].clone(), vocab.pieces[m.right as usize].clone())).collect()
}

/// A special token's id from the metadata, checked against the vocabulary.
fn token_id(file: &GgufFile, key: &str, n: usize) -> Result<Option<u32>> {
    let Some(value) = file.get(key) else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(id) if (id as usize) < n => Ok(Some(id as u32)),
        _ => Err(bad(file, format!("GGUF metadata {key} = {value:?} is not a token id (the vocabulary has {n})"))),
    }
}

/// The pipeline around the model, as transformers builds it for the tokenizer the GGUF came
/// from. With a space prefix (Llama, Mistral: `LlamaTokenizer`): a Metaspace pre-tokenizer that
/// writes spaces as "▁" and prepends one to every text segment that does not start with one
/// (before the first and after each special token, as legacy Llama tokenizers and llama.cpp
/// do), and a decoder that strips that one space again. Without (Gemma): spaces become "▁" and
/// nothing is prepended or stripped.
fn pipeline(add_space_prefix: bool) -> (Value, Value, Value) {
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        let pre = json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": false});
        (Value::Null, pre, json!({"type": "Sequence", "decoders": decoders}))
    } else {
        let normalizer = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
        (normalizer, Value::Null, json!({"type": "Sequence", "decoders": decoders}))
    }
}

/// BOS before (and EOS after) each sequence, as the file's add_bos / add_eos flags say.
fn post_processor(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let mut single = vec![];
    let mut pair = vec![];
    let mut specials = serde_json::Map::new();
    for (type_id, (seq, out)) in [("A", &mut single), ("B", &mut pair)].into_iter().enumerate() {
        if let Some((t, _)) = bos {
            out.push(special(t, type_id as u32));
        }
        out.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some((t, _)) = eos {
            out.push(special(t, type_id as u32));
        }
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    for (t, id) in bos.into_iter().chain(eos) {
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

type Components = (Option<NormalizerWrapper>, Option<PreTokenizerWrapper>, DecoderWrapper, PostProcessorWrapper);

fn optional<T: serde::de::DeserializeOwned>(v: Value) -> serde_json::Result<Option<T>> {
    if v.is_null() {
        Ok(None)
    } else {
        serde_json::from_value(v).map(Some)
    }
}

/// [`pipeline`] and [`post_processor`] as the `tokenizers` types they describe.
fn components(
    add_space_prefix: bool,
    bos: Option<(&str, u32)>,
    eos: Option<(&str, u32)>,
) -> serde_json::Result<Components> {
    let (normalizer, pre_tokenizer, decoder) = pipeline(add_space_prefix);
    Ok((
        optional(normalizer)?,
        optional(pre_tokenizer)?,
        serde_json::from_value(decoder)?,
        serde_json::from_value(post_processor(bos, eos))?,
    ))
}

/// The tokenizer of a GGUF SentencePiece vocabulary.
pub(crate) fn sentencepiece_tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    let label = file.path().display().to_string();
    let vocab = read_vocabulary(file)?;
    let ids = ids_of(&vocab);
    let normal_scores = || vocab.scores.iter().zip(&vocab.kinds).filter(|(_, &k)| k == Kind::Normal).map(|(s, _)| s);
    if normal_scores().nth(1).is_some() && normal_scores().all(|s| Some(s) == normal_scores().next()) {
        // convert_hf_to_gguf's fallback without tokenizer.model (LlamaHfVocab) writes -1000
        // for every token: the merge order is lost, and a guess would tokenize wrongly.
        return Err(Error::Unsupported(format!(
            "{label}: every normal token of this SentencePiece vocabulary has the same score, so the \
             merge order is unknown (the file was converted without tokenizer.model); re-convert it from \
             a checkpoint that has tokenizer.model"
        )));
    }
    let merges = merges(&vocab, &ids);
    // llama.cpp's defaults for SentencePiece vocabularies: BOS yes, EOS no, space prefix yes.
    build(file, vocab, ids, merges, true, &[])
}

/// Gemma 4's vocabulary (`tokenizer.ggml.model = "gemma4"`): SentencePiece-style pieces ("▁" for
/// spaces, `<0xNN>` byte tokens) with the merge list written out (`tokenizer.ggml.merges`, rank
/// = position) instead of scores, as Gemma 4's tokenizer.json holds them. The whole text is one
/// piece sequence, as transformers runs it (llama.cpp splits it at newline runs first, which
/// gives the same ids as long as no merge joins a newline to other text). Besides the file's
/// EOS, generation ends at the end-of-turn tokens llama.cpp ends a Gemma turn with
/// (`<turn|>`, `<|tool_response>`, and Gemma 3's `<end_of_turn>`), where the vocabulary has them.
pub(crate) fn gemma4_tokenizer(file: &GgufFile) -> Result<Tokenizer> {
    let key = "tokenizer.ggml.merges";
    let vocab = read_vocabulary(file)?;
    let ids = ids_of(&vocab);
    let entries =
        meta(file, key)?.as_array().ok_or_else(|| bad(file, format!("GGUF metadata {key} is not an array")))?;
    let mut merges = Vec::with_capacity(entries.len());
    for (rank, entry) in entries.iter().enumerate() {
        // llama.cpp splits at the first space after the first character.
        let pair = entry.as_str().and_then(|m| {
            let cut = m.char_indices().skip(1).find(|&(_, c)| c == ' ')?.0;
            Some((m[..cut].to_string(), m[cut + 1..].to_string()))
        });
        let pair =
            pair.ok_or_else(|| bad(file, format!("GGUF metadata {key}[{rank}] = {entry:?} is not \"left right\"")))?;
        merges.push(pair);
    }
    let ends: Vec<u32> = ["<turn|>", "<|tool_response>", "<end_of_turn>"]
        .iter()
        .filter_map(|t| ids.get(*t).copied())
        .filter(|&id| matches!(vocab.kinds[id as usize], Kind::Control | Kind::UserDefined))
        .collect();
    build(file, vocab, ids, merges, false, &ends)
}

/// Each piece's id (the first, for a piece the vocabulary repeats).
fn ids_of(vocab: &Vocabulary) -> HashMap<String, u32> {
    let mut ids: HashMap<String, u32> = HashMap::with_capacity(vocab.pieces.len());
    for (id, piece) in vocab.pieces.iter().enumerate() {
        ids.entry(piece.clone()).or_insert(id as u32);
    }
    ids
}

/// A byte-fallback BPE tokenizer of `vocab` and `merges`, with the file's special tokens and
/// flags (`space_prefix`: whether a missing `add_space_prefix` means yes) and the extra
/// end-of-sequence ids `ends`.
fn build(
    file: &GgufFile,
    vocab: Vocabulary,
    ids: HashMap<String, u32>,
    merges: Vec<(String, String)>,
    space_prefix: bool,
    ends: &[u32],
) -> Result<Tokenizer> {
    let label = file.path().display().to_string();
    let n = vocab.pieces.len();
    let unk = match token_id(file, "tokenizer.ggml.unknown_token_id", n)? {
        Some(id) => Some(id),
        None => vocab.kinds.iter().position(|&k| k == Kind::Unknown).map(|id| id as u32),
    };
    let bos = token_id(file, "tokenizer.ggml.bos_token_id", n)?;
    let eos = token_id(file, "tokenizer.ggml.eos_token_id", n)?;
    token_id(file, "tokenizer.ggml.padding_token_id", n)?;
    let flag = |key: &str| file.get(key).and_then(GgufValue::as_bool);
    let add_bos = flag("tokenizer.ggml.add_bos_token");
    let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
    let add_space_prefix = flag("tokenizer.ggml.add_space_prefix").unwrap_or(space_prefix);
    for (on, id, what) in [(add_bos == Some(true), bos, "bos"), (add_eos, eos, "eos")] {
        if on && id.is_none() {
            return Err(bad(
                file,
                format!("GGUF metadata tokenizer.ggml.add_{what}_token is true but tokenizer.ggml.{what}_token_id is missing"),
            ));
        }
    }
    let text_of = |id: Option<u32>| id.map(|i| (vocab.pieces[i as usize].as_str(), i));

    let model = BPE::builder()
        .vocab_and_merges(ids.iter().map(|(t, &i)| (t.clone(), i)).collect::<tokenizers::models::bpe::Vocab>(), merges)
        .byte_fallback(vocab.kinds.contains(&Kind::Byte))
        .fuse_unk(true);
    let model = match unk {
        Some(id) => model.unk_token(vocab.pieces[id as usize].clone()),
        None => model,
    };
    let tokenizer_error = |e: &dyn std::fmt::Display| Error::Tokenizer {
        file: label.clone(),
        message: format!("the GGUF vocabulary does not make a tokenizer: {e}"),
    };
    let model = model.build().map_err(|e| tokenizer_error(&e))?;
    let mut inner = tokenizers::Tokenizer::new(model);
    let (normalizer, pre_tokenizer, decoder, processor) = components(
        add_space_prefix,
        if add_bos.unwrap_or(true) { text_of(bos) } else { None },
        if add_eos { text_of(eos) } else { None },
    )
    .map_err(|e| tokenizer_error(&e))?;
    inner.with_normalizer(normalizer);
    inner.with_pre_tokenizer(pre_tokenizer);
    inner.with_decoder(Some(decoder));
    inner.with_post_processor(Some(processor));
    // Control and unknown tokens are special tokens, user-defined ones plain added tokens: both
    // are matched whole in the raw text, before the model sees it, as transformers does.
    let added: Vec<AddedToken> = vocab
        .kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| matches!(k, Kind::Control | Kind::Unknown | Kind::UserDefined))
        .map(|(id, &k)| AddedToken::from(vocab.pieces[id].clone(), k != Kind::UserDefined).normalized(false))
        .collect();
    let (special, plain): (Vec<AddedToken>, Vec<AddedToken>) = added.into_iter().partition(|t| t.special);
    inner.add_special_tokens(&special);
    inner.add_tokens(&plain);
    let (bos, eos) = (text_of(bos).map(|(t, _)| t.to_string()), text_of(eos).map(|(t, _)| t.to_string()));
    finish(file, inner, bos, eos, ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(pieces: &[(&str, f32, Kind)]) -> (Vocabulary, HashMap<String, u32>) {
        let v = Vocabulary {
            pieces: pieces.iter().map(|p| p.0.to_string()).collect(),
            scores: pieces.iter().map(|p| p.1).collect(),
            kinds: pieces.iter().map(|p| p.2).collect(),
        };
        let ids = v.pieces.iter().enumerate().map(|(i, p)| (p.clone(), i as u32)).collect();
        (v, ids)
    }

    #[test]
    fn merges_follow_scores_then_split_lengths() {
        use Kind::*;
        let (v, ids) = vocab(&[
            ("a", 0.0, Normal),
            ("b", 0.0, Normal),
            ("ab", -2.0, Normal),
            ("ba", -1.0, Normal),
            ("aba", -3.0, Normal),
            ("bb", -3.0, Normal),
            ("<0x41>", 0.0, Byte),
            ("[PAD1]", -1e4, Unused),
        ]);
        let m = merges(&v, &ids);
        let m: Vec<String> = m.iter().map(|(l, r)| format!("{l} {r}")).collect();
        // What transformers 5's generate_merges returns for the same pieces and scores: "ba"
        // scores highest; "aba" and "bb" tie at -3, so the longer left part goes first. The
        // byte and padding tokens make no merge.
        assert_eq!(m, ["b a", "a b", "ab a", "a ba", "b b"]);
    }

    #[test]
    fn byte_tokens() {
        assert_eq!(byte_value("<0x0A>"), Some(10));
        assert_eq!(byte_value("<0xff>"), Some(255));
        assert_eq!(byte_value("<0x1>"), None);
        assert_eq!(byte_value("0x41"), None);
    }
}
