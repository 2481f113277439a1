//! A progress bar for a long prefill (`nuvec generate`, `nuvec cache-prompt`), drawn on stderr
//! only when stderr is a terminal: a pipe or a file gets nothing, so scripts see the same output
//! as before. The bar appears with the first prefill pass that leaves work to do (a prompt of one
//! pass shows none) and is cleared when the prompt is done.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nuvec_lm::PromptProgress;

/// The bar, made on the first report that leaves work to do.
pub struct PrefillBar(Mutex<Option<ProgressBar>>);

impl PrefillBar {
    /// A bar when stderr is a terminal, else `None`.
    pub fn on_terminal() -> Option<Arc<PrefillBar>> {
        std::io::stderr().is_terminal().then(|| Arc::new(PrefillBar(Mutex::new(None))))
    }

    /// `done` of `total` prompt positions prefilled.
    pub fn report(&self, done: usize, total: usize) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if done >= total {
            if let Some(bar) = slot.take() {
                bar.finish_and_clear();
            }
            return;
        }
        let bar = slot.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("Prefill [{bar:32}] {pos}/{len} tokens ({per_sec}, {eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        bar.set_position(done as u64);
    }

    /// The callback `GenerateOptions::prompt_progress` takes.
    pub fn callback(self: &Arc<Self>) -> PromptProgress {
        let bar = Arc::clone(self);
        PromptProgress(Arc::new(move |done, total| bar.report(done, total)))
    }
}
