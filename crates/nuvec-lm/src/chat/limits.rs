//! What a chat template may spend: a checkpoint's template is code from the internet, and a
//! hostile one must fail in well under a second instead of hanging the process (nested `range`
//! loops) or filling memory (`{% set ns.s = ns.s + ns.s %}` in a loop doubles a string per
//! iteration: 16 GB in 30 s).
//!
//! Two limits, both far above what real templates use (see [`FUEL`]):
//! - fuel: minijinja charges about one unit per instruction executed and stops at [`FUEL`];
//! - size: no string or list a template builds, and not the rendered prompt, may hold more
//!   than [`MAX_BYTES`] (counted as the text it would print).
//!
//! Fuel alone cannot bound memory: doubling a string takes a constant number of instructions
//! per doubling. minijinja has no hook on values, so the compiled template is patched before
//! it runs: every instruction that can make a value larger (`+`, `*`, filter, method and
//! function calls) jumps to a copy of itself appended at the end, followed by a call to
//! `__nuvec_bound`, which refuses a value past the limit, and a jump back. Jump targets stay
//! valid because the patched instruction keeps its index. Each result is checked, so every
//! operand is at most [`MAX_BYTES`]; what could still multiply that within one step checks
//! its inputs first: `~` (replaced by a call that measures both sides as it prints them),
//! printing, the `replace`, `join`, `indent`, `string`, `format`, `tojson`, `batch` and `slice`
//! filters and the `replace`/`join`/`format` methods. A list of one large string repeated is
//! small in memory but not when printed, so printing is measured without building the text;
//! the template's own text counts as printed too.
//! Values are measured by walking at most [`MAX_ITEMS`] items, which also bounds each check.

use std::cell::Cell;

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Kwargs, Rest, StringInput, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State, Value};

/// Fuel a render may burn (minijinja charges most instructions one unit). Measured: the real
/// templates of the tokenizer fixtures (Qwen3, Gemma 3, Llama 3.1, with tools) take at most
/// 259 on its records, and about 70 per message on a 1,000-message conversation with a tool
/// (Qwen3: 70,610; Gemma 3: 61,521; Llama 3.1: 40,015). This is 70 times that conversation
/// (about 70,000 messages), and a loop burns it in about 0.25 s.
pub const FUEL: u64 = 5_000_000;

/// The most text a template may build in one value or print in total: 64 MiB, about
/// 16 million tokens, far past any context window.
pub const MAX_BYTES: usize = 64 << 20;

/// Items (list and map entries, counted through nesting) one value may hold, and a `batch` or
/// `slice` filter may make: minijinja's own bound on `range`.
pub const MAX_ITEMS: usize = 100_000;

thread_local! {
    /// Bytes the render running on this thread has printed so far.
    static PRINTED: Cell<usize> = const { Cell::new(0) };
}

pub(crate) fn too_large(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "{what} would exceed {} MiB, the most a chat template may build (a hostile template?)",
            MAX_BYTES >> 20
        ),
    )
}

/// The size of `value` as text, counted up to just past [`MAX_BYTES`] (strings by length,
/// lists and maps by their items, walking at most [`MAX_ITEMS`] of them: past that the value
/// counts as too large; a few bytes for anything else).
pub(crate) fn size(value: &Value) -> usize {
    fn add(v: &Value, total: &mut usize, items: &mut usize) {
        if *total > MAX_BYTES {
            return;
        }
        match v.kind() {
            ValueKind::String | ValueKind::Bytes => *total += v.as_str().map_or(v.len().unwrap_or(0), str::len),
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
                let Ok(entries) = v.try_iter() else { return };
                let is_map = v.kind() == ValueKind::Map;
                for entry in entries {
                    *items += 1;
                    if *items > MAX_ITEMS {
                        *total = usize::MAX;
                    }
                    *total = total.saturating_add(2);
                    if is_map {
                        add(&v.get_item(&entry).unwrap_or_default(), total, items);
                    }
                    add(&entry, total, items);
                    if *total > MAX_BYTES {
                        return;
                    }
                }
            }
            _ => *total += 8,
        }
    }
    let (mut total, mut items) = (0, 0);
    add(value, &mut total, &mut items);
    total
}

/// A sink that only counts what is written, failing past `left` bytes.
struct Meter {
    left: usize,
}

impl std::fmt::Write for Meter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.left = self.left.checked_sub(s.len()).ok_or(std::fmt::Error)?;
        Ok(())
    }
}

/// The length of `value` printed, when it is at most `budget` (measured without building it).
fn printed_len(value: &Value, budget: usize) -> Option<usize> {
    if let Some(s) = value.as_str() {
        return (s.len() <= budget).then_some(s.len());
    }
    let mut meter = Meter { left: budget };
    std::fmt::Write::write_fmt(&mut meter, format_args!("{value}")).ok()?;
    Some(budget - meter.left)
}

/// Refuses `value` when it is past [`MAX_BYTES`] (see [`size`]).
pub(crate) fn check_size(value: &Value, what: &str) -> Result<(), Error> {
    match size(value) > MAX_BYTES {
        true => Err(too_large(what)),
        false => Ok(()),
    }
}

fn bound(value: Value) -> Result<Value, Error> {
    check_size(&value, "a value").map(|_| value)
}

/// `~`: both sides printed, as minijinja's own concatenation, after measuring them.
fn concat(left: Value, right: Value) -> Result<Value, Error> {
    let fits = printed_len(&left, MAX_BYTES).and_then(|l| printed_len(&right, MAX_BYTES - l));
    match fits {
        Some(_) => Ok(Value::from(format!("{left}{right}"))),
        None => Err(too_large("a string")),
    }
}

/// Refuses printing `values` when together they would pass [`MAX_BYTES`].
fn checked_printing(values: &[Value], what: &str) -> Result<(), Error> {
    let mut left = MAX_BYTES;
    for v in values {
        left -= printed_len(v, left).ok_or_else(|| too_large(what))?;
    }
    Ok(())
}

/// The patch described in the module's comment, applied to a copy of the compiled template.
pub(crate) fn patch<'s>(compiled: &Instructions<'s>) -> Instructions<'s> {
    let original = compiled.len() as u32;
    let instr = |pc: u32| compiled.get(pc).cloned().expect("index below the length");
    let line = |pc: u32| compiled.get_line(pc).unwrap_or(0) as u16;
    let mut out = Instructions::new(compiled.name(), compiled.source());
    for pc in 0..original {
        match compiled.get_span(pc) {
            Some(span) => out.add_with_span(instr(pc), span),
            None => out.add_with_line(instr(pc), line(pc)),
        };
    }
    // Falling off the end of the template must not run into the appended code.
    out.add(Instruction::Return);
    for pc in 0..original {
        let grows = match instr(pc) {
            Instruction::StringConcat => {
                *out.get_mut(pc).expect("index below the length") =
                    Instruction::CallFunction("__nuvec_concat", Some(2));
                continue;
            }
            Instruction::Add
            | Instruction::Mul
            | Instruction::ApplyFilter(..)
            | Instruction::CallMethod(..)
            | Instruction::CallObject(..) => true,
            Instruction::CallFunction(name, _) => name != "super",
            Instruction::EmitRaw(text) => {
                // Template text is counted as printed too: in a loop it adds up.
                let at = out.add(Instruction::LoadConst(Value::from(text.len())));
                out.add(Instruction::CallFunction("__nuvec_printed", Some(1)));
                out.add(Instruction::DiscardTop);
                out.add_with_line(instr(pc), line(pc));
                out.add(Instruction::Jump(pc + 1));
                *out.get_mut(pc).expect("index below the length") = Instruction::Jump(at);
                continue;
            }
            _ => false,
        };
        if !grows {
            continue;
        }
        let at = out.add_with_line(instr(pc), line(pc));
        out.add_with_line(Instruction::CallFunction("__nuvec_bound", Some(1)), line(pc));
        out.add(Instruction::Jump(pc + 1));
        *out.get_mut(pc).expect("index below the length") = Instruction::Jump(at);
    }
    out
}

/// Starts counting printed text for a render on this thread.
pub(crate) fn start_render() {
    PRINTED.with(|p| p.set(0));
}

/// Counts `len` more printed bytes, refusing past [`MAX_BYTES`].
fn count(len: usize) -> Result<(), Error> {
    PRINTED.with(|p| {
        let total = p.get().saturating_add(len);
        p.set(total);
        match total > MAX_BYTES {
            true => Err(too_large("the rendered prompt")),
            false => Ok(()),
        }
    })
}

fn checked_replace(s: &str, old: &str, new: &str) -> Result<(), Error> {
    let hits = if old.is_empty() { s.chars().count() + 1 } else { s.matches(old).count() };
    match s.len().saturating_add(hits.saturating_mul(new.len())) > MAX_BYTES {
        true => Err(too_large("replace")),
        false => Ok(()),
    }
}

fn checked_join(items: &Value, joiner: &str) -> Result<(), Error> {
    let mut total = size(items);
    if !joiner.is_empty() {
        let n = items.try_iter().map(|it| it.take(MAX_BYTES / joiner.len() + 2).count()).unwrap_or(0);
        total = total.saturating_add(n.saturating_mul(joiner.len()));
    }
    match total > MAX_BYTES {
        true => Err(too_large("join")),
        false => Ok(()),
    }
}

fn checked_count(count: usize, filter: &str) -> Result<(), Error> {
    match count > MAX_ITEMS {
        true => Err(Error::new(ErrorKind::InvalidOperation, format!("{filter}({count}): at most {MAX_ITEMS} items"))),
        false => Ok(()),
    }
}

/// Sets the fuel, the printing count, `__nuvec_bound` and the checked filters and methods.
pub(crate) fn install(env: &mut Environment<'static>) {
    env.set_fuel(Some(FUEL));
    env.set_formatter(|out: &mut Output, state: &State, value: &Value| {
        let len = printed_len(value, MAX_BYTES).ok_or_else(|| too_large("the rendered prompt"))?;
        count(len)?;
        minijinja::escape_formatter(out, state, value)
    });
    env.add_function("__nuvec_bound", bound);
    env.add_function("__nuvec_concat", concat);
    env.add_function("__nuvec_printed", |len: usize| count(len));
    env.add_filter("string", |state: &State, v: &Value| {
        checked_printing(std::slice::from_ref(v), "string")?;
        minijinja::filters::string(state, v)
    });
    env.add_filter("format", |state: &State, v: &Value, args: Rest<Value>| {
        checked_printing(&args, "format")?;
        minijinja::filters::format(state, v, args)
    });
    env.add_filter("replace", |state: &State, v: StringInput, old: StringInput, new: StringInput| {
        checked_replace(v.as_str(), old.as_str(), new.as_str())?;
        minijinja::filters::replace(state, v, old, new)
    });
    env.add_filter("join", |state: &State, v: &Value, joiner: Option<StringInput>| {
        checked_join(v, joiner.as_ref().map_or("", |j| j.as_str()))?;
        minijinja::filters::join(state, v, joiner)
    });
    env.add_filter(
        "indent",
        |v: StringInput, width: Option<usize>, first: Option<bool>, blank: Option<bool>, kwargs: Kwargs| {
            let lines = v.as_str().lines().count() + 1;
            if v.as_str().len().saturating_add(lines.saturating_mul(width.unwrap_or(4))) > MAX_BYTES {
                return Err(too_large("indent"));
            }
            minijinja::filters::indent(v, width, first, blank, kwargs)
        },
    );
    env.add_filter("batch", |state: &State, v: Value, count: usize, fill: Option<Value>| {
        checked_count(count, "batch")?;
        minijinja::filters::batch(state, v, count, fill)
    });
    env.add_filter("slice", |state: &State, v: Value, count: usize, fill: Option<Value>| {
        checked_count(count, "slice")?;
        minijinja::filters::slice(state, v, count, fill)
    });
    env.set_unknown_method_callback(|state: &State, value: &Value, method: &str, args: &[Value]| {
        if let Some(s) = value.as_str() {
            let arg = |i: usize| args.get(i).and_then(Value::as_str).unwrap_or("");
            match method {
                "replace" => checked_replace(s, arg(0), arg(1))?,
                "join" => checked_join(args.first().unwrap_or(&Value::UNDEFINED), s)?,
                "format" => checked_printing(args, "format")?,
                _ => {}
            }
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
}
