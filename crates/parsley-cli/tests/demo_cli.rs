//! `parsley demo` as a newcomer runs it.

use std::process::Command;

fn demo(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .arg("demo")
        .args(args)
        .output()
        .expect("run parsley demo");
    assert!(
        out.stderr.is_empty() || out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("utf-8"),
    )
}

fn violations(line: &str) -> u64 {
    let before = line
        .split(" causal violations")
        .next()
        .and_then(|s| s.rsplit(',').next())
        .expect("a count before 'causal violations'");
    before.trim().parse().expect("a number")
}

#[test]
fn gated_run_has_none_plain_run_has_some_and_a_sentence_says_so() {
    for seed in ["1", "2", "3"] {
        let (ok, out) = demo(&["--records", "400", "--seed", seed]);
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!("seed {seed}")),
            "the seed is printed: {out}"
        );
        let lines: Vec<&str> = out.lines().filter(|l| l.contains("violations")).collect();
        assert!(lines.len() >= 2, "{out}");
        let gated = lines
            .iter()
            .find(|l| l.starts_with("with Parsley"))
            .expect("gated line");
        let plain = lines
            .iter()
            .find(|l| l.starts_with("without Parsley"))
            .expect("plain line");
        assert_eq!(violations(gated), 0, "{out}");
        assert!(violations(plain) > 0, "{out}");
        let last = out.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("Parsley processed every payment after its order"),
            "{out}"
        );
    }
}

#[test]
fn the_same_seed_prints_the_same_run() {
    assert_eq!(
        demo(&["--records", "200", "--seed", "9"]),
        demo(&["--records", "200", "--seed", "9"])
    );
}

#[test]
fn help_has_an_example_and_bad_options_fail_cleanly() {
    let help = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args(["demo", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.contains("parsley demo --records 20000 --seed 7"),
        "{text}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args(["demo", "--records", "3"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(bad.stdout.is_empty());
}
