//! A `NUVEC_*` knob set to a value its reader would quietly take for the default is refused by
//! every command before it does anything, naming the knob and where the values are listed;
//! `nuvec --help-env` still prints the list (with the value in force).

use std::process::Command;

#[test]
fn a_knob_s_bad_value_is_refused_before_any_work() {
    let missing = std::env::temp_dir().join(format!("nuvec-knobs-absent-{}", std::process::id()));
    let run = |env: (&str, &str)| {
        Command::new(env!("CARGO_BIN_EXE_nuvec"))
            .args(["manage", "--scan", "--cache-dir"])
            .arg(&missing)
            .env(env.0, env.1)
            .output()
            .unwrap()
    };
    let out = run(("NUVEC_PDL", "off"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NUVEC_PDL=\"off\" is not a value it takes (0, 1)") && err.contains("--help-env"), "{err}");
    // A value it takes goes on to the command (which then reports the missing cache).
    let out = run(("NUVEC_PDL", "0"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no Hugging Face cache here") && !err.contains("NUVEC_PDL"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_nuvec")).arg("--help-env").env("NUVEC_PDL", "off").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("(now: off)"));
}
