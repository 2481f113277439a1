//! The checkpoint's own tokenizer: tokenizer.json through the `tokenizers` crate (every
//! normalizer, pre-tokenizer and post-processor), plus tokenizer_config.json's special tokens
//! and chat template.

use std::path::Path;

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::chat::ChatTemplate;
use crate::token_bytes::TokenBytes;
use crate::{Error, Result};

/// A tokenizer with its chat template and end-of-sequence ids.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    file: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    chat_template: Option<ChatTemplate>,
    token_bytes: OnceLock<Arc<TokenBytes>>,
}

/// A special token in tokenizer_config.json: a string, or an AddedToken object with `content`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// transformers (which mlx-lm tokenizes with) rebuilds some tokenizer classes' pipelines instead
/// of reading them from tokenizer.json, and the ids differ where it does (leading spaces, for
/// one), so we rebuild them the same way. `LlamaTokenizer` (Llama 2, Mistral): no normalizer, a
/// Metaspace pre-tokenizer that prepends "▁" unless the text starts with one (`always` for
/// legacy tokenizers, `first` otherwise, `never` without add_prefix_space), byte-fallback BPE.
fn apply_class_pipeline(json: &mut Value, config: &Value) {
    let class = config.get("tokenizer_class").and_then(Value::as_str).unwrap_or("");
    let bpe = json.pointer("/model/type").and_then(Value::as_str) == Some("BPE");
    if !bpe || !matches!(class, "LlamaTokenizer" | "LlamaTokenizerFast") {
        return;
    }
    let add_prefix_space = config.get("add_prefix_space").and_then(Value::as_bool).unwrap_or(true);
    let legacy = config.get("legacy").and_then(Value::as_bool).unwrap_or(false);
    let scheme = match (add_prefix_space, legacy) {
        (false, _) => "never",
        (true, true) => "always",
        (true, false) => "first",
    };
    json["normalizer"] = Value::Null;
    json["pre_tokenizer"] =
        serde_json::json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": false});
    let mut decoders = vec![
        serde_json::json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        serde_json::json!({"type": "ByteFallback"}),
        serde_json::json!({"type": "Fuse"}),
    ];
    if add_prefix_space {
        decoders.push(serde_json::json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json["decoder"] = serde_json::json!({"type": "Sequence", "decoders": decoders});
    json["model"]["fuse_unk"] = Value::Bool(true);
    json["model"]["byte_fallback"] = Value::Bool(true);
}

/// The chat template of checkpoint `dir`: chat_template.jinja, else tokenizer_config.json's
/// `chat_template` (a string, or a list of named templates, of which the one called "default").
fn chat_template(dir: &Path, config: &Value) -> Result<Option<ChatTemplate>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let origin = jinja.display().to_string();
        let text = std::fs::read_to_string(&jinja).map_err(|source| Error::Io { path: origin.clone(), source })?;
        return ChatTemplate::new(text, &origin).map(Some);
    }
    let origin = dir.join("tokenizer_config.json").display().to_string();
    let source = match config.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        Some(other) => {
            return Err(Error::config(
                &origin,
                format!(
                    "chat_template = {other} is not a template (a string, or a list of {{\"name\", \"template\"}}); \
                     fix the field or remove it"
                ),
            ))
        }
    };
    source.map(|s| ChatTemplate::new(s, &origin)).transpose()
}

impl Tokenizer {
    /// Reads tokenizer.json, tokenizer_config.json and chat_template.jinja (when present) from
    /// `dir`. `extra_eos_ids` (the model config's) join the tokenizer's own EOS token.
    pub fn load(dir: &Path, extra_eos_ids: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let file = path.display().to_string();
        if !path.exists() {
            return Err(Error::NotFound(format!(
                "{file}: missing; nuvec needs the checkpoint's tokenizer.json (copy it from the original model)"
            )));
        }
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = if config_path.exists() {
            let cfile = config_path.display().to_string();
            let text =
                std::fs::read_to_string(&config_path).map_err(|source| Error::Io { path: cfile.clone(), source })?;
            serde_json::from_str(&text).map_err(|e| Error::config(&cfile, format!("is not valid JSON ({e})")))?
        } else {
            Value::Null
        };
        let does_not_parse = |e: &dyn std::fmt::Display| Error::Tokenizer {
            file: file.clone(),
            message: format!("does not parse ({e}); re-download it"),
        };
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: file.clone(), source })?;
        let mut json: Value = serde_json::from_str(&text).map_err(|e| does_not_parse(&e))?;
        apply_class_pipeline(&mut json, &config);
        let inner: tokenizers::Tokenizer = json.to_string().parse().map_err(|e| does_not_parse(&e))?;
        let chat_template = chat_template(dir, &config)?;
        let bos_token = token_text(config.get("bos_token"));
        let eos_token = token_text(config.get("eos_token"));
        let mut eos_token_ids: Vec<u32> = extra_eos_ids.to_vec();
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(Tokenizer { inner, file, bos_token, eos_token, eos_token_ids, chat_template, token_bytes: OnceLock::new() })
    }

    /// A tokenizer built from parts (e.g. a GGUF file's vocabulary); `file` names it in errors.
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        file: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
        eos_token_ids: Vec<u32>,
        chat_template: Option<ChatTemplate>,
    ) -> Result<Self> {
        Ok(Tokenizer { inner, file, bos_token, eos_token, eos_token_ids, chat_template, token_bytes: OnceLock::new() })
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor (Llama's BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer { file: self.file.clone(), message: format!("cannot encode: {e}") })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens kept, as mlx-lm's detokenizers do).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer { file: self.file.clone(), message: format!("cannot decode: {e}") })
    }

    /// The id of a token written as text (e.g. `<|im_end|>`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Why `other` does not encode and decode as this tokenizer does, if it does not: the first
    /// token whose id differs, or an added token whose id or special flag differs (the whole
    /// vocabularies are compared, not their sizes). A draft model's tokenizer must pass this.
    pub fn differs_from(&self, other: &Tokenizer) -> Option<String> {
        let (mine, theirs) = (self.inner.get_vocab(true), other.inner.get_vocab(true));
        if mine.len() != theirs.len() {
            return Some(format!("{} tokens against {}", mine.len(), theirs.len()));
        }
        let mut tokens: Vec<(&String, &u32)> = mine.iter().collect();
        tokens.sort_by_key(|&(_, &id)| id);
        if let Some((token, id)) = tokens.into_iter().find(|(t, id)| theirs.get(*t) != Some(id)) {
            return Some(match theirs.get(token) {
                Some(other) => format!("token {token:?} is {id} in one and {other} in the other"),
                None => format!("token {token:?} ({id}) is missing from the other"),
            });
        }
        let added = |t: &Tokenizer| {
            let mut v: Vec<(u32, String, bool)> =
                t.inner.get_added_tokens_decoder().into_iter().map(|(id, a)| (id, a.content, a.special)).collect();
            v.sort();
            v
        };
        let (a, b) = (added(self), added(other));
        if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
            return Some(format!("added token {x:?} is {y:?} in the other (id, text, special)"));
        }
        (a.len() != b.len()).then(|| format!("{} added tokens against {}", a.len(), b.len()))
    }

    /// Ids that end generation: the model config's and the tokenizer's EOS token.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Adds an end-of-sequence token given as text (mlx_lm's `--extra-eos-token`).
    pub fn add_eos_token(&mut self, token: &str) -> Result<()> {
        let id = self
            .token_id(token)
            .ok_or_else(|| Error::Invalid(format!("extra EOS token {token:?} is not a token of this tokenizer")))?;
        if !self.eos_token_ids.contains(&id) {
            self.eos_token_ids.push(id);
        }
        Ok(())
    }

    /// The BOS token's text, if the tokenizer has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token's text, if the tokenizer has one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// What a chat template sees besides the messages: the tokenizer's `bos_token` and
    /// `eos_token` (as transformers passes them), plus `kwargs` (`enable_thinking`, `tools`...).
    pub fn template_context(&self, kwargs: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
        let mut ctx = kwargs;
        for (key, value) in [("bos_token", self.bos_token()), ("eos_token", self.eos_token())] {
            if let Some(v) = value {
                ctx.entry(key.to_string()).or_insert(v.into());
            }
        }
        ctx
    }

    /// The chat template, when the checkpoint has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The bytes of every token, read from the vocabulary on first use and shared after.
    pub fn token_bytes(&self) -> Arc<TokenBytes> {
        self.token_bytes.get_or_init(|| Arc::new(TokenBytes::new(&self.inner))).clone()
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
