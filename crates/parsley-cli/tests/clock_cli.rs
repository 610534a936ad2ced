//! `parsley clock` as a user runs it.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn parsley(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn parsley");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    child.wait_with_output().unwrap()
}

/// Offsets T(1,2):0 at 41 and a top-bit topic, one sequence claim; the
/// entries are hand-written in non-canonical order.
const UNSORTED_HEX: &str = concat!(
    "01",
    "00000002",
    "0000000000000001",
    "0000000000000002",
    "00000000",
    "0000000000000029",
    "8000000000000000",
    "0000000000000001",
    "00000003",
    "0000000000000005",
    "00000001",
    "0000000000000001",
    "0000000000000002",
    "00000001",
    "000000000000000a",
    "000000000000000b",
    "0000000000000007",
);

const CANONICAL_HEX: &str = concat!(
    "01",
    "00000002",
    "8000000000000000",
    "0000000000000001",
    "00000003",
    "0000000000000005",
    "0000000000000001",
    "0000000000000002",
    "00000000",
    "0000000000000029",
    "00000001",
    "0000000000000001",
    "0000000000000002",
    "00000001",
    "000000000000000a",
    "000000000000000b",
    "0000000000000007",
);

const JSON: &str = concat!(
    r#"{"version":1,"offsets":["#,
    r#"{"topic":"80000000-0000-0000-0000-000000000001","partition":3,"offset":5},"#,
    r#"{"topic":"00000000-0000-0001-0000-000000000002","partition":0,"offset":41}],"#,
    r#""sequences":[{"topic":"00000000-0000-0001-0000-000000000002","partition":1,"#,
    r#""sender":"00000000-0000-000a-0000-00000000000b","seq":7}]}"#,
);

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn decode_prints_canonical_json_from_an_argument() {
    let o = parsley(&["clock", "decode", UNSORTED_HEX], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{JSON}\n"));
}

#[test]
fn decode_reads_stdin_when_no_argument() {
    let o = parsley(
        &["clock", "decode"],
        Some(&format!("  {}\n", CANONICAL_HEX.to_uppercase())),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{JSON}\n"));
}

#[test]
fn decode_empty_clock() {
    let o = parsley(&["clock", "decode", "010000000000000000"], None);
    assert_eq!(
        stdout(&o),
        "{\"version\":1,\"offsets\":[],\"sequences\":[]}\n"
    );
}

#[test]
fn encode_prints_canonical_hex() {
    let o = parsley(&["clock", "encode"], Some(JSON));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{CANONICAL_HEX}\n"));
}

#[test]
fn the_compact_version_is_decoded_and_encoded_when_asked_for() {
    // One offset claim, topic 00000000-0000-0001-0000-000000000002
    // partition 0 at 41, in version 2 (see the guide's wire-format page).
    let compact = "02010000000000000001000000000000000201002900";
    let json = stdout(&parsley(&["clock", "decode", compact], None));
    assert!(json.starts_with("{\"version\":2,"), "{json}");
    assert_eq!(
        stdout(&parsley(&["clock", "encode"], Some(&json))).trim(),
        compact
    );
    // The same claims asked for as version 1.
    let v1 = stdout(&parsley(
        &["clock", "encode"],
        Some(&json.replacen("\"version\":2", "\"version\":1", 1)),
    ));
    assert_eq!(
        v1.trim(),
        concat!(
            "01",
            "00000001",
            "0000000000000001",
            "0000000000000002",
            "00000000",
            "0000000000000029",
            "00000000"
        )
    );
}

#[test]
fn round_trip_through_both_commands() {
    let json = stdout(&parsley(&["clock", "decode", UNSORTED_HEX], None));
    let hex = stdout(&parsley(&["clock", "encode"], Some(&json)));
    assert_eq!(hex.trim(), CANONICAL_HEX);
}

#[test]
fn bad_input_fails_with_one_line_and_no_stdout() {
    let cases: Vec<(Vec<&str>, Option<&str>, &str)> = vec![
        (vec!["clock", "decode", "zz"], None, "invalid hex"),
        (
            vec!["clock", "decode", "030000000000000000"],
            None,
            "unknown version 3",
        ),
        (vec!["clock", "decode", "0100000001"], None, "truncated"),
        (
            vec!["clock", "decode", "01000000000000000000"],
            None,
            "trailing",
        ),
        (vec!["clock", "decode"], Some(""), "no hex"),
        (vec!["clock", "encode"], Some("{"), "malformed clock JSON"),
        (
            vec!["clock", "encode"],
            Some(r#"{"version":3,"offsets":[],"sequences":[]}"#),
            "version 3",
        ),
        (
            vec!["clock", "encode"],
            Some(
                r#"{"version":1,"offsets":[{"topic":"nope","partition":0,"offset":1}],"sequences":[]}"#,
            ),
            "offsets[0].topic",
        ),
        (
            vec!["clock", "encode"],
            Some(
                r#"{"version":1,"offsets":[{"topic":"00000000-0000-0001-0000-000000000002","partition":0,"offset":-1}],"sequences":[]}"#,
            ),
            "offsets[0].offset is negative",
        ),
        (
            vec!["clock", "encode"],
            Some(r#"{"version":1,"offsets":[],"sequences":[],"extra":1}"#),
            "unknown field",
        ),
    ];
    for (args, input, expect) in cases {
        let o = parsley(&args, input);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(o.stdout.is_empty(), "{args:?} printed to stdout");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err:?}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
