//! `parsley describe` as a user runs it.

use std::process::{Command, Output};

fn parsley(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_parsley"))
        .args(args)
        .output()
        .expect("run parsley")
}

#[test]
fn the_ledger_is_described_for_people_and_for_tools() {
    let out = parsley(&["describe"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "application ledger",
        "  stage settlement",
        "    source orders (String / i64, codecs utf8 / int64)",
        "    source payments (String / i64, codecs utf8 / int64)",
        "    sink   settlements (String / String, codecs utf8 / utf8)",
        "    state  i64 in store settlement-fold, changelog ledger-settlement-fold-changelog",
        "    protocol changelog ledger-settlement-state-changelog",
        "    co-partitioned: orders, payments",
        "  ledger-control (",
        "  ledger-diagnostics (",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no line {line:?} in:\n{text}"
        );
    }

    let out = parsley(&["describe", "checkout", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["application_id"], "checkout");
    assert_eq!(json["format_version"], parsley::describe::TOPOLOGY_FORMAT);
    // The JSON keeps the full type names, which tools compare.
    assert_eq!(
        json["stages"][0]["sources"][0]["key_type"],
        "alloc::string::String"
    );
    let stage = &json["stages"][0];
    assert_eq!(stage["sources"][0]["topic"], "orders");
    assert_eq!(stage["sinks"][0]["topic"], "payments");
    assert_eq!(stage["sinks"][0]["compact_clock"], false);
    assert_eq!(json["host_topics"][0]["topic"], "checkout-control");

    let out = parsley(&["describe", "nothing"]);
    assert!(!out.status.success());
}
