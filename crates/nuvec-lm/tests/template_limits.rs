//! A hostile chat template fails quickly with an error naming its file: the fuel bound stops
//! endless loops, the size bound stops templates that grow strings until memory runs out.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nuvec_lm::{Message, Tokenizer};
use serde_json::json;

const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0,"hello":1,"world":2},"unk_token":"<unk>"}}"#;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn tokenizer_dir(name: &str) -> Dir {
    let dir = std::env::temp_dir().join(format!("nuvec-template-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    Dir(dir)
}

/// Renders `template` (from tokenizer_config.json) and returns its error, which must come
/// within a few seconds (a generous bound: the point is that it comes at all).
fn render_err(name: &str, template: &str) -> String {
    let dir = tokenizer_dir(name);
    std::fs::write(dir.0.join("tokenizer_config.json"), json!({"chat_template": template}).to_string()).unwrap();
    let tokenizer = Tokenizer::load(&dir.0, &[]).unwrap();
    let start = Instant::now();
    let result = tokenizer.chat_template().unwrap().render(&[Message::new("user", "hello")], true, &Default::default());
    let took = start.elapsed();
    let err = match result {
        Ok(text) => panic!("{name}: a hostile template rendered {} bytes", text.len()),
        Err(e) => e.to_string(),
    };
    assert!(took < Duration::from_secs(10), "{name}: took {took:?}");
    eprintln!("{name}: failed after {took:?}");
    assert!(err.contains("chat template") && err.contains("tokenizer_config.json"), "{name}: {err}");
    err
}

#[test]
fn nested_loops_run_out_of_fuel() {
    let err =
        render_err("ranges", "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}");
    assert!(err.contains("instructions"), "{err}");
    let err = render_err("recursion", "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}");
    assert!(err.contains("chat template"), "{err}");
}

#[test]
fn growing_strings_stop_at_the_size_bound() {
    for (name, template) in [
        (
            "namespace",
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
        ),
        ("tilde", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
        ("join", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}"),
        ("method", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('a', ns.s) %}{% endfor %}"),
        ("repeat", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s * 2 %}{% endfor %}"),
        ("list", "{% set ns = namespace(l=['ab']) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"),
        ("macro", "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('ab', 60) }}"),
        ("printed", "{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}"),
        ("raw-text", &format!("{{% for i in range(100000) %}}{}{{% endfor %}}", "x".repeat(1000))),
        ("joiner", "{% set s = 'x' * 1000000 %}{{ range(1000)|join(s) }}"),
        ("indent", "{{ 'a\nb'|indent(100000000) }}"),
        ("repeated-list", "{% set s = 'x' * 10000000 %}{{ ([s] * 1000) ~ '' }}"),
        ("printed-list", "{% set s = 'x' * 10000000 %}{{ [s] * 1000 }}"),
        ("string-filter", "{% set s = 'x' * 10000000 %}{{ ([s] * 1000)|string|length }}"),
        ("tojson", "{% set s = 'x' * 10000000 %}{{ ([s] * 1000)|tojson|length }}"),
        ("tojson-indent", "{{ [[1, 2], [3]]|tojson(indent=100000000) }}"),
    ] {
        let err = render_err(name, template);
        // minijinja's own bound on `*` (100 MB) may come first.
        assert!(err.contains("64 MiB") || err.contains("repeated string is too large"), "{name}: {err}");
    }
}

#[test]
fn errors_name_chat_template_jinja() {
    let dir = tokenizer_dir("jinja");
    std::fs::write(
        dir.0.join("chat_template.jinja"),
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    )
    .unwrap();
    let tokenizer = Tokenizer::load(&dir.0, &[]).unwrap();
    let err = tokenizer.chat_template().unwrap().render(&[], true, &Default::default()).unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja") && err.contains("instructions"), "{err}");
}

#[test]
fn ordinary_templates_still_render() {
    let dir = tokenizer_dir("ok");
    let template = "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s + m.role + ': ' \
                    ~ m.content|replace('x', 'y') %}{% endfor %}{{ ns.s }}{{ ['a', 'b']|join(',') }}{% for i in range(3) %}{{ loop.index }}{% endfor %}";
    std::fs::write(dir.0.join("tokenizer_config.json"), json!({"chat_template": template}).to_string()).unwrap();
    let tokenizer = Tokenizer::load(&dir.0, &[]).unwrap();
    let rendered =
        tokenizer.chat_template().unwrap().render(&[Message::new("user", "xox")], true, &Default::default()).unwrap();
    assert_eq!(rendered, "user: yoya,b123");
}

#[test]
fn a_chat_template_that_is_not_a_string_is_refused() {
    let dir = tokenizer_dir("five");
    std::fs::write(dir.0.join("tokenizer_config.json"), r#"{"chat_template": 5}"#).unwrap();
    let err = Tokenizer::load(&dir.0, &[]).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json") && err.contains("chat_template = 5"), "{err}");
}
