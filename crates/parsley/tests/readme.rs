//! The README's first stage is the quickstart example's code, word for
//! word, so the README never shows code that does not compile and run.

#[test]
fn the_readme_stage_is_the_quickstart_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example =
        std::fs::read_to_string(root.join("crates/parsley/examples/quickstart.rs")).unwrap();
    let shown = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|r| r.split("\n```").next())
        .expect("a rust block in the README");
    let body = example
        .split("// ANCHOR: readme\n")
        .nth(1)
        .and_then(|r| r.split("    // ANCHOR_END: readme").next())
        .expect("the anchored part of the example");
    let dedented: Vec<&str> = body
        .trim_end()
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect();
    assert_eq!(shown, dedented.join("\n"));
}
