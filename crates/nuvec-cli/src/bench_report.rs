//! How `nuvec bench` prints its tests: mlx_lm.benchmark's lines as they come (`-o text`), or,
//! as llama-bench's `-o`, one row per test once all have run (`json`, `csv`, `md`) on stdout,
//! the progress lines on stderr.

use serde_json::json;

use crate::bench::{Output, Summary, Test};

pub struct Report {
    output: Output,
    model: String,
    device: String,
    threads: usize,
    rows: Vec<(Test, Summary)>,
    /// Prints nothing (a rank other than 0 of a split model).
    quiet: bool,
}

impl Report {
    pub fn new(output: Output, model: &str, device: String, quiet: bool) -> Self {
        let threads = nuvec::backends::cpu::num_threads();
        Report { output, model: model.to_string(), device, threads, rows: vec![], quiet }
    }

    /// A progress line: the report itself in text, stderr otherwise.
    pub fn line(&self, text: &str) {
        if self.quiet {
            return;
        }
        if self.output == Output::Text {
            println!("{text}");
        } else {
            eprintln!("{text}");
        }
    }

    /// A test's results.
    pub fn test(&mut self, test: Test, summary: Summary) {
        self.rows.push((test, summary));
    }

    /// Prints the rows (nothing more in text).
    pub fn finish(self) {
        if self.quiet {
            return;
        }
        match self.output {
            Output::Text => {}
            Output::Json => {
                let rows: Vec<_> = self.rows.iter().map(|(t, r)| self.json(*t, r)).collect();
                println!("{}", serde_json::to_string_pretty(&rows).expect("numbers and strings serialize"));
            }
            Output::Csv => {
                println!("{}", COLUMNS.join(","));
                for (t, r) in &self.rows {
                    let model = format!("\"{}\"", self.model.replace('"', "\"\""));
                    println!("{model},{}", self.cells(*t, r)[1..].join(","));
                }
            }
            Output::Md => {
                println!("| {} |", COLUMNS.join(" | "));
                println!("|{}", " --- |".repeat(2) + &" ---: |".repeat(COLUMNS.len() - 2));
                for (t, r) in &self.rows {
                    println!("| {} |", self.cells(*t, r).join(" | "));
                }
            }
        }
    }

    fn json(&self, t: Test, r: &Summary) -> serde_json::Value {
        json!({
            "model": self.model,
            "device": self.device,
            "threads": self.threads,
            "batch_size": t.batch_size,
            "depth": t.depth,
            "prompt_tokens": t.prompt_tokens,
            "generation_tokens": t.generation_tokens,
            "trials": r.trials,
            "prompt_tps": r.prompt_tps.0,
            "prompt_tps_sd": r.prompt_tps.1,
            "generation_tps": r.generation_tps.0,
            "generation_tps_sd": r.generation_tps.1,
            "peak_memory_gb": r.peak as f64 / 1e9,
            "positions": r.positions,
        })
    }

    /// A row's cells in `COLUMNS`' order.
    fn cells(&self, t: Test, r: &Summary) -> Vec<String> {
        vec![
            self.model.clone(),
            self.device.clone(),
            self.threads.to_string(),
            t.batch_size.to_string(),
            t.depth.to_string(),
            t.prompt_tokens.to_string(),
            t.generation_tokens.to_string(),
            r.trials.to_string(),
            format!("{:.3}", r.prompt_tps.0),
            format!("{:.3}", r.prompt_tps.1),
            format!("{:.3}", r.generation_tps.0),
            format!("{:.3}", r.generation_tps.1),
            format!("{:.3}", r.peak as f64 / 1e9),
            r.positions.to_string(),
        ]
    }
}

/// The table's columns (the JSON objects' keys, in order); `positions`: the first sequence's
/// cache positions after a trial (depth + prompt + generated - 1), what the trial ran over.
const COLUMNS: [&str; 14] = [
    "model",
    "device",
    "threads",
    "batch_size",
    "depth",
    "prompt_tokens",
    "generation_tokens",
    "trials",
    "prompt_tps",
    "prompt_tps_sd",
    "generation_tps",
    "generation_tps_sd",
    "peak_memory_gb",
    "positions",
];
