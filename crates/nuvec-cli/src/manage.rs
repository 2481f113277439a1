//! `nuvec manage`: mlx_lm.manage's `--scan` and `--delete` over the Hugging Face cache, with its
//! tables, plus `--yes` to delete without the question.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::SystemTime;

use clap::Parser;
use nuvec_lm::hub::cache::{self as hub_cache, format_since, format_size, CachedRepo};
use nuvec_lm::hub::hub_cache_dir;

/// List or delete models in the Hugging Face cache (as mlx_lm.manage).
#[derive(Parser, Debug)]
pub struct Args {
    /// List the cached repos whose id contains the pattern.
    #[arg(long)]
    scan: bool,
    /// Delete the cached repos whose id contains the pattern, after a question (y/n) on the
    /// terminal unless --yes.
    #[arg(long)]
    delete: bool,
    /// The text a repo id must contain (mlx_lm.manage's default: "mlx").
    #[arg(long, default_value = "mlx")]
    pattern: String,
    /// Delete without asking.
    #[arg(long, requires = "delete")]
    yes: bool,
    /// The cache folder (default: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if !args.scan && !args.delete {
        return Err("nothing to do: pass --scan (list the cached models) or --delete (remove them)".into());
    }
    let cache = match args.cache_dir.clone().or_else(hub_cache_dir) {
        Some(dir) => dir,
        None => return Err("no Hugging Face cache folder: set HF_HUB_CACHE or HF_HOME, or pass --cache-dir".into()),
    };
    if args.scan {
        println!("Scanning Hugging Face cache for models with pattern \"{}\".", args.pattern);
        let scan = hub_cache::scan(&cache)?;
        warn(&scan.warnings);
        let now = SystemTime::now();
        let rows: Vec<Vec<Cell>> = matching(&scan.repos, &args.pattern)
            .map(|r| {
                vec![
                    Cell::Text(r.repo_id.clone()),
                    Cell::Text(r.repo_type.to_string()),
                    Cell::Text(format!("{:>12}", format_size(r.size_on_disk))),
                    Cell::Number(r.files),
                    Cell::Text(format_since(r.last_accessed, now)),
                    Cell::Text(format_since(r.last_modified, now)),
                    Cell::Text(r.path.display().to_string()),
                ]
            })
            .collect();
        let headers =
            ["REPO ID", "REPO TYPE", "SIZE ON DISK", "NB FILES", "LAST_ACCESSED", "LAST_MODIFIED", "LOCAL PATH"];
        println!("{}", table(&rows, &headers));
    }
    if args.delete {
        println!("Deleting models matching pattern \"{}\"", args.pattern);
        let scan = hub_cache::scan(&cache)?;
        warn(&scan.warnings);
        let repos: Vec<&CachedRepo> = matching(&scan.repos, &args.pattern).collect();
        if repos.is_empty() {
            println!("No models found matching pattern \"{}\"", args.pattern);
            return Ok(());
        }
        println!("\nFound the following models:");
        let rows: Vec<Vec<Cell>> = repos
            .iter()
            .map(|r| {
                vec![
                    Cell::Text(r.repo_id.clone()),
                    Cell::Text(format_size(r.size_on_disk)),
                    Cell::Text(r.path.display().to_string()),
                ]
            })
            .collect();
        println!("{}", table(&rows, &["REPO ID", "SIZE", "LOCAL PATH"]));
        if !args.yes && !confirm("\nAre you sure you want to delete these models?")? {
            println!("\nDeletion cancelled - no changes made.");
            return Ok(());
        }
        for repo in repos {
            println!("\nDeleting {}...", repo.repo_id);
            hub_cache::delete(&cache, repo)?;
        }
        println!("\nModel(s) deleted successfully.");
    }
    Ok(())
}

fn matching<'a>(repos: &'a [CachedRepo], pattern: &'a str) -> impl Iterator<Item = &'a CachedRepo> {
    repos.iter().filter(move |r| r.repo_id.contains(pattern))
}

fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("[WARN] {w}");
    }
}

/// The question, answered on stdin: y/yes/1 or n/no/0/empty (no), asked again otherwise;
/// the end of input is a no.
fn confirm(question: &str) -> std::io::Result<bool> {
    let stdin = std::io::stdin();
    loop {
        print!("{question} (y/n) ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        if stdin.lock().read_line(&mut answer)? == 0 {
            println!();
            return Ok(false);
        }
        match answer.trim_end_matches(['\n', '\r']).to_lowercase().as_str() {
            "y" | "yes" | "1" => return Ok(true),
            "n" | "no" | "0" | "" => return Ok(false),
            _ => println!("Invalid input. Must be one of: yes/no/y/n or empty for no"),
        }
    }
}

/// A table cell: text is left-aligned in its column, a number right-aligned (as Python's format).
enum Cell {
    Text(String),
    Number(usize),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Number(n) => n.to_string(),
        }
    }
}

/// mlx_lm.manage's table: headers, dashes, rows; each column as wide as its widest entry and
/// followed by one space.
fn table(rows: &[Vec<Cell>], headers: &[&str]) -> String {
    let widths: Vec<usize> = (0..headers.len())
        .map(|c| rows.iter().map(|r| r[c].text().chars().count()).chain([headers[c].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<(String, bool)>| -> String {
        cells
            .iter()
            .zip(&widths)
            .map(|((s, right), &w)| if *right { format!("{s:>w$} ") } else { format!("{s:<w$} ") })
            .collect()
    };
    let mut lines = vec![
        line(headers.iter().map(|h| (h.to_string(), false)).collect()),
        line(widths.iter().map(|&w| ("-".repeat(w), false)).collect()),
    ];
    for row in rows {
        lines.push(line(row.iter().map(|c| (c.text(), matches!(c, Cell::Number(_)))).collect()));
    }
    lines.join("\n")
}
