//! The crate's modules form layers with no import loop between them, and `metrics` is a leaf.
//!
//! A loop means neither side can be read, tested or changed alone; once one exists, every later
//! edit tends to add to it. So this test reads the sources instead of trusting review:
//!
//! - Every file under `src/` belongs to a module: its top-level module (`src/limiter.rs` and
//!   `src/limiter/**` are `limiter`), or, inside the layers that have rooms of their own
//!   (`config`, `limiter`, `server`, `service`, `store`), the submodule (`src/store/redis/**` is
//!   `store::redis`, `src/store/mod.rs` is `store`). `src/main.rs` is the binary, not a module.
//! - Every `crate::` and `super::` path in a file, comments left out and `use` groups
//!   (`crate::{a, b::c}`) expanded, is an edge from the file's module to the module the path
//!   names. A module naming its own submodules (declaring and re-exporting them) is containment,
//!   not a dependency, and is left out; a submodule using its parent is kept.
//! - The graph must have no cycle (the test prints one), `metrics` no edge at all, and
//!   `telemetry` none but to `metrics`: it consumes what a decision shows (from
//!   `service::decision`) and must not climb back up into the limiter or the store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::support::source_files;

/// The layers whose submodules are modules of their own in the graph.
const SPLIT: &[&str] = &["config", "limiter", "server", "service", "store"];

#[test]
fn modules_have_no_import_loop() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import loop between modules: {}", cycle.join(" → "));
    }
}

#[test]
fn metrics_imports_nothing_from_the_crate() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let uses = graph.get("metrics").cloned().unwrap_or_default();
    assert!(uses.is_empty(), "metrics uses {uses:?}");
}

#[test]
fn telemetry_imports_only_metrics() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let uses = graph.get("telemetry").expect("telemetry is a module");
    assert!(
        uses.iter().all(|module| module == "metrics"),
        "telemetry uses {uses:?}"
    );
}

/// The checker itself: a loop in a made-up source tree is found.
#[test]
fn a_loop_is_found() {
    let dir = std::env::temp_dir().join(format!("slidegate-layers-{}", std::process::id()));
    let files = [
        ("lib.rs", "pub mod a; pub mod b; pub mod store;"),
        ("a.rs", "use crate::b::X; // crate::store is only a comment"),
        ("b.rs", "use crate::{store::{redis::Y, Z}};"),
        (
            "store/mod.rs",
            "pub mod redis; pub use redis::Y; pub struct Z;",
        ),
        ("store/redis.rs", "use super::Z; fn f() { crate::a::g(); }"),
    ];
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("temp dir");
        std::fs::write(path, text).expect("temp file");
    }
    let graph = graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(graph["a"], BTreeSet::from(["b".to_owned()]));
    assert_eq!(
        graph["b"],
        BTreeSet::from(["store".to_owned(), "store::redis".to_owned()])
    );
    assert!(graph["store"].is_empty(), "containment is no edge");
    let cycle = find_cycle(&graph).expect("a → b → store::redis → a");
    assert_eq!(cycle.first(), cycle.last());
    assert!(cycle.contains(&"store::redis".to_owned()), "{cycle:?}");
}

/// Each module and the modules it uses.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = source_files(src, "rs");
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|file| node(&module_path(src, file)))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let here = module_path(src, file);
        let Some(from) = node(&here) else { continue };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let edges = graph.entry(from.clone()).or_default();
        for path in crate_paths(&strip_comments(&text), &here) {
            let Some(to) = resolve(&path, &modules) else {
                continue;
            };
            let contains = to.starts_with(&format!("{from}::"));
            if to != from && !contains {
                edges.insert(to);
            }
        }
    }
    graph
}

/// The module path of a file: `src/store/redis/mod.rs` is `[store, redis]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut path: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path
        .last()
        .is_some_and(|last| last == "mod" || last == "lib")
    {
        path.pop();
    }
    path
}

/// The graph's module for a module path; `None` for the crate root and the binary.
fn node(path: &[String]) -> Option<String> {
    match path {
        [] => None,
        [main] if main == "main" => None,
        [top, sub, ..] if SPLIT.contains(&top.as_str()) => Some(format!("{top}::{sub}")),
        [top, ..] => Some(top.clone()),
    }
}

/// The graph's module a full path (from the crate root) names, if any.
fn resolve(path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let top = path.first()?;
    if let Some(sub) = path.get(1) {
        let split = format!("{top}::{sub}");
        if modules.contains(&split) {
            return Some(split);
        }
    }
    modules.contains(top).then(|| top.clone())
}

/// The source without `//` comments (doc comments name modules in links, which import nothing).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let code = match line.find("//") {
            // A `//` inside a string (a URL) is rare in code; losing the rest of that line only
            // loses code that names no module.
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every `crate::` and `super::` path in `code`, from the crate root, groups expanded.
fn crate_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let preceded = at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b'$');
        let start = if preceded {
            None
        } else if rest.starts_with(b"crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with(b"super::") {
            let mut base = here.to_vec();
            let mut len = 0;
            while bytes[at + len..].starts_with(b"super::") {
                base.pop();
                len += "super::".len();
            }
            Some((base, len))
        } else {
            None
        };
        match start {
            Some((base, len)) => {
                at += len;
                at = parse_tree(code, at, base, &mut paths);
            }
            None => at += 1,
        }
    }
    paths
}

/// Parses a path or `{…}` group at `at` below `prefix`; returns where it ended.
fn parse_tree(
    code: &str,
    mut at: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let bytes = code.as_bytes();
    loop {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if at < bytes.len() && bytes[at] == b'{' {
            at += 1;
            loop {
                at = parse_tree(code, at, prefix.clone(), out);
                while at < bytes.len() && bytes[at].is_ascii_whitespace() {
                    at += 1;
                }
                match bytes.get(at) {
                    Some(b',') => at += 1,
                    Some(b'}') => return at + 1,
                    _ => return at,
                }
                while at < bytes.len() && bytes[at].is_ascii_whitespace() {
                    at += 1;
                }
                if bytes.get(at) == Some(&b'}') {
                    return at + 1;
                }
            }
        }
        let start = at;
        while at < bytes.len() && is_ident(bytes[at]) {
            at += 1;
        }
        if start == at {
            // `*` or the end of a group: the prefix is the path.
            out.push(prefix);
            return at;
        }
        prefix.push(code[start..at].to_owned());
        if bytes[at..].starts_with(b"::") {
            at += 2;
        } else {
            out.push(prefix);
            return at;
        }
    }
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// A cycle in the graph, first module repeated at the end.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|m| m == module) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        stack.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut done, &mut Vec::new()))
}
