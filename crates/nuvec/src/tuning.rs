//! Every environment variable nuvec reads at run time, declared once ([`KNOBS`]): name, values,
//! default, the device it concerns and what it trades. Code reads them through [`setting`] (a
//! device's value: what a program gave that device with [`configure`], else the environment's;
//! see `settings.rs`) or, for the knobs that are one per process, [`env`] / [`env_os`] (drop-in
//! for `std::env::var` / `var_os`, limited to declared names). Each is parsed once where it is
//! read (a GPU's all together, `backends/cuda/knobs.rs`), and `nuvec --help-env` prints the
//! list. A unit test keeps the
//! list and the sources in step: no `NUVEC_*` read outside this module's functions, no
//! undeclared name, no declared name that nothing reads. Variables of the test suites and bench
//! scripts (fixtures, oracle paths) are not knobs and are documented where they are read.

use std::ffi::OsString;

mod settings;
pub use settings::{configure, setting, settings, Settings};

/// One environment knob.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    /// The variable's name.
    pub name: &'static str,
    /// The values it takes.
    pub values: &'static str,
    /// What applies when it is unset.
    pub default: &'static str,
    /// Where it acts: "cpu", "cuda" or "any".
    pub device: &'static str,
    /// What it does, and what it trades.
    pub what: &'static str,
}

const fn knob(
    name: &'static str,
    values: &'static str,
    default: &'static str,
    device: &'static str,
    what: &'static str,
) -> Knob {
    Knob { name, values, default, device, what }
}

/// Every knob, by device and then name.
pub const KNOBS: &[Knob] = &[
    knob(
        "NUVEC_ALIGNED_CACHE",
        "a directory",
        "unset",
        "any",
        "misaligned safetensors copied there once with 256-byte aligned tensors, then mapped in place",
    ),
    knob(
        "NUVEC_BATCH_PIPELINE",
        "0, 1",
        "0",
        "any",
        "1: the Batcher enqueues a step of greedy requests before reading the step before (its picks fed on the \
         device), so that the device need not wait for the host between steps, at the cost of a wasted row for \
         each request that ends (BatcherOptions::pipeline overrides it; off until it measures faster)",
    ),
    knob(
        "NUVEC_DEVICE_SAMPLING",
        "0, 1",
        "1 on a GPU, 0 on the CPU",
        "any",
        "1: requests sampled at a temperature alone are drawn where the logits are (the Batcher and generate), \
         reading three words of a step's row instead of the whole row, the host drawing again (with the same \
         uniform) where the draw is not certainly its own (BatcherOptions::device_sampling overrides it)",
    ),
    knob("NUVEC_CACHE", "a directory", "~/.cache/nuvec", "any", "where the default model, built tools and caches live"),
    knob(
        "NUVEC_DEFAULT_MODEL",
        "a model path",
        "the embedded SmolLM2-135M GGUF",
        "any",
        "the model the CLI runs when --model is not given",
    ),
    knob(
        "NUVEC_DISTRIBUTED_TIMEOUT",
        "seconds",
        "60",
        "any",
        "how long a rank of a process group (mpirun) waits for the others before its call fails, naming the rank \
         it waited for",
    ),
    knob(
        "NUVEC_PIPELINE_MICRO_BATCHES",
        "micro-batches",
        "the pipeline's ranks",
        "any",
        "a step of several sequences over a pipeline (mpirun, --pipeline) runs as this many micro-batches of \
         consecutive sequences, so that each stage runs one while the stage before it runs the next (1: the \
         whole step at once); every rank must be given the same value",
    ),
    knob(
        "NUVEC_CPU_INT8_DOT",
        "0, 1",
        "0",
        "cpu",
        "4- and 8-bit products of up to 32 input rows take the input quantized to int8 per 32 values \
         (llama.cpp's Q8_1 arithmetic, AVX2 or AVX-512 VNNI): faster decode, logits within that rounding instead of f32",
    ),
    knob(
        "NUVEC_CPU_ISA",
        "avx2, scalar",
        "the best the processor has (AVX-512, AVX2)",
        "cpu",
        "caps nuvec's SIMD kernels' instruction set (to compare them); the prefill GEMMs (the gemm crate) \
         still take AVX-512 where the processor has it",
    ),
    knob(
        "NUVEC_ATTS_BATCH_BLOCKS",
        "a block count; 0",
        "2048",
        "cuda",
        "a paged decode step of many sequences aims at about this many blocks with one common chunk of \
         keys; 0 splits every sequence as alone",
    ),
    knob(
        "NUVEC_CUDA_ALLOC_CACHE_MB",
        "megabytes; 0",
        "1024",
        "cuda",
        "freed device memory the caching allocator keeps for reuse, per device (0: none)",
    ),
    knob(
        "NUVEC_CUDA_GRAPHS",
        "0, 1, force, off, on, false, true",
        "1",
        "cuda",
        "one-token decode steps replayed as CUDA graphs; force also tries families not known to capture",
    ),
    knob(
        "NUVEC_CUDA_KERNEL_CACHE",
        "0, 1",
        "1",
        "cuda",
        "the kernels' PTX kept in $NUVEC_CACHE/cuda-kernels, so that a start does not compile them again \
         (NVRTC: 10-25 s); 0 compiles them at every start",
    ),
    knob(
        "NUVEC_CUDA_MATMUL",
        "auto, f32, tf32, bf16",
        "auto",
        "cuda",
        "precision of the prefill products and attention (auto: bf16 for half-precision models)",
    ),
    knob("NUVEC_DECODE_STREAM", "0, 1", "1", "cuda", "prefill decodes quantized weights on a second stream"),
    knob(
        "NUVEC_FLASH_ATTENTION",
        "0, 1",
        "1",
        "cuda",
        "the tensor-core flash attention kernels (prefill, paged decode); 0 keeps the f32 kernels",
    ),
    knob("NUVEC_GATE_UP_SILU", "0, 1", "1", "cuda", "gate, up and silu(gate) * up of a decode step in one launch"),
    knob(
        "NUVEC_MOE_GATHER_ROWS",
        "a row count",
        "64",
        "cuda",
        "up to this many rows, MoE experts read each chosen expert's weights per row; above, grouped",
    ),
    knob(
        "NUVEC_MOE_GROUPED_ROWS",
        "a row count",
        "8",
        "cuda",
        "from this many rows, MoE experts the grouped products take run grouped (each expert read once)",
    ),
    knob("NUVEC_MOE_GROUPED", "0, 1", "1", "cuda", "many-row MoE steps as grouped products; 0 runs the composed op"),
    knob("NUVEC_NORM_FOLD", "0, 1", "1", "cuda", "a decode step's norm folded into the next projection's integer GEMV"),
    knob(
        "NUVEC_NVRTC_DEFINES",
        "NAME=VALUE,...",
        "none",
        "cuda",
        "experiment-only macros for the kernel sources (QM_STAGES, QIR_RING, ...; docs/cuda.md)",
    ),
    knob(
        "NUVEC_PAGED_FLASH",
        "0, 1",
        "1",
        "cuda",
        "paged decode of 2+ sequences over bf16 or f16 stores on the tensor cores; 0 keeps the f32 kernel (steps \
         of few sequences then bit for bit each solo decode)",
    ),
    knob(
        "NUVEC_PAGED_FLASH_MIN_KEYS",
        "keys (a multiple of 32)",
        "96",
        "cuda",
        "the least keys per split of the tensor-core paged decode",
    ),
    knob(
        "NUVEC_PAGED_PREFIX_MIN_KEYS",
        "keys; 0",
        "256",
        "cuda",
        "the least keys sequences of a tensor-core paged decode step must share (the same cache \
         blocks, as the prefix cache hands out) to have them read once for the group; 0 reads each \
         sequence's keys on its own",
    ),
    knob(
        "NUVEC_PDL",
        "0, 1",
        "1",
        "cuda",
        "programmatic dependent launch (sm_90+): a kernel starts as the one before drains",
    ),
    knob(
        "NUVEC_PRODUCER_PARTS",
        "0, 1, norm,attention,gate_up",
        "1",
        "cuda",
        "which kernels also write the integer GEMVs' int8 parts of their output (0: separate split launches)",
    ),
    knob(
        "NUVEC_QGEMV_INT",
        "0, 1",
        "1",
        "cuda",
        "one-row 4-bit GEMVs and few-row 4-bit and mxfp4 experts on int8 dot products; 0 keeps the f32 loops",
    ),
    knob(
        "NUVEC_QGEMV_VARIANT",
        "body, w1, w2, w4, w8, xw1, i1, i2, i4",
        "chosen by shape",
        "cuda",
        "forces one 4-bit GEMV variant (for timing them)",
    ),
    knob(
        "NUVEC_QIMMA",
        "0, int, 1",
        "unset: bf16 up to NUVEC_QDEC_ROWS where the scales are bf16, else integers up to 16",
        "cuda",
        "few-row products over 4-bit weights: unset 2 to NUVEC_QDEC_ROWS (64) rows with weights and x in \
         bf16 where the scales are bf16, else 2-16 rows in integers; int 2-16 rows in integers (f32 \
         accuracy), 1 also 17-64 in integers (slower there), 0 none",
    ),
    knob(
        "NUVEC_QDEC_ROWS",
        "16, 32, 64",
        "64",
        "cuda",
        "the most input rows of the bf16 register kernels (more rows: the qmma kernels)",
    ),
    knob(
        "NUVEC_QDEC_SCALED_FROM",
        "a row count",
        "9",
        "cuda",
        "from this many input rows, 4-bit weights with f16 or f32 scales (GGUF's) take the bf16 register \
         kernels, decoded in f32 and rounded to bf16 (above 64: never)",
    ),
    knob(
        "NUVEC_QDEC_TPB",
        "1, 2",
        "2",
        "cuda",
        "the most weight tiles per block of the bf16 register kernels at 32-64 rows (where they fill the GPU)",
    ),
    knob(
        "NUVEC_QDEC_WGMMA",
        "0, 1",
        "unset: where the blocks fill half the GPU with K whole",
        "cuda",
        "the bf16 products of 17-64 rows with bf16 scales on Hopper's warpgroup MMA (qwg kernels, sm_90 \
         only): x copied once per 128 weight rows instead of loaded per 16; unset where their blocks \
         fill half the GPU (an 8B's gate/up), 1 every such product (K in ranges), 0 never",
    ),
    knob("NUVEC_ROPE_KV", "0, 1", "1", "cuda", "rope and the cache write of a decode step in one launch"),
    knob(
        "NUVEC_STAGED_UPLOADS",
        "0, 1",
        "0",
        "cuda",
        "1: copies of up to 1 MiB to the device (step tables, token ids) go through page-locked staging memory, so \
         the host does not wait for the queued work first (off: measured even on an H100, alone and pipelined)",
    ),
];

/// The knob named `name`, if declared.
pub fn find(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}

/// `std::env::var(name)` for a declared knob (an undeclared name is a bug: debug builds panic).
pub fn env(name: &str) -> Result<String, std::env::VarError> {
    debug_assert!(find(name).is_some(), "{name} is not declared in nuvec::tuning::KNOBS");
    std::env::var(name)
}

/// Where nuvec keeps what it installs and caches: `NUVEC_CACHE`, else `~/.cache/nuvec`; `None`
/// when neither `NUVEC_CACHE` nor `HOME` is set.
pub fn known_cache_dir() -> Option<std::path::PathBuf> {
    // Written out as `tuning::env_os("...")`: the knob test finds each reader by that text.
    match crate::tuning::env_os("NUVEC_CACHE") {
        Some(dir) => Some(dir.into()),
        None => std::env::var_os("HOME").map(|home| std::path::PathBuf::from(home).join(".cache/nuvec")),
    }
}

/// [`known_cache_dir`], else `./.cache/nuvec`.
pub fn cache_dir() -> std::path::PathBuf {
    known_cache_dir().unwrap_or_else(|| std::path::PathBuf::from(".").join(".cache/nuvec"))
}

/// `std::env::var_os(name)` for a declared knob.
pub fn env_os(name: &str) -> Option<OsString> {
    debug_assert!(find(name).is_some(), "{name} is not declared in nuvec::tuning::KNOBS");
    std::env::var_os(name)
}

/// What values a knob takes, as its reader parses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Free text (folders, paths, NVRTC definitions): anything.
    Free,
    /// A whole number.
    Count,
    /// A whole number of at least 1.
    Positive,
    /// A whole number that is a multiple of 32.
    MultipleOf32,
    /// 0 or a GEMV variant, 6 to 15.
    QgemvVariant,
    /// 0, 1, or a comma list of norm, attention, gate_up.
    Producers,
    /// One of the comma-separated values (exactly, or trimmed, or trimmed in any case, as the
    /// knob's reader compares).
    OneOf {
        /// The values, ", " between them (the knob's `values`).
        list: &'static str,
        /// The reader trims the value.
        trim: bool,
        /// The reader ignores case.
        any_case: bool,
    },
}

/// Knob `k`'s rule, from the form of its `values` text (the rest are lists of literal values).
pub fn rule(k: &Knob) -> Rule {
    match k.values {
        "a directory" | "a model path" | "NAME=VALUE,..." => Rule::Free,
        "a row count" | "megabytes; 0" | "a block count; 0" | "keys; 0" => Rule::Count,
        "seconds" | "micro-batches" => Rule::Positive,
        "keys (a multiple of 32)" => Rule::MultipleOf32,
        "0, 6..15" => Rule::QgemvVariant,
        "0, 1, norm,attention,gate_up" => Rule::Producers,
        list => Rule::OneOf {
            list,
            trim: matches!(k.name, "NUVEC_CUDA_MATMUL" | "NUVEC_CUDA_GRAPHS"),
            any_case: k.name == "NUVEC_CUDA_MATMUL",
        },
    }
}

/// What `value` fails to be for knob `k` (`None`: a value it takes). An empty value is the
/// default, as every knob reads it. Each [`rule`] is the one the knob's reader applies, so that a
/// value the reader would quietly take for its default (`NUVEC_PDL=off` leaves PDL on) is refused
/// here.
pub fn refusal(k: &Knob, value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    let count = || value.trim().parse::<usize>().ok();
    let ok = match rule(k) {
        Rule::Free => true,
        Rule::Count => count().is_some(),
        Rule::Positive => count().is_some_and(|n| n > 0),
        Rule::MultipleOf32 => count().is_some_and(|n| n % 32 == 0),
        Rule::QgemvVariant => count().is_some_and(|n| n == 0 || (6..=15).contains(&n)),
        Rule::Producers => {
            value == "0"
                || value == "1"
                || value.split(',').all(|p| ["norm", "attention", "gate_up"].contains(&p.trim()))
        }
        Rule::OneOf { list, trim, any_case } => {
            let v = if trim { value.trim() } else { value };
            let v = if any_case { v.to_ascii_lowercase() } else { v.to_string() };
            list.split(", ").any(|allowed| allowed == v)
        }
    };
    (!ok).then(|| {
        format!("{}={value:?} is not a value it takes ({}); see `nuvec --help-env`, or unset it", k.name, k.values)
    })
}

/// Checks every knob set in this process's environment ([`refusal`]): the first refused value is
/// the error. `nuvec` runs it before any command; a program using the library can too.
pub fn check_env() -> Result<(), String> {
    for k in KNOBS {
        if let Some(v) = std::env::var_os(k.name) {
            let v = v.to_string_lossy();
            if let Some(why) = refusal(k, &v) {
                return Err(why);
            }
        }
    }
    Ok(())
}

/// The knobs as a text table, each with its value in this process when set.
pub fn help() -> String {
    let mut out = String::from(
        "Environment knobs (each device reads them once, when it starts; a program can give a device its \
         own values with nuvec::tuning::configure; experiment-only kernel macros go through \
         NUVEC_NVRTC_DEFINES):\n\n",
    );
    for k in KNOBS {
        let now = std::env::var_os(k.name).map(|v| format!(" (now: {})", v.to_string_lossy())).unwrap_or_default();
        out.push_str(&format!(
            "  {} [{}] = {}, default {}{now}\n      {}\n",
            k.name, k.device, k.values, k.default, k.what
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                // Test suites and their helpers read fixture variables, not knobs.
                if name != "tests" && name != "target" {
                    sources(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    /// The `NUVEC_*` string literals of `text` that follow `call`.
    fn names_after(text: &str, call: &str) -> Vec<String> {
        text.match_indices(call)
            .map(|(i, _)| {
                let rest = &text[i + call.len()..];
                rest.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect()
            })
            .collect()
    }

    #[test]
    fn values_a_reader_would_take_for_its_default_are_refused() {
        let refused = |name: &str, v: &str| refusal(find(name).unwrap(), v).is_some();
        for (name, good, bad) in [
            ("NUVEC_PDL", "0", "off"),
            ("NUVEC_PDL", "1", "true"),
            ("NUVEC_CUDA_GRAPHS", " force", "sometimes"),
            ("NUVEC_CUDA_GRAPHS", "off", "2"),
            ("NUVEC_CUDA_MATMUL", "BF16", "fp16"),
            ("NUVEC_CPU_ISA", "scalar", "avx512"),
            ("NUVEC_QIMMA", "int", "INT"),
            ("NUVEC_QDEC_ROWS", "32", "48"),
            ("NUVEC_MOE_GROUPED_ROWS", "16", "sixteen"),
            ("NUVEC_CUDA_ALLOC_CACHE_MB", "0", "-1"),
            ("NUVEC_PAGED_FLASH_MIN_KEYS", "64", "100"),
            ("NUVEC_QGEMV_VARIANT", "i1", "13"),
            ("NUVEC_PRODUCER_PARTS", "norm, gate_up", "norm,merge"),
            ("NUVEC_DISTRIBUTED_TIMEOUT", "30", "0"),
        ] {
            assert!(!refused(name, good), "{name}={good:?} refused");
            assert!(refused(name, bad), "{name}={bad:?} taken");
        }
        // Free-text knobs take anything; an empty value is the default everywhere.
        assert!(!refused("NUVEC_NVRTC_DEFINES", "QG_PF_BYTES=0") && !refused("NUVEC_ALIGNED_CACHE", "/x"));
        assert!(KNOBS.iter().all(|k| refusal(k, "").is_none()));
        let why = refusal(find("NUVEC_PDL").unwrap(), "off").unwrap();
        assert!(why.contains("NUVEC_PDL=\"off\"") && why.contains("0, 1") && why.contains("--help-env"), "{why}");
    }

    #[test]
    fn every_knob_s_values_have_a_rule() {
        // A values text that is neither one of rule()'s forms nor a list of bare tokens would be
        // read as a list that refuses everything but its own text.
        for k in KNOBS {
            if let Rule::OneOf { list, .. } = rule(k) {
                let tokens =
                    list.split(", ").all(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                assert!(tokens, "{}: values {list:?} have no rule in tuning::rule", k.name);
                assert!(
                    refusal(k, list.split(", ").next().unwrap()).is_none(),
                    "{} refuses its own first value",
                    k.name
                );
            }
        }
    }

    #[test]
    fn every_knob_is_declared_once_and_read_through_this_module() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = Vec::new();
        sources(crates, &mut files);
        assert!(files.len() > 50, "found {} sources under {}", files.len(), crates.display());
        let mut read = std::collections::BTreeSet::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for call in ["env::var(\"NUVEC_", "env::var_os(\"NUVEC_"] {
                let direct = names_after(&text, call);
                assert!(direct.is_empty(), "{}: reads {direct:?} directly; use nuvec::tuning::env", file.display());
            }
            // `cuda_knob`: a GPU's knobs, read through `setting` in backends/cuda/knobs.rs.
            for call in
                ["tuning::env(\"NUVEC_", "tuning::env_os(\"NUVEC_", "tuning::setting(\"NUVEC_", "cuda_knob(\"NUVEC_"]
            {
                for name in names_after(&text, call) {
                    let name = format!("NUVEC_{name}");
                    assert!(find(&name).is_some(), "{}: {name} is not declared in KNOBS", file.display());
                    read.insert(name);
                }
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for k in KNOBS {
            assert!(seen.insert(k.name), "{} declared twice", k.name);
            assert!(read.contains(k.name), "{} is declared but nothing reads it", k.name);
            assert!(["cpu", "cuda", "any"].contains(&k.device), "{}: device {:?}", k.name, k.device);
        }
    }
}
