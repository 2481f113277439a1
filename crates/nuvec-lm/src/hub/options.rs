//! Where and how to download: the Hub's address, the token, the revision, which files.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{Error, Result};

/// The files of a repo that are downloaded: mlx-lm's `DEFAULT_ALLOW_PATTERNS` (configs, the
/// `model*.safetensors` weights, tokenizer files, code and templates), matched as `fnmatch` does
/// (`*` crosses `/`). Other weights a repo holds (PyTorch `.bin`, GGUF, `consolidated.*`) are
/// not read by the loader, so they are not fetched.
pub const DEFAULT_ALLOW_PATTERNS: [&str; 9] = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
];

/// Called as a file downloads: `(file, bytes done, bytes in all)`, the last call with done ==
/// all (also for a file found already complete in the cache, which reports nothing else).
#[derive(Clone)]
pub struct DownloadProgress(pub Arc<DownloadFn>);

/// What [`DownloadProgress`] calls: `(file, bytes done, bytes in all)`.
pub type DownloadFn = dyn Fn(&str, u64, u64) + Send + Sync;

impl std::fmt::Debug for DownloadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DownloadProgress(..)")
    }
}

/// How [`super::resolve_with`] finds and downloads a repo. [`HubOptions::from_env`] reads what
/// `huggingface_hub` reads.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The branch, tag or commit (`main`).
    pub revision: String,
    /// Never touch the network: a repo not in the cache is an error saying so
    /// (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// The Hub's address (`HF_ENDPOINT`, else `https://huggingface.co`).
    pub endpoint: String,
    /// Sent as `Authorization: Bearer …` to the Hub's own address only (`HF_TOKEN`, else the
    /// token file `hf auth login` writes: `HF_TOKEN_PATH`, else `HF_HOME/token`, else
    /// `~/.cache/huggingface/token`).
    pub token: Option<String>,
    /// The cache folder (`None`: [`super::hub_cache_dir`]).
    pub cache: Option<PathBuf>,
    /// Which of the repo's files to fetch ([`DEFAULT_ALLOW_PATTERNS`]).
    pub allow_patterns: Vec<String>,
    /// How many times a file's transfer is tried again after a network failure or a 5xx / 429
    /// answer, resuming where it stopped (5). What a failed run leaves (`blobs/*.incomplete`)
    /// is resumed by the next run too.
    pub retries: u32,
    /// Told as files download.
    pub progress: Option<DownloadProgress>,
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            revision: "main".into(),
            offline: false,
            endpoint: "https://huggingface.co".into(),
            token: None,
            cache: None,
            allow_patterns: DEFAULT_ALLOW_PATTERNS.iter().map(|p| p.to_string()).collect(),
            retries: 5,
            progress: None,
        }
    }
}

impl HubOptions {
    /// The defaults with what the environment sets: `HF_ENDPOINT`, `HF_HUB_OFFLINE` (1, on, yes
    /// or true, any case), `HF_TOKEN` or the token file.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let offline = var("HF_HUB_OFFLINE")
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true"));
        let token = var("HF_TOKEN").or_else(|| {
            let path = var("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
                var("HF_HOME")
                    .map(|h| PathBuf::from(h).join("token"))
                    .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/token")))
            })?;
            std::fs::read_to_string(path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        });
        HubOptions {
            offline,
            endpoint: var("HF_ENDPOINT")
                .map_or(HubOptions::default().endpoint, |e| e.trim_end_matches('/').to_string()),
            token: token.map(|t| t.trim().to_string()),
            ..HubOptions::default()
        }
    }

    /// The revision, refused when it could name a path outside the repo's `refs/` folder.
    pub(super) fn revision_checked(&self) -> Result<&str> {
        let r = self.revision.as_str();
        let fine = !r.is_empty()
            && !r.starts_with('/')
            && r.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
            && r.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        match fine {
            true => Ok(r),
            false => Err(Error::Invalid(format!(
                "revision {r:?}: expected a branch, tag or commit (letters, digits, '-', '_', '.', '/')"
            ))),
        }
    }
}
