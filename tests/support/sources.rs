//! The repository's own files, for tests that read the source (the module layers, the commands
//! the store can send).

use std::path::{Path, PathBuf};

/// The files under `dir` (recursively) whose names end with `.{extension}`, in path order.
pub fn source_files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a readable source directory")
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for path in entries {
        if path.is_dir() {
            out.extend(source_files(&path, extension));
        } else if path.extension().is_some_and(|e| e == extension) {
            out.push(path);
        }
    }
    out
}
