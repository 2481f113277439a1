//! Progress bars for long work, drawn on stderr only when stderr is a terminal: a pipe or a file
//! gets nothing, so scripts see the same output as before. A bar appears with the first report
//! that leaves work to do (a prompt of one pass shows none), is replaced when a new stage starts,
//! and is cleared when its stage is done: the prefill of `nuvec generate` and `nuvec cache-prompt`
//! (tokens), the dequantizing or quantizing of `nuvec convert` (tensors), a model's download
//! (bytes, a bar per file), and loading a checkpoint that takes more than a second (tensors).

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nuvec_lm::convert::ConvertProgress;
use nuvec_lm::hub::DownloadProgress;
use nuvec_lm::{LoadProgress, PromptProgress};

/// How long a load runs before its bar is drawn.
const LOAD_BAR_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The current stage's bar, made on its first report that leaves work to do.
pub struct Bar(Mutex<Option<(String, ProgressBar)>>);

impl Bar {
    /// A bar when stderr is a terminal, else `None`.
    pub fn on_terminal() -> Option<Arc<Bar>> {
        std::io::stderr().is_terminal().then(|| Arc::new(Bar(Mutex::new(None))))
    }

    /// `done` of `total` `unit` of `stage` (e.g. "Prefill", "tokens").
    pub fn report(&self, stage: &str, unit: &str, done: usize, total: usize) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|(s, _)| s != stage) {
            if let Some((_, bar)) = slot.take() {
                bar.finish_and_clear();
            }
        }
        if done >= total {
            if let Some((_, bar)) = slot.take() {
                bar.finish_and_clear();
            }
            return;
        }
        let (_, bar) = slot.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            let template = match unit {
                "bytes" => format!("{stage} [{{bar:32}}] {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, {{eta}} left)"),
                _ => format!("{stage} [{{bar:32}}] {{pos}}/{{len}} {unit} ({{per_sec}}, {{eta}} left)"),
            };
            let style = ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            (stage.to_string(), bar)
        });
        bar.set_position(done as u64);
    }

    /// The callback `GenerateOptions::prompt_progress` takes: the prefill's tokens.
    pub fn prompt_callback(self: &Arc<Self>) -> PromptProgress {
        let bar = Arc::clone(self);
        PromptProgress(Arc::new(move |done, total| bar.report("Prefill", "tokens", done, total)))
    }

    /// The callback `HubOptions::progress` takes: each file's bytes.
    pub fn download_callback(self: &Arc<Self>) -> DownloadProgress {
        let bar = Arc::clone(self);
        DownloadProgress(Arc::new(move |file, done, total| {
            bar.report(&format!("Download {file}"), "bytes", done as usize, total as usize)
        }))
    }

    /// The callback `LoadOptions::progress` takes: the checkpoint's tensors, drawn only once the
    /// load has taken a second (a small model loads without a flash of a bar).
    pub fn load_callback(self: &Arc<Self>) -> LoadProgress {
        let bar = Arc::clone(self);
        let start = std::time::Instant::now();
        LoadProgress(Arc::new(move |done, total| {
            if done >= total || start.elapsed() >= LOAD_BAR_AFTER {
                bar.report("Load", "tensors", done, total);
            }
        }))
    }

    /// The callback `ConvertOptions::progress` takes: each stage's tensors.
    pub fn convert_callback(self: &Arc<Self>) -> ConvertProgress {
        let bar = Arc::clone(self);
        ConvertProgress(Arc::new(move |stage, done, total| bar.report(stage, "tensors", done, total)))
    }
}
