//! Every fuzz target's corpus, replayed on stable: each file of `fuzz/corpus/<target>/` through
//! the target's entry point (`fuzz/entries/<target>.rs`), as libFuzzer would run it. So the
//! targets compile with every test run and what a fuzzing session once found stays fixed.

use std::path::Path;

#[path = "../../../fuzz/entries/mod.rs"]
mod entries;

#[test]
fn every_fuzz_targets_corpus_replays_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut replayed = Vec::new();
    for (target, run) in entries::TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("corpus entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no corpus for {target}");
        for file in &files {
            let input = std::fs::read(file).expect("read corpus file");
            let outcome = std::panic::catch_unwind(|| run(&input));
            assert!(outcome.is_ok(), "{target} panics on {}", file.display());
        }
        replayed.push((*target, files.len()));
    }
    assert!(replayed.len() >= 8, "{replayed:?}");
    eprintln!("replayed: {replayed:?}");
}
