//! GGUF files that are broken, hostile or unsupported give clear errors, never a panic or an
//! allocation sized by an unchecked field. A tiny valid file is built here, then broken one way
//! at a time, then mutated at random (seeded, so the run is the same every time).

use std::path::PathBuf;

use rand::{Rng, SeedableRng};

struct Writer(Vec<u8>);

impl Writer {
    fn str(&mut self, s: &str) {
        self.0.extend((s.len() as u64).to_le_bytes());
        self.0.extend(s.as_bytes());
    }
    fn kv_str(&mut self, k: &str, v: &str) {
        self.str(k);
        self.0.extend(8u32.to_le_bytes());
        self.str(v);
    }
    fn kv_u32(&mut self, k: &str, v: u32) {
        self.str(k);
        self.0.extend(4u32.to_le_bytes());
        self.0.extend(v.to_le_bytes());
    }
    fn kv_f32(&mut self, k: &str, v: f32) {
        self.str(k);
        self.0.extend(6u32.to_le_bytes());
        self.0.extend(v.to_le_bytes());
    }
    fn kv_strs(&mut self, k: &str, items: &[&str]) {
        self.str(k);
        self.0.extend(9u32.to_le_bytes());
        self.0.extend(8u32.to_le_bytes());
        self.0.extend((items.len() as u64).to_le_bytes());
        for i in items {
            self.str(i);
        }
    }
}

/// A valid one-layer llama GGUF with f32 tensors; `arch` and the ggml type of attn_q vary.
fn tiny_gguf(arch: &str, q_type: u32) -> Vec<u8> {
    gguf_bytes(arch, 32, 64, |name| if name.contains("attn_q") { q_type } else { 0 })
}

/// (values, bytes) per block of the ggml types these files use: F32 and the K-quants.
fn block_of(kind: u32) -> (u64, u64) {
    match kind {
        10 => (256, 84),
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        _ => (1, 4),
    }
}

/// A valid one-layer llama GGUF of K-quant matrices (every type; 256 wide, as K-quants need)
/// and f32 norms.
fn kquant_gguf() -> Vec<u8> {
    gguf_bytes("llama", 256, 256, |name| {
        let types = [("token_embd", 14), ("attn_q", 12), ("attn_k", 10), ("attn_v", 11), ("attn_output", 13)];
        let more = [("ffn_gate", 14), ("ffn_up", 12), ("ffn_down", 11)];
        types.iter().chain(&more).find(|(t, _)| name.contains(t)).map_or(0, |&(_, k)| k)
    })
}

/// A one-layer llama GGUF, hidden size `hidden` over 2 heads (1 kv head), FFN width `ffn`, each
/// tensor of the ggml type `kind_of(name)` (F32 = 0, K-quants 10..=14). Block bytes stay below
/// 0x61, so every f16 scale in them is finite.
fn gguf_bytes(arch: &str, hidden: u64, ffn: u64, kind_of: impl Fn(&str) -> u32) -> Vec<u8> {
    let (h, kv) = (hidden, hidden / 2);
    let tensors: Vec<(&str, Vec<u64>)> = vec![
        ("token_embd.weight", vec![h, 8]),
        ("output_norm.weight", vec![h]),
        ("blk.0.attn_norm.weight", vec![h]),
        ("blk.0.ffn_norm.weight", vec![h]),
        ("blk.0.attn_q.weight", vec![h, h]),
        ("blk.0.attn_k.weight", vec![h, kv]),
        ("blk.0.attn_v.weight", vec![h, kv]),
        ("blk.0.attn_output.weight", vec![h, h]),
        ("blk.0.ffn_gate.weight", vec![h, ffn]),
        ("blk.0.ffn_up.weight", vec![h, ffn]),
        ("blk.0.ffn_down.weight", vec![ffn, h]),
    ];
    let arch_keys: [(&str, u32); 5] = [
        ("embedding_length", hidden as u32),
        ("block_count", 1),
        ("feed_forward_length", ffn as u32),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 1),
    ];
    let tokens = ["a", "b", "c", "d", "e", "Ġ", "Ċ", "<eos>"];
    let mut w = Writer(b"GGUF".to_vec());
    w.0.extend(3u32.to_le_bytes());
    w.0.extend((tensors.len() as u64).to_le_bytes());
    w.0.extend((arch_keys.len() as u64 + 7).to_le_bytes());
    w.kv_str("general.architecture", arch);
    for (k, v) in arch_keys {
        w.kv_u32(&format!("{arch}.{k}"), v);
    }
    w.kv_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5);
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", "gpt2");
    w.kv_strs("tokenizer.ggml.tokens", &tokens);
    w.kv_strs("tokenizer.ggml.merges", &[]);
    w.kv_u32("tokenizer.ggml.eos_token_id", 7);
    let mut offset = 0u64;
    let mut data = vec![];
    for (i, (name, dims)) in tensors.iter().enumerate() {
        w.str(name);
        w.0.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| w.0.extend(d.to_le_bytes()));
        let kind = kind_of(name);
        w.0.extend(kind.to_le_bytes());
        w.0.extend(offset.to_le_bytes());
        let n: u64 = dims.iter().product();
        let (per, bytes) = block_of(kind);
        if per == 1 {
            for j in 0..n {
                data.extend((((i as u64 * 31 + j * 17) % 23) as f32 / 100.0 - 0.1).to_le_bytes());
            }
        } else {
            data.extend((0..n / per * bytes).map(|j| ((i as u64 * 7 + j * 13) % 97) as u8));
        }
        offset += n / per * bytes;
        // Tensor data is aligned to 32 bytes in GGUF.
        let pad = offset.next_multiple_of(32) - offset;
        data.extend(std::iter::repeat_n(0u8, pad as usize));
        offset += pad;
    }
    while !w.0.len().is_multiple_of(32) {
        w.0.push(0);
    }
    w.0.extend(data);
    w.0
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("nuvec-gguf-{name}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn load_err(name: &str, bytes: &[u8]) -> String {
    let path = write(name, bytes);
    let result = nuvec_lm::load(path.to_str().unwrap());
    std::fs::remove_file(&path).ok();
    match result {
        Ok(_) => panic!("{name}: a broken GGUF loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_tiny_file_loads_and_runs() {
    let path = write("valid", &tiny_gguf("llama", 0));
    let (model, tokenizer) = nuvec_lm::load(path.to_str().unwrap()).unwrap();
    let ids = tokenizer.encode("abc", false).unwrap();
    assert_eq!(ids, vec![0, 1, 2]);
    let mut cache = model.new_cache();
    assert_eq!(model.forward(&ids, &mut cache).unwrap().shape(), &[3, 8]);
    std::fs::remove_file(&path).ok();
}

#[test]
fn unknown_architecture_and_tensor_type() {
    let err = load_err("arch", &tiny_gguf("gptj", 0));
    assert!(err.contains("gptj") && err.contains("llama"), "{err}");
    // ggml type 16 is IQ2_XXS: not converted yet, and said so by name and number.
    let err = load_err("qtype", &tiny_gguf("llama", 16));
    assert!(err.contains("attn_q") && err.contains("ggml type 16"), "{err}");
}

#[test]
fn the_kquant_file_loads_and_runs() {
    let path = write("kquants", &kquant_gguf());
    let (model, tokenizer) = nuvec_lm::load(path.to_str().unwrap()).unwrap();
    let ids = tokenizer.encode("abc", false).unwrap();
    let mut cache = model.new_cache();
    assert_eq!(model.forward(&ids, &mut cache).unwrap().shape(), &[3, 8]);
    std::fs::remove_file(&path).ok();
}

#[test]
fn kquant_rows_must_fill_super_blocks() {
    // attn_q as Q4_K with 32 columns: 1024 values fill 4 super-blocks, but no row fills one.
    let err = load_err("kq-narrow", &tiny_gguf("llama", 12));
    assert!(err.contains("attn_q") && err.contains("32 columns") && err.contains("256"), "{err}");
    // A tensor whose values do not fill whole super-blocks at all (a norm of 32 as Q5_K).
    let mut bytes = tiny_gguf("llama", 0);
    let name = b"blk.0.attn_norm.weight";
    let at = find(&bytes, name) + name.len() + 4 + 8;
    bytes[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    let err = load_err("kq-partial", &bytes);
    assert!(err.contains("attn_norm") && err.contains("blocks of 256"), "{err}");
}

/// Overwrites the bytes just after `key` (past `skip` bytes) with `value`.
fn patch(bytes: &mut [u8], key: &[u8], skip: usize, value: &[u8]) {
    let at = find(bytes, key) + key.len() + skip;
    bytes[at..at + value.len()].copy_from_slice(value);
}

/// A file broken at one place: name, the key it is found by, bytes to skip past the key (a
/// value's type, or a tensor's dims and type), the bytes written there, and words the error says.
type Case = (&'static str, &'static [u8], usize, Vec<u8>, &'static [&'static str]);

#[test]
fn values_and_layouts_that_cannot_be_right() {
    let file = || tiny_gguf("llama", 0);
    let cases: [Case; 8] = [
        ("layers0", b"llama.block_count", 4, 0u32.to_le_bytes().to_vec(), &["llama.block_count", "= 0"]),
        // Three heads cannot split attn_q's rows (the hidden size) into heads of an even size.
        ("heads", b"llama.attention.head_count", 4, 3u32.to_le_bytes().to_vec(), &["head_count = 3", "does not split"]),
        ("eps-nan", b"layer_norm_rms_epsilon", 4, f32::NAN.to_le_bytes().to_vec(), &["layer_norm_rms_epsilon", "NaN"]),
        ("eps0", b"layer_norm_rms_epsilon", 4, 0f32.to_le_bytes().to_vec(), &["layer_norm_rms_epsilon", "positive"]),
        ("eos", b"tokenizer.ggml.eos_token_id", 4, 99u32.to_le_bytes().to_vec(), &["eos_token_id = 99", "outside"]),
        // output_norm (1 dim): data offset + 4 bytes, off the 32-byte alignment.
        ("misaligned", b"output_norm.weight", 4 + 8 + 4, 4100u64.to_le_bytes().to_vec(), &["output_norm", "alignment"]),
        // output_norm placed over token_embd's bytes.
        ("overlap", b"output_norm.weight", 4 + 8 + 4, 0u64.to_le_bytes().to_vec(), &["overlap", "token_embd"]),
        (
            "unmapped",
            b"blk.0.ffn_norm.weight",
            0,
            vec![],
            &["not used", "blk.0.ffn_nrrm.weight", "wrong number of tensors"],
        ),
    ];
    for (name, key, skip, value, words) in cases {
        let mut bytes = file();
        if name == "unmapped" {
            patch(&mut bytes, b"blk.0.ffn_n", 0, b"rrm");
        } else {
            patch(&mut bytes, key, skip, &value);
        }
        let err = load_err(name, &bytes);
        assert!(err.contains(".gguf") && words.iter().all(|w| err.contains(w)), "{name}: {err}");
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack.windows(needle.len()).position(|w| w == needle).expect("present")
}

#[test]
fn truncated_anywhere() {
    let bytes = tiny_gguf("llama", 0);
    for cut in [0, 3, 8, 20, 24, 100, bytes.len() / 2, bytes.len() - 1] {
        let err = load_err("cut", &bytes[..cut]);
        assert!(err.contains(".gguf"), "cut at {cut}: {err}");
    }
}

#[test]
fn random_mutations_never_panic() {
    mutate(&tiny_gguf("llama", 0), "fuzz", 2026, 1500);
}

#[test]
fn random_mutations_of_kquant_files_never_panic() {
    mutate(&kquant_gguf(), "fuzz-kquants", 2027, 400);
}

fn mutate(valid: &[u8], name: &str, seed: u64, runs: usize) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let path = write(name, valid);
    let mut outcomes = (0, 0);
    for _ in 0..runs {
        let mut bytes = valid.to_vec();
        for _ in 0..rng.gen_range(1..6) {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] = match rng.gen_range(0..3) {
                0 => rng.gen(),
                1 => 0xff,
                _ => 0,
            };
        }
        if rng.gen_bool(0.2) {
            bytes.truncate(rng.gen_range(0..bytes.len()));
        }
        std::fs::write(&path, &bytes).unwrap();
        let p = path.clone();
        let result = std::panic::catch_unwind(move || nuvec_lm::load(p.to_str().unwrap()).map(|_| ()));
        match result {
            Err(_) => panic!("a mutated GGUF panicked the loader; bytes kept at {}", path.display()),
            Ok(Ok(())) => outcomes.0 += 1,
            Ok(Err(_)) => outcomes.1 += 1,
        }
    }
    std::fs::remove_file(&path).ok();
    assert!(outcomes.1 > runs / 15, "mutations should mostly be refused: {outcomes:?}");
}

// ---- SentencePiece ("llama") vocabularies ----

/// The llama hyperparameters of the SentencePiece file below (hidden 32 over 2 heads).
const ARCH_KEYS: &[(&str, u32)] = &[
    ("embedding_length", 32),
    ("block_count", 1),
    ("feed_forward_length", 64),
    ("attention.head_count", 2),
    ("attention.head_count_kv", 1),
];

impl Writer {
    fn kv_bool(&mut self, k: &str, v: bool) {
        self.str(k);
        self.0.extend(7u32.to_le_bytes());
        self.0.push(v as u8);
    }
    fn kv_array_header(&mut self, k: &str, item_type: u32, len: usize) {
        self.str(k);
        self.0.extend(9u32.to_le_bytes());
        self.0.extend(item_type.to_le_bytes());
        self.0.extend((len as u64).to_le_bytes());
    }
}

/// The parts of a SentencePiece vocabulary that the tests below break one at a time.
struct Spm {
    model: &'static str,
    tokens: Vec<&'static str>,
    scores: Option<Vec<f32>>,
    types: Vec<i32>,
    bos: u32,
}

fn valid_spm() -> Spm {
    Spm {
        model: "llama",
        tokens: vec!["<unk>", "<s>", "</s>", "<0x0A>", "\u{2581}", "a", "b", "\u{2581}a"],
        scores: Some(vec![0.0, 0.0, 0.0, 0.0, -3.0, -4.0, -5.0, -1.0]),
        types: vec![2, 3, 3, 6, 1, 1, 1, 1],
        bos: 1,
    }
}

/// The tiny llama file of `tiny_gguf`, with a SentencePiece vocabulary instead of byte-level BPE.
fn tiny_spm_gguf(spm: &Spm) -> Vec<u8> {
    let tensors: Vec<(&str, Vec<u64>)> = vec![
        ("token_embd.weight", vec![32, 8]),
        ("output_norm.weight", vec![32]),
        ("blk.0.attn_norm.weight", vec![32]),
        ("blk.0.ffn_norm.weight", vec![32]),
        ("blk.0.attn_q.weight", vec![32, 32]),
        ("blk.0.attn_k.weight", vec![32, 16]),
        ("blk.0.attn_v.weight", vec![32, 16]),
        ("blk.0.attn_output.weight", vec![32, 32]),
        ("blk.0.ffn_gate.weight", vec![32, 64]),
        ("blk.0.ffn_up.weight", vec![32, 64]),
        ("blk.0.ffn_down.weight", vec![64, 32]),
    ];
    let mut w = Writer(b"GGUF".to_vec());
    w.0.extend(3u32.to_le_bytes());
    w.0.extend((tensors.len() as u64).to_le_bytes());
    let kv_count = ARCH_KEYS.len() + 9 + usize::from(spm.scores.is_some());
    w.0.extend((kv_count as u64).to_le_bytes());
    w.kv_str("general.architecture", "llama");
    for (k, v) in ARCH_KEYS {
        w.kv_u32(&format!("llama.{k}"), *v);
    }
    w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    w.kv_str("tokenizer.ggml.model", spm.model);
    w.kv_strs("tokenizer.ggml.tokens", &spm.tokens);
    if let Some(scores) = &spm.scores {
        w.kv_array_header("tokenizer.ggml.scores", 6, scores.len());
        scores.iter().for_each(|s| w.0.extend(s.to_le_bytes()));
    }
    w.kv_array_header("tokenizer.ggml.token_type", 5, spm.types.len());
    spm.types.iter().for_each(|t| w.0.extend(t.to_le_bytes()));
    w.kv_u32("tokenizer.ggml.bos_token_id", spm.bos);
    w.kv_u32("tokenizer.ggml.eos_token_id", 2);
    w.kv_bool("tokenizer.ggml.add_bos_token", true);
    w.kv_str("tokenizer.chat_template", "{% for m in messages %}[{{ m['content'] }}]{% endfor %}");
    let mut offset = 0u64;
    let mut data = vec![];
    for (i, (name, dims)) in tensors.iter().enumerate() {
        w.str(name);
        w.0.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| w.0.extend(d.to_le_bytes()));
        w.0.extend(0u32.to_le_bytes());
        w.0.extend(offset.to_le_bytes());
        let n: u64 = dims.iter().product();
        for j in 0..n {
            data.extend((((i as u64 * 29 + j * 13) % 19) as f32 / 100.0 - 0.1).to_le_bytes());
        }
        offset += n * 4;
    }
    while !w.0.len().is_multiple_of(32) {
        w.0.push(0);
    }
    w.0.extend(data);
    w.0
}

#[test]
fn a_sentencepiece_vocabulary_loads_and_runs() {
    let path = write("spm-valid", &tiny_spm_gguf(&valid_spm()));
    let (model, tokenizer) = nuvec_lm::load(path.to_str().unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    // The file's add_bos_token puts its bos_token_id first; text made of the vocabulary's
    // pieces and of a byte that only the byte-fallback token holds comes back whole.
    let ids = tokenizer.encode("a ba\n", true).unwrap();
    assert_eq!(ids[0], 1);
    assert!(ids.contains(&3), "the newline should fall back to <0x0A>: {ids:?}");
    assert_eq!(tokenizer.decode(&ids[1..]).unwrap(), "a ba\n");
    assert_eq!(tokenizer.eos_token_ids(), &[2]);
    let rendered = tokenizer.chat_template().unwrap().render_values(
        &serde_json::json!([{"role": "user", "content": "a b"}]),
        false,
        false,
        &Default::default(),
    );
    assert_eq!(rendered.unwrap(), "[a b]");
    let mut cache = model.new_cache();
    assert_eq!(model.forward(&ids, &mut cache).unwrap().shape(), &[ids.len(), 8]);
}

#[test]
fn broken_sentencepiece_vocabularies() {
    let cases: Vec<(&str, Spm, &[&str])> = vec![
        ("no-scores", Spm { scores: None, ..valid_spm() }, &["tokenizer.ggml.scores", "missing"]),
        (
            "short-scores",
            Spm { scores: Some(vec![0.0; 7]), ..valid_spm() },
            &["tokenizer.ggml.scores", "7 entries for 8 tokens"],
        ),
        (
            "nan-score",
            Spm { scores: Some(vec![0.0, 0.0, 0.0, 0.0, f32::NAN, -4.0, -5.0, -1.0]), ..valid_spm() },
            &["token 4", "finite"],
        ),
        ("bad-type", Spm { types: vec![2, 3, 3, 6, 1, 9, 1, 1], ..valid_spm() }, &["token 5", "token type", "9"]),
        ("negative-type", Spm { types: vec![2, 3, 3, 6, 1, 1, -1, 1], ..valid_spm() }, &["token 6", "token type"]),
        ("byte-type", Spm { types: vec![2, 3, 3, 6, 1, 6, 1, 1], ..valid_spm() }, &["token 5", "byte", "<0xNN>"]),
        ("bos-out-of-range", Spm { bos: 99, ..valid_spm() }, &["bos_token_id", "99"]),
        (
            "equal-scores",
            Spm { scores: Some(vec![-1000.0; 8]), ..valid_spm() },
            &["same score", "merge order", "tokenizer.model"],
        ),
        ("unknown-model", Spm { model: "bert", ..valid_spm() }, &["\"bert\"", "not built yet", "\"llama\""]),
    ];
    for (name, spm, expected) in cases {
        let err = load_err(name, &tiny_spm_gguf(&spm));
        for e in expected {
            assert!(err.contains(e) && err.contains(".gguf"), "{name}: {e:?} not in: {err}");
        }
    }
}

#[test]
fn mutated_sentencepiece_vocabularies_never_panic() {
    let valid = tiny_spm_gguf(&valid_spm());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2027);
    let path = write("spm-fuzz", &valid);
    // Mutations inside the tokenizer's metadata only: from its first key to the tensor infos.
    let find = |needle: &[u8]| valid.windows(needle.len()).position(|w| w == needle).unwrap();
    let (start, end) = (find(b"tokenizer.ggml.model") - 8, find(b"token_embd.weight") - 8);
    let mut refused = 0;
    for _ in 0..400 {
        let mut bytes = valid.clone();
        for _ in 0..rng.gen_range(1..4) {
            let at = rng.gen_range(start..end);
            bytes[at] = rng.gen();
        }
        std::fs::write(&path, &bytes).unwrap();
        let p = path.clone();
        let result = std::panic::catch_unwind(move || nuvec_lm::load(p.to_str().unwrap()).map(|_| ()));
        match result {
            Err(_) => panic!("a mutated SentencePiece GGUF panicked the loader; bytes kept at {}", path.display()),
            Ok(r) => refused += usize::from(r.is_err()),
        }
    }
    std::fs::remove_file(&path).ok();
    assert!(refused > 100, "mutations should mostly be refused: {refused} of 400");
}
