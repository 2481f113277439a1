//! `nuvec bench`'s llama-bench conveniences on the default model: comma lists swept in one run
//! (every combination a test, prompt lengths outermost), `-d` (a context in the cache before the
//! prompt) and `-o json|csv|md` (one row per test on stdout, the progress on stderr).

use std::process::Command;

mod common;

use common::gguf;

/// `nuvec bench --model <default> -n 1 --no-warmup ARGS`: (success, stdout, stderr).
fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nuvec"))
        .args(["bench", "--model", &gguf(), "-n", "1", "--no-warmup"])
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn comma_lists_sweep_every_combination() {
    let (ok, out, err) = bench(&["-p", "8,16", "-g", "3", "-b", "1,2", "-d", "0,8", "-o", "json"]);
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let got: Vec<(u64, u64, u64)> = rows
        .iter()
        .map(|r| {
            (r["prompt_tokens"].as_u64().unwrap(), r["batch_size"].as_u64().unwrap(), r["depth"].as_u64().unwrap())
        })
        .collect();
    let want = [(8, 1, 0), (8, 1, 8), (8, 2, 0), (8, 2, 8), (16, 1, 0), (16, 1, 8), (16, 2, 0), (16, 2, 8)];
    assert_eq!(got, want);
    for r in &rows {
        assert_eq!((r["generation_tokens"].as_u64(), r["trials"].as_u64()), (Some(3), Some(1)), "{r}");
        assert_eq!(r["device"], "cpu");
        assert!(r["prompt_tps"].as_f64().unwrap() > 0.0 && r["generation_tps"].as_f64().unwrap() > 0.0, "{r}");
        // The trial ran over the context, the prompt and the generated tokens but the last.
        let (p, d) = (r["prompt_tokens"].as_u64().unwrap(), r["depth"].as_u64().unwrap());
        assert_eq!(r["positions"].as_u64(), Some(d + p + 2), "{r}");
    }
    // The progress went to stderr, one trial line per test.
    assert_eq!(err.matches("Trial 1:").count(), 8, "{err}");
}

#[test]
fn csv_and_markdown_have_a_row_per_test() {
    let (ok, out, err) = bench(&["-p", "8", "-g", "2,3", "-o", "csv"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("model,device,threads,batch_size,depth,prompt_tokens,generation_tokens,"), "{out}");
    let fields = lines[0].split(',').count();
    for (row, g) in lines[1..].iter().zip(["2", "3"]) {
        // The model's path first, quoted (it may hold commas); then the device and the numbers.
        let mut cells: Vec<&str> = row.rsplitn(fields, ',').collect();
        cells.reverse();
        assert_eq!(cells.len(), fields, "{row}");
        assert!(cells[0].starts_with('"') && cells[0].ends_with('"'), "{row}");
        assert_eq!((cells[1], cells[5], cells[6]), ("cpu", "8", g), "{row}");
    }
    let (ok, out, err) = bench(&["-p", "8,12", "-g", "2", "-o", "md"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "a header, its rule and two rows: {out}");
    assert!(lines.iter().all(|l| l.starts_with('|') && l.ends_with('|')), "{out}");
    assert!(lines[1].contains("---"), "{out}");
}

#[test]
fn text_keeps_mlx_lms_lines_and_bad_values_are_refused() {
    let (ok, out, err) = bench(&["-p", "8,12", "-g", "2"]);
    assert!(ok, "{err}");
    assert_eq!(out.matches("Averages: prompt_tps=").count(), 2, "{out}");
    assert!(out.contains("depth=0"), "{out}");
    let (ok, _, err) = bench(&["-p", "8,0", "-g", "2"]);
    assert!(!ok && err.contains("--prompt-tokens"), "{err}");
    let (ok, _, err) = bench(&["-p", "8", "-o", "xml"]);
    assert!(!ok && err.contains("xml"), "{err}");
    let (ok, _, err) = bench(&["-p", "8,x"]);
    assert!(!ok && err.contains("--prompt-tokens"), "{err}");
}
