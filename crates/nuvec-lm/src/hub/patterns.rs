//! Allow-patterns as `huggingface_hub` matches them (Python's `fnmatch`): `*` is any run of
//! characters, `/` included, `?` any one character; the rest literal (the `[…]` classes are not
//! used by any pattern nuvec passes).

/// Whether `name` matches any of `patterns`.
pub(crate) fn allowed(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| matches(p.as_bytes(), name.as_bytes()))
}

fn matches(pattern: &[u8], name: &[u8]) -> bool {
    // Greedy with one backtrack point: the classic linear wildcard match.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::DEFAULT_ALLOW_PATTERNS;

    #[test]
    fn mlx_lm_s_patterns_pick_what_the_loader_reads() {
        let patterns: Vec<String> = DEFAULT_ALLOW_PATTERNS.iter().map(|p| p.to_string()).collect();
        for name in [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "tokenizer.model",
            "sub/extra.json",
            "chat_template.jinja",
            "merges.txt",
            "modeling_x.py",
        ] {
            assert!(allowed(name, &patterns), "{name}");
        }
        for name in ["pytorch_model.bin", "model.gguf", "consolidated.safetensors", "README.md", ".gitattributes"] {
            assert!(!allowed(name, &patterns), "{name}");
        }
        assert!(matches(b"a?c*", b"abcdef") && !matches(b"a?c", b"ac") && matches(b"*", b""));
    }
}
