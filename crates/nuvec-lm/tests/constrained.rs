//! Structured output on the real model (SmolLM2-135M-Instruct, its GGUF): outputs held to JSON
//! schemas, regexes, a grammar and a choice are judged by Python (`jsonschema`, `re`, `ast`: the
//! pinned serve-tests venv, `$NUVEC_OPENAI_PYTHON`), greedy and sampled, alone and in the Batcher;
//! a constraint the unconstrained output already meets changes no token; bad constraints are
//! refused naming what is wrong.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::default_gguf;
use nuvec_lm::chat::tools::ForcedTool;
use nuvec_lm::chat::{ChatDelta, ToolFormat};
use nuvec_lm::constrain::{Constraint, Grammar, Vocabulary};
use nuvec_lm::{
    generate, Batcher, BatcherOptions, Event, FinishReason, GenerateOptions, Message, Model, Sampler, Tokenizer,
};
use serde_json::{json, Value};

fn model() -> (Model, Tokenizer) {
    nuvec_lm::load(default_gguf().to_str().unwrap()).unwrap()
}

fn chat(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let template = tokenizer.chat_template().expect("the GGUF carries a chat template");
    let rendered = template.render(&[Message::new("user", text)], true, &Default::default()).unwrap();
    tokenizer.encode(&rendered, false).unwrap()
}

/// The text and finish reason of one generation.
fn run(
    model: &Model,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: GenerateOptions,
) -> (Vec<u32>, String, FinishReason) {
    let mut g = generate(model, prompt, options).unwrap();
    let tokens: Vec<u32> = g.by_ref().map(|t| t.unwrap()).collect();
    let reason = g.finish_reason().cloned().expect("ended");
    (tokens.clone(), tokenizer.decode(&tokens).unwrap(), reason)
}

/// Python's verdict on each case (`{"kind": "schema"|"regex"|"expr"|"choice", ...}`): `None` when
/// valid, else why not.
fn judge(cases: &[Value]) -> Vec<Option<String>> {
    let python = std::env::var("NUVEC_OPENAI_PYTHON").unwrap_or_else(|_| {
        panic!("NUVEC_OPENAI_PYTHON is not set: run `scripts/test.sh` (scripts/setup-serve-tests.sh)")
    });
    let script = r#"
import ast, json, re, sys
import jsonschema
for line in sys.stdin:
    c = json.loads(line)
    try:
        if c["kind"] == "schema":
            jsonschema.validate(json.loads(c["text"]), c["schema"])
        elif c["kind"] == "regex":
            assert re.fullmatch(c["regex"], c["text"]), "no full match"
        elif c["kind"] == "expr":
            tree = ast.parse(c["text"], mode="eval")
            for node in ast.walk(tree):
                assert isinstance(node, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)), type(node).__name__
        elif c["kind"] == "choice":
            assert c["text"] in c["options"], "not one of the options"
        print(json.dumps(None))
    except Exception as e:
        print(json.dumps(f"{type(e).__name__}: {e}"))
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running the judge");
    let mut stdin = child.stdin.take().unwrap();
    for c in cases {
        writeln!(stdin, "{c}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the judge failed");
    let verdicts: Vec<Option<String>> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(verdicts.len(), cases.len(), "a verdict per case");
    verdicts
}

/// Twenty schemas, from a flat object to nested objects, arrays of enums, bounded numbers and
/// patterned strings (every string and array bounded, so that each output ends in 200 tokens).
fn schemas() -> Vec<(&'static str, Value)> {
    let name = json!({"type": "string", "minLength": 1, "maxLength": 16});
    vec![
        (
            "a city",
            json!({"type": "object", "properties": {"city": name}, "required": ["city"], "additionalProperties": false}),
        ),
        ("a boolean", json!({"type": "boolean"})),
        ("an integer between 1 and 10", json!({"type": "integer", "minimum": 1, "maximum": 10})),
        ("a colour", json!({"enum": ["red", "green", "blue"]})),
        ("a constant", json!({"const": "yes"})),
        (
            "a person",
            json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "three numbers",
            json!({"type": "array", "items": {"type": "number", "minimum": -100, "maximum": 100}, "minItems": 3, "maxItems": 3}),
        ),
        ("pets", json!({"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "minItems": 1, "maxItems": 4})),
        ("a date", json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"})),
        (
            "a book",
            json!({"type": "object", "properties": {"title": name, "year": {"type": "integer", "minimum": 1500, "maximum": 2030}, "genre": {"enum": ["novel", "poetry", "science"]}}, "required": ["title", "year", "genre"], "additionalProperties": false}),
        ),
        (
            "a point",
            json!({"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}, "y": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["x", "y"], "additionalProperties": false}),
        ),
        (
            "a string or a number",
            json!({"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer", "minimum": 0, "maximum": 99}]}),
        ),
        (
            "an address",
            json!({"type": "object", "properties": {"street": name, "city": name, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"], "additionalProperties": false}),
        ),
        (
            "a person with an address",
            json!({"type": "object", "properties": {"name": name, "address": {"type": "object", "properties": {"city": name, "country": name}, "required": ["city", "country"], "additionalProperties": false}}, "required": ["name", "address"], "additionalProperties": false}),
        ),
        (
            "a team",
            json!({"type": "object", "properties": {"team": name, "members": {"type": "array", "items": name, "minItems": 1, "maxItems": 3}}, "required": ["team", "members"], "additionalProperties": false}),
        ),
        (
            "a tagged item",
            json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{3}[0-9]{2}$"}, "tags": {"type": "array", "items": {"enum": ["new", "sale", "old"]}, "maxItems": 2}}, "required": ["id", "tags"], "additionalProperties": false}),
        ),
        (
            "a matrix",
            json!({"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
        ),
        (
            "an order",
            json!({"type": "object", "properties": {"customer": {"type": "object", "properties": {"name": name}, "required": ["name"], "additionalProperties": false}, "items": {"type": "array", "items": {"type": "object", "properties": {"product": name, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["product", "qty"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}}, "required": ["customer", "items"], "additionalProperties": false}),
        ),
        (
            "a shape",
            json!({"$defs": {"circle": {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": false}, "square": {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "side"], "additionalProperties": false}}, "anyOf": [{"$ref": "#/$defs/circle"}, {"$ref": "#/$defs/square"}]}),
        ),
        (
            "a company",
            json!({"type": "object", "properties": {"name": name, "founded": {"type": "integer", "minimum": 1800, "maximum": 2030}, "offices": {"type": "array", "items": {"type": "object", "properties": {"city": name, "staff": {"type": "integer", "minimum": 1, "maximum": 999}, "open": {"type": "boolean"}}, "required": ["city", "staff", "open"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}, "public": {"type": "boolean"}}, "required": ["name", "founded", "offices", "public"], "additionalProperties": false}),
        ),
    ]
}

fn greedy(grammar: Grammar, max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, constraint: Some(grammar), ..Default::default() }
}

#[test]
fn twenty_schemas_give_json_valid_under_them() {
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let mut cases = vec![];
    for (what, schema) in schemas() {
        let grammar = Grammar::new(Constraint::JsonSchema(schema.clone()), &vocabulary).unwrap();
        let prompt = chat(&tokenizer, &format!("Answer with {what} as JSON."));
        let (_, text, reason) = run(&model, &tokenizer, &prompt, greedy(grammar, 200));
        assert_eq!(reason, FinishReason::EndOfSequence, "{what}: the output ended inside the grammar: {text:?}");
        cases.push(json!({"kind": "schema", "schema": schema, "text": text, "what": what}));
    }
    for (case, verdict) in cases.iter().zip(judge(&cases)) {
        assert!(verdict.is_none(), "{}: {:?} is not valid: {}", case["what"], case["text"], verdict.unwrap());
    }
    // json_object: any JSON object.
    let grammar = Grammar::new(Constraint::JsonObject, &vocabulary).unwrap();
    let prompt = chat(&tokenizer, "Describe a cat as a JSON object.");
    let (_, text, _) = run(&model, &tokenizer, &prompt, greedy(grammar, 200));
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("json_object gave {text:?}: {e}"));
    assert!(value.is_object(), "{text}");
}

#[test]
fn regexes_grammars_and_choices_hold() {
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let mut cases = vec![];
    let regexes = [
        ("Today's date, please.", r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
        ("Give me an email address for John.", r"[a-z]{1,10}(\.[a-z]{1,10})?@[a-z]{2,10}\.(com|org|net)"),
        ("Name a Rust variable.", r"[a-z_][a-z0-9_]{0,15}"),
        ("What time is it?", r"([01][0-9]|2[0-3]):[0-5][0-9]"),
    ];
    for (question, rx) in regexes {
        let grammar = Grammar::new(Constraint::Regex(rx.into()), &vocabulary).unwrap();
        let (_, text, _) = run(&model, &tokenizer, &chat(&tokenizer, question), greedy(grammar, 40));
        cases.push(json!({"kind": "regex", "regex": rx, "text": text}));
    }
    let arithmetic = r#"
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[1-9][0-9]{0,2}/
"#;
    let grammar = Grammar::new(Constraint::Lark(arithmetic.into()), &vocabulary).unwrap();
    let (_, text, _) =
        run(&model, &tokenizer, &chat(&tokenizer, "Write an arithmetic expression."), greedy(grammar, 40));
    cases.push(json!({"kind": "expr", "text": text}));
    let options = vec!["Paris".to_string(), "London".into(), "Berlin".into()];
    let grammar = Grammar::new(Constraint::Choice(options.clone()), &vocabulary).unwrap();
    let (_, text, reason) =
        run(&model, &tokenizer, &chat(&tokenizer, "What is the capital of France?"), greedy(grammar, 10));
    assert_eq!(reason, FinishReason::EndOfSequence);
    cases.push(json!({"kind": "choice", "options": options, "text": text}));
    for (case, verdict) in cases.iter().zip(judge(&cases)) {
        assert!(verdict.is_none(), "{case}: {}", verdict.unwrap());
    }
}

#[test]
fn a_constraint_the_output_already_meets_changes_no_token() {
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let prompt = chat(&tokenizer, "What is the capital of France?");
    let plain = GenerateOptions { max_tokens: 48, ..Default::default() };
    let (tokens, text, reason) = run(&model, &tokenizer, &prompt, plain);
    // Letters, digits, spaces and common punctuation, any length: the answer must be such text
    // (checked, so that the comparison below means something).
    let rx = r"[A-Za-z0-9 ,.'!?:;()\n-]*";
    assert!(judge(&[json!({"kind": "regex", "regex": rx, "text": text})])[0].is_none(), "{text:?}");
    let grammar = Grammar::new(Constraint::Regex(rx.into()), &vocabulary).unwrap();
    let (constrained, _, constrained_reason) = run(&model, &tokenizer, &prompt, greedy(grammar, 48));
    assert_eq!(constrained, tokens, "the constraint changed the greedy tokens of {text:?}");
    assert_eq!(constrained_reason, reason);
}

#[test]
fn the_mask_applied_where_the_logits_are_picks_the_host_path_s_tokens() {
    // Greedy under a constraint takes its token from the logits with the mask applied where they
    // are (`Array::mask_rows`, then `argmax_gap`); asking for log-probabilities sends every row
    // through the host path (log-softmax, the mask, the sampler). Both give the same tokens,
    // alone and in the Batcher, where each request also ends as it does alone.
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let cases: Vec<(String, Constraint)> = schemas()
        .into_iter()
        .take(4)
        .map(|(what, schema)| (format!("Answer with {what} as JSON."), Constraint::JsonSchema(schema)))
        .chain([("Name a Rust variable.".to_string(), Constraint::Regex(r"[a-z_][a-z0-9_]{0,15}".into()))])
        .collect();
    let grammars: Vec<Grammar> = cases.iter().map(|(_, c)| Grammar::new(c.clone(), &vocabulary).unwrap()).collect();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|(q, _)| chat(&tokenizer, q)).collect();
    let with_logprobs = |g: &Grammar| GenerateOptions { logprobs: Some(1), ..greedy(g.clone(), 60) };
    let (mut alone, mut alone_ends) = (vec![], vec![]);
    for (prompt, grammar) in prompts.iter().zip(&grammars) {
        let (device, text, reason) = run(&model, &tokenizer, prompt, greedy(grammar.clone(), 60));
        let (host, _, _) = run(&model, &tokenizer, prompt, with_logprobs(grammar));
        assert_eq!(device, host, "alone: {text:?}");
        alone.push(device);
        alone_ends.push(reason);
    }
    // The same batches (so the same logits) through either path.
    let mut batched: Vec<Vec<Vec<u32>>> = vec![];
    for logprobs in [false, true] {
        let mut batcher = Batcher::new(&model, BatcherOptions::default()).unwrap();
        let ids: Vec<_> = prompts
            .iter()
            .zip(&grammars)
            .map(|(p, g)| {
                let options = if logprobs { with_logprobs(g) } else { greedy(g.clone(), 60) };
                batcher.submit(p.clone(), options).unwrap()
            })
            .collect();
        let mut got: HashMap<_, Vec<u32>> = HashMap::new();
        let mut reasons: HashMap<_, FinishReason> = HashMap::new();
        while batcher.is_busy() {
            for e in batcher.step().unwrap() {
                match e {
                    Event::Token { id, token } => got.entry(id).or_default().push(token),
                    Event::Finished { id, reason } => drop(reasons.insert(id, reason)),
                    _ => {}
                }
            }
        }
        batched.push(ids.iter().map(|id| got[id].clone()).collect());
        let ends: Vec<FinishReason> = ids.iter().map(|id| reasons[id].clone()).collect();
        assert_eq!(ends, alone_ends, "the Batcher's finish reasons against each alone (log-probabilities: {logprobs})");
    }
    assert_eq!(batched[0], batched[1], "the Batcher: the mask where the logits are against the host path");
    assert_eq!(batched[0], alone, "the Batcher against each alone");
}

#[test]
fn sampled_outputs_stay_valid_in_the_batcher() {
    // 200 requests at temperature 1, each with its own seed, served together: every output holds
    // to the constraint, and a seed gives the same output alone.
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let rx = r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)";
    let grammar = Grammar::new(Constraint::Regex(rx.into()), &vocabulary).unwrap();
    let prompt = chat(&tokenizer, "Invent an email address.");
    let options = |seed: u64| GenerateOptions {
        max_tokens: 24,
        sampler: Sampler { temperature: 1.0, ..Default::default() },
        seed: Some(seed),
        constraint: Some(grammar.clone()),
        ..Default::default()
    };
    let mut batcher = Batcher::new(&model, BatcherOptions::default()).unwrap();
    let ids: Vec<_> = (0..200).map(|s| batcher.submit(prompt.clone(), options(s)).unwrap()).collect();
    let mut tokens: HashMap<_, Vec<u32>> = HashMap::new();
    while batcher.is_busy() {
        for e in batcher.step().unwrap() {
            match e {
                Event::Token { id, token } => tokens.entry(id).or_default().push(token),
                Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
                _ => {}
            }
        }
    }
    let texts: Vec<String> = ids.iter().map(|id| tokenizer.decode(&tokens[id]).unwrap()).collect();
    let cases: Vec<Value> = texts.iter().map(|t| json!({"kind": "regex", "regex": rx, "text": t})).collect();
    for (case, verdict) in cases.iter().zip(judge(&cases)) {
        assert!(verdict.is_none(), "{case}: {}", verdict.unwrap());
    }
    let distinct: std::collections::HashSet<&String> = texts.iter().collect();
    assert!(distinct.len() > 20, "sampling at temperature 1 gave only {} distinct outputs", distinct.len());
    let (alone, _, _) = run(&model, &tokenizer, &prompt, options(7));
    assert_eq!(alone, tokens[&ids[7]], "seed 7 alone and batched");
}

#[test]
fn bad_constraints_are_refused_naming_the_problem() {
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let refused = |c: Constraint| Grammar::new(c, &vocabulary).unwrap_err().to_string();
    let e = refused(Constraint::JsonSchema(json!({"type": "array", "uniqueItems": true})));
    assert!(e.contains("uniqueItems") && e.contains("JSON schema"), "{e}");
    let e = refused(Constraint::Regex("(".into()));
    assert!(e.contains("regex"), "{e}");
    let e = refused(Constraint::Lark("expr: NUMBER".into()));
    assert!(e.contains("grammar") && e.contains("start"), "{e}");
    let e = refused(Constraint::Choice(vec![]));
    assert!(e.contains("choice"), "{e}");
    let grammar = Grammar::new(Constraint::JsonObject, &vocabulary).unwrap();
    for options in [
        GenerateOptions { ignore_eos: true, constraint: Some(grammar.clone()), ..Default::default() },
        GenerateOptions { min_tokens: 3, constraint: Some(grammar.clone()), ..Default::default() },
    ] {
        let e = generate(&model, &[1, 2, 3], options).err().expect("refused").to_string();
        assert!(e.contains("constraint"), "{e}");
    }
}

#[test]
fn max_tokens_inside_the_grammar_says_so() {
    // Cut inside an object: the output does not meet the constraint, and the reason says so; cut
    // where the grammar may end (any run of letters), it is an ordinary length.
    let (model, tokenizer) = model();
    let vocabulary = Vocabulary::new(&tokenizer).unwrap();
    let prompt = chat(&tokenizer, "Describe a person as JSON.");
    let person = json!({"type": "object", "properties": {"name": {"type": "string"}, "bio": {"type": "string"}},
                        "required": ["name", "bio"]});
    let grammar = Grammar::new(Constraint::JsonSchema(person), &vocabulary).unwrap();
    let (tokens, text, reason) = run(&model, &tokenizer, &prompt, greedy(grammar, 4));
    assert_eq!((tokens.len(), reason), (4, FinishReason::ConstraintUnfinished), "{text:?}");
    let grammar = Grammar::new(Constraint::Regex("[a-z ]*".into()), &vocabulary).unwrap();
    let (tokens, text, reason) = run(&model, &tokenizer, &prompt, greedy(grammar, 4));
    assert_eq!((tokens.len(), reason), (4, FinishReason::Length), "{text:?}");
}

/// A model directory of `model`'s weights (a fixture) with the tokenizer and chat template of
/// `tokenizer` (another fixture, of the same vocabulary): files linked into `at`.
fn with_tokenizer(model: &Path, tokenizer: &Path, at: &Path) -> PathBuf {
    std::fs::create_dir_all(at).unwrap();
    for (dir, names) in [
        (model, &["config.json", "model.safetensors", "model.safetensors.index.json"][..]),
        (tokenizer, &["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"][..]),
    ] {
        for name in names {
            let (from, to) = (dir.join(name), at.join(name));
            if from.exists() && !to.exists() {
                std::os::unix::fs::symlink(&from, &to).unwrap();
            }
        }
    }
    at.to_path_buf()
}

/// tool_choice "required" and a named function, as the server forces them, on random models whose
/// chat templates call tools in each format (Qwen3's `<tool_call>`, Llama 3.1's JSON, gpt-oss's
/// harmony): greedy and sampled, every answer parses as exactly one call of an offered tool (the
/// named one when named), its arguments valid under that tool's schema (judged by `jsonschema`).
#[test]
fn forced_tool_calls_hold_to_the_tools_schemas() {
    let f = common::fixtures();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit", "days"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"], "additionalProperties": false});
    let tools = [
        ForcedTool { name: "get_weather".into(), parameters: Some(weather.clone()) },
        ForcedTool { name: "get_time".into(), parameters: Some(time.clone()) },
    ];
    let schema_of = |name: &str| if name == "get_weather" { weather.clone() } else { time.clone() };
    let openai_tools: Vec<Value> = tools
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": "A tool.", "parameters": t.parameters}}))
        .collect();
    let scratch = std::env::temp_dir().join(format!("nuvec-forced-calls-{}", std::process::id()));
    let mut cases = vec![];
    for (weights, tok, format) in [
        ("qwen3-q4g64", "tool_chats/qwen3", ToolFormat::Hermes),
        ("llama-q4g64", "tool_chats/llama3_1", ToolFormat::Llama3),
        ("gpt_oss/gpt_oss-q4g64", "gpt_oss/gpt_oss-harmony", ToolFormat::Harmony),
    ] {
        let dir = with_tokenizer(&f.join(weights), &f.join(tok), &scratch.join(weights.replace('/', "-")));
        let (model, tokenizer) = nuvec_lm::load(dir.to_str().unwrap()).unwrap();
        let template = tokenizer.chat_template().expect("a chat template");
        assert_eq!(ToolFormat::of_template(template.source()), Some(format), "{tok}");
        let mut args = serde_json::Map::new();
        args.insert("tools".into(), Value::Array(openai_tools.clone()));
        let ctx = tokenizer.template_context(args);
        let messages = json!([{"role": "user", "content": "What is the weather in Paris, and the time?"}]);
        let rendered = template.render_values(&messages, true, false, &ctx).unwrap();
        let vocabulary = Vocabulary::new(&tokenizer).unwrap();
        for name in [None, Some("get_time"), Some("get_weather")] {
            let prefix = format.forced_prefix(name);
            let grammar = Grammar::new(format.forced_call(&tools, name).unwrap(), &vocabulary)
                .unwrap_or_else(|e| panic!("{format:?} {name:?}: {e}"));
            let prompt = tokenizer.encode(&format!("{rendered}{prefix}"), false).unwrap();
            for seed in [None, Some(1u64), Some(2)] {
                let mut options = greedy(grammar.clone(), 120);
                if let Some(s) = seed {
                    options.sampler = Sampler { temperature: 1.0, ..Default::default() };
                    options.seed = Some(s);
                }
                let (_, text, reason) = run(&model, &tokenizer, &prompt, options);
                let what = format!("{format:?} {name:?} seed {seed:?}");
                assert_eq!(reason, FinishReason::EndOfSequence, "{what}: ended inside the call: {text:?}");
                let mut output =
                    nuvec_lm::chat::ChatOutput::new(template, &prompt_text(&rendered, &prefix), Some(format), true);
                let mut deltas = output.push(&prefix);
                deltas.extend(output.push(&text));
                deltas.extend(output.finish());
                let calls: Vec<_> = deltas
                    .iter()
                    .filter_map(|d| match d {
                        ChatDelta::ToolCall(c) => Some(c.clone()),
                        _ => None,
                    })
                    .collect();
                eprintln!("RESULT forced call, {what}: {text:?}");
                assert_eq!(calls.len(), 1, "{what}: {text:?} gave {deltas:?}");
                let call = &calls[0];
                assert!(name.is_none_or(|n| n == call.name), "{what}: called {}", call.name);
                assert!(tools.iter().any(|t| t.name == call.name), "{what}: called {}", call.name);
                cases.push(
                    json!({"kind": "schema", "schema": schema_of(&call.name), "text": call.arguments, "what": what}),
                );
            }
        }
    }
    std::fs::remove_dir_all(&scratch).ok();
    for (case, verdict) in cases.iter().zip(judge(&cases)) {
        assert!(verdict.is_none(), "{}: {:?} is not valid: {}", case["what"], case["text"], verdict.unwrap());
    }
    // A name no tool has, and parameters that are no schema, are refused naming them.
    let e = ToolFormat::Hermes.forced_call(&tools, Some("get_news")).unwrap_err().to_string();
    assert!(e.contains("get_news"), "{e}");
    let bad = [ForcedTool { name: "f".into(), parameters: Some(json!([1])) }];
    let e = ToolFormat::Hermes.forced_call(&bad, None).unwrap_err().to_string();
    assert!(e.contains("\"f\"") && e.contains("not a JSON schema"), "{e}");
}

/// The text a forced call's answer follows: the rendered prompt and the call's opening.
fn prompt_text(rendered: &str, prefix: &str) -> String {
    format!("{rendered}{prefix}")
}
