//! `nuvec generate --prompt-lookup` and `--draft-model`: the same text as without them, with the
//! guesses verified reported; bad n-gram sizes and a draft of another tokenizer refused. And
//! sampled tokens drawn where the logits are (`NUVEC_DEVICE_SAMPLING=1`): the same text too.

mod common;

use common::{gguf, run_generate as generate};

#[test]
fn prompt_lookup_prints_the_same_text() {
    let prompt = "Repeat the following text word for word: The quick brown fox jumps over the lazy dog near the \
                  river bank, while the farmer watches from his old wooden porch and drinks a cup of tea.";
    let (ok, plain, err) = generate(&["--prompt", prompt, "-m", "60"]);
    assert!(ok, "{err}");
    for extra in [&["--prompt-lookup"][..], &["--prompt-lookup", "--num-draft-tokens", "8", "--prompt-lookup-min", "2"]]
    {
        let mut args = vec!["--prompt", prompt, "-m", "60"];
        args.extend_from_slice(extra);
        let (ok, text, err) = generate(&args);
        assert!(ok, "{err}");
        assert_eq!(text, plain, "{extra:?}");
        let line = err.lines().find(|l| l.starts_with("Speculative: ")).unwrap_or_else(|| panic!("{err}"));
        let accepted: usize = line["Speculative: ".len()..].split_whitespace().next().unwrap().parse().unwrap();
        assert!(accepted > 0, "a copy accepts guesses: {line}");
    }
    let (ok, _, err) = generate(&["--prompt", prompt, "--prompt-lookup", "--prompt-lookup-min", "5"]);
    assert!(!ok && err.contains("n-gram"), "{err}");
}

#[test]
fn drawing_where_the_logits_are_prints_the_same_text() {
    let args = ["--model", &gguf(), "--prompt", "Name three colours.", "-m", "30", "--temp", "0.9", "--seed", "11"];
    let run = |on: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nuvec"))
            .arg("generate")
            .args(args)
            .env("NUVEC_DEVICE_SAMPLING", on)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (host, device) = (run("0"), run("1"));
    assert!(!host.trim().is_empty());
    assert_eq!(device, host);
}

#[test]
fn a_draft_model_prints_the_same_text() {
    let prompt = "Name three colours.";
    let (ok, plain, err) = generate(&["--prompt", prompt, "-m", "40"]);
    assert!(ok, "{err}");
    // The model as its own draft: its guesses are its own greedy picks.
    let (ok, text, err) =
        generate(&["--prompt", prompt, "-m", "40", "--draft-model", &gguf(), "--num-draft-tokens", "2"]);
    assert!(ok, "{err}");
    assert_eq!(text, plain);
    assert!(err.contains("Speculative: "), "{err}");
    // A draft of another tokenizer is refused, naming the difference.
    let fixtures = std::env::var("NUVEC_FIXTURES").unwrap_or_else(|_| panic!("NUVEC_FIXTURES is not set"));
    let other = format!("{fixtures}/llama-q4g64");
    let (ok, _, err) = generate(&["--prompt", prompt, "--draft-model", &other]);
    assert!(!ok && err.contains("its tokenizer is not the model's"), "{err}");
}

/// `--draft-sampling`: the model as its own draft drawing its guesses with the same sampler,
/// so the rejection rule takes nearly all of them (p = q); a seed gives one output. Without a
/// draft model the flag is refused.
#[test]
fn a_sampling_draft_takes_its_drawn_guesses() {
    let prompt = "Write a short poem about the sea.";
    let args = [
        "--prompt",
        prompt,
        "-m",
        "40",
        "--temp",
        "0.8",
        "--seed",
        "5",
        "--draft-model",
        &gguf(),
        "--draft-sampling",
        "--num-draft-tokens",
        "3",
    ];
    let (ok, text, err) = generate(&args);
    assert!(ok, "{err}");
    let (ok, again, _) = generate(&args);
    assert!(ok && again == text, "a seed gives one output");
    let line = err.lines().find(|l| l.starts_with("Speculative: ")).unwrap_or_else(|| panic!("{err}"));
    let words: Vec<&str> = line["Speculative: ".len()..].split_whitespace().collect();
    let (accepted, drafted): (usize, usize) = (words[0].parse().unwrap(), words[2].parse().unwrap());
    assert!(accepted * 10 >= drafted * 8, "a draft equal to the model has its guesses taken: {line}");
    let (ok, _, err) = generate(&["--prompt", prompt, "--prompt-lookup", "--draft-sampling"]);
    assert!(!ok && err.contains("--draft-model"), "{err}");
}

/// `--mtp`: a checkpoint's own multi-token-prediction head (a Qwen3.5 fixture with a random
/// `mtp.*` head) guesses, the text is the same as without it; with `--draft-sampling` the head
/// draws its guesses and a seed gives one output; a model without a head is refused naming the
/// fix, and --mtp does not go with another proposer.
#[test]
fn an_mtp_head_prints_the_same_text() {
    let fixtures = std::env::var("NUVEC_FIXTURES").unwrap_or_else(|_| panic!("NUVEC_FIXTURES is not set"));
    let run = |model: &str, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nuvec"))
            .args(["generate", "--model", model, "--prompt", "The capital of France is", "-m", "24"])
            .args(["--ignore-chat-template"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for model in [format!("{fixtures}/qwen3_5_mtp/qwen3_5-mtp"), format!("{fixtures}/gguf-qwen35-mtp/model.gguf")] {
        let (ok, plain, err) = run(&model, &[]);
        assert!(ok, "{err}");
        let (ok, text, err) = run(&model, &["--mtp", "--num-draft-tokens", "2"]);
        assert!(ok, "{err}");
        assert_eq!(text, plain, "{model}");
        let line = err.lines().find(|l| l.starts_with("Speculative: ")).unwrap_or_else(|| panic!("{err}"));
        let drafted: usize = line["Speculative: ".len()..].split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(drafted > 0, "the head guessed: {line}");
        let sampled = ["--mtp", "--draft-sampling", "--temp", "0.8", "--seed", "5", "--num-draft-tokens", "2"];
        let (ok, text, err) = run(&model, &sampled);
        assert!(ok, "{err}");
        let line = err.lines().find(|l| l.starts_with("Speculative: ")).unwrap_or_else(|| panic!("{err}"));
        let drafted: usize = line["Speculative: ".len()..].split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(drafted > 0, "the sampling head guessed: {line}");
        let (ok, again, _) = run(&model, &sampled);
        assert!(ok && again == text, "{model}: a seed gives one output");
    }
    let (ok, _, err) = run(&gguf(), &["--mtp"]);
    assert!(!ok && err.contains("no multi-token-prediction head"), "{err}");
    let (ok, _, err) = run(&gguf(), &["--mtp", "--prompt-lookup"]);
    assert!(!ok && err.contains("--prompt-lookup"), "{err}");
}
