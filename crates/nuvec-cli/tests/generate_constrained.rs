//! `nuvec generate`'s structured-output flags on the default model: the text meets the
//! constraint, the statistics report what compiling it took, a bad one is refused naming it.

mod common;

use common::run_generate as generate;

#[test]
fn the_text_meets_the_constraint_and_its_cost_is_reported() {
    let (ok, text, err) = generate(&["--prompt", "Is the sky blue?", "--choice", "yes", "no"]);
    assert!(ok, "{err}");
    assert!(["yes\n", "no\n"].contains(&text.as_str()), "{text:?}");
    assert!(err.contains("Constraint: vocabulary built in") && err.contains("grammar compiled in"), "{err}");
    let (ok, text, err) = generate(&["--prompt", "A three-digit number:", "--regex", "[0-9]{3}"]);
    assert!(ok, "{err}");
    let digits = text.trim_end_matches('\n');
    assert!(digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    let (ok, _, err) = generate(&["--prompt", "x", "--regex", "[0-9"]);
    assert!(!ok && err.contains("regex"), "{err}");
}
