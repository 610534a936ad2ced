//! The fuzz smoke run of the test command: every committed corpus input
//! (and every past finding) through its target, then random inputs, on
//! stable. The long runs use `fuzz/` with cargo-fuzz (see its README).

use std::path::PathBuf;

use proptest::prelude::*;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

#[test]
fn every_corpus_input_passes_its_target() {
    for target in parsley_fuzz::TARGETS {
        let inputs = corpus(target);
        assert!(!inputs.is_empty(), "fuzz/corpus/{target} is empty");
        for input in inputs {
            parsley_fuzz::run(target, &input);
        }
    }
}

/// The seeds start from state the decoders accept: a node restores from
/// the seeded store with its held record.
#[test]
fn the_restore_seed_is_a_valid_store() {
    let seed = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/node_restore/seed-held"),
    )
    .unwrap();
    let restored = parsley_fuzz::restore_node(&seed).unwrap();
    assert_eq!(restored.map_err(|e| e.to_string()), Ok(1));
    // The same record in a page.
    let seed = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/node_restore/seed-page"),
    )
    .unwrap();
    let restored = parsley_fuzz::restore_node(&seed).unwrap();
    assert_eq!(restored.map_err(|e| e.to_string()), Ok(1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn random_inputs_never_break_a_target(
        target in prop::sample::select(parsley_fuzz::TARGETS),
        data in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        parsley_fuzz::run(target, &data);
    }
}
