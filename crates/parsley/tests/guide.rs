//! The user guide (`docs/guide`) shows only Rust that CI compiles: every
//! Rust sample is an mdBook include of an example or test file (the test
//! command builds and runs those), every include names a file that exists
//! (and an anchor that exists in it), and no chapter has a free-standing
//! Rust block that nothing would compile.

use std::path::{Path, PathBuf};

fn guide() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/guide/src")
}

#[test]
fn every_chapter_in_the_summary_exists() {
    let summary = std::fs::read_to_string(guide().join("SUMMARY.md")).unwrap();
    let mut chapters = 0;
    for part in summary.split("](").skip(1) {
        let file = part.split(')').next().unwrap();
        assert!(
            guide().join(file).exists(),
            "SUMMARY.md names {file}, which is missing"
        );
        chapters += 1;
    }
    assert!(chapters >= 10, "the guide has {chapters} chapters");
}

#[test]
fn rust_samples_are_includes_of_compiled_files() {
    for entry in std::fs::read_dir(guide()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // Rust blocks hold nothing but includes.
        for block in text.split("```rust").skip(1) {
            let body = block.split("```").next().unwrap();
            let body = body.split_once('\n').map_or("", |(_, b)| b);
            for line in body.lines().filter(|l| !l.trim().is_empty()) {
                assert!(
                    line.trim_start().starts_with("{{#include")
                        || line.trim_start().starts_with("{{#rustdoc_include"),
                    "{name}: a Rust sample that is not an include of a compiled file: {line}"
                );
            }
        }
        // Every include resolves, anchor included.
        for inc in text.split("{{#").skip(1) {
            let directive = inc.split("}}").next().unwrap();
            let target = directive.split_whitespace().nth(1).unwrap_or("");
            let mut parts = target.split(':');
            let file = parts.next().unwrap();
            let resolved = guide().join(file);
            let content = std::fs::read_to_string(&resolved)
                .unwrap_or_else(|e| panic!("{name}: include {file}: {e}"));
            if let Some(anchor) = parts.next()
                && anchor.parse::<usize>().is_err()
                && !anchor.is_empty()
            {
                assert!(
                    content.contains(&format!("ANCHOR: {anchor}")),
                    "{name}: anchor {anchor} is not in {file}"
                );
            }
        }
    }
}
