//! Loading rule files (one file or a directory) into a [`RuleSet`].
//!
//! A load is all or nothing and reports every problem of every file: an operator fixing a
//! directory of rules should see the whole list at once, not one error per attempt. What a load
//! goes on past (a skipped directory entry, YAML read as envoyproxy/ratelimit's parser reads it
//! rather than strictly) is a [`ConfigWarning`]: logged by [`load_path`] and [`load_sources`],
//! returned by [`check_path`] for `check-config`.
//!
//! Which files of a directory are read follows envoyproxy/ratelimit's runtime loader, which reads
//! every file: every regular file whatever its name, except names starting with `.` (as with its
//! `RUNTIME_IGNOREDOTFILES=true`, which Kubernetes ConfigMap volumes need: their `..data`
//! bookkeeping is hidden). Subdirectories are not read (envoyproxy/ratelimit reads them too), and
//! each one is a warning, so that no rule file is skipped without a word.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::checksum::Checksum;
use super::model::FileModel;
use super::read::read_document;
use super::validate::{Compiled, FileOutcome, compile};
use super::{ConfigError, ConfigErrors, ConfigWarning, RuleSet};

/// Loads one file, or every rule file of a directory (see the module doc), at start; warnings
/// are logged.
///
/// One policy for a directory without rule files, at start, on reload and in `check-config`: it
/// is no rules, as in envoyproxy/ratelimit (every request is answered OK until rule files appear;
/// a Kubernetes ConfigMap may start empty), except that a reload never drops live rules that way
/// ([`read_sources`]): a deploy that empties the directory for a moment keeps the rules that were
/// live, and the refused reload is counted and logged.
pub fn load_path(path: &Path) -> Result<RuleSet, ConfigErrors> {
    let (sources, warnings) = list_sources(path, Empty::NoRules);
    log_skipped(&warnings);
    load_sources(&sources?)
}

/// Builds a rule set from (file name, YAML text) pairs; the names appear in errors. Warnings are
/// logged.
pub fn load_sources(sources: &[(String, String)]) -> Result<RuleSet, ConfigErrors> {
    let (rules, warnings) = compile_sources(sources);
    log_warnings(&warnings);
    rules
}

/// What `check-config` reports: every warning, and the rules or every error.
#[derive(Debug)]
pub struct Checked {
    pub warnings: Vec<ConfigWarning>,
    pub rules: Result<RuleSet, ConfigErrors>,
}

/// Loads like [`load_path`], returning the warnings instead of logging them.
pub fn check_path(path: &Path) -> Checked {
    let (sources, mut warnings) = list_sources(path, Empty::NoRules);
    let rules = match sources {
        Ok(sources) => {
            let (rules, mut more) = compile_sources(&sources);
            warnings.append(&mut more);
            rules
        }
        Err(errors) => Err(errors),
    };
    Checked { warnings, rules }
}

fn log_warnings(warnings: &[ConfigWarning]) {
    for warning in warnings {
        tracing::warn!(file = %warning.file, reason = %warning.message, "rule file");
    }
}

fn compile_sources(
    sources: &[(String, String)],
) -> (Result<RuleSet, ConfigErrors>, Vec<ConfigWarning>) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut domains = HashMap::new();
    let mut defined_in: HashMap<String, Arc<str>> = HashMap::new();
    let mut rules = Vec::new();
    for (name, text) in sources {
        let file: Arc<str> = Arc::from(name.as_str());
        let outcome = match parse(&file, text) {
            Ok((model, findings)) => compile(&file, model, findings),
            Err(error) => FileOutcome {
                compiled: None,
                errors: vec![error],
                warnings: Vec::new(),
            },
        };
        errors.extend(outcome.errors);
        warnings.extend(outcome.warnings);
        let Some(Compiled {
            domain,
            rules: tree,
            list,
        }) = outcome.compiled
        else {
            continue;
        };
        if let Some(first) = defined_in.get(&domain) {
            errors.push(ConfigError {
                file: name.clone(),
                message: format!(
                    "domain: duplicate domain `{domain}`, already defined in {first}; \
                     each domain must be in exactly one file"
                ),
            });
            continue;
        }
        defined_in.insert(domain.clone(), file);
        domains.insert(domain, tree);
        rules.extend(list);
    }
    let rules = if errors.is_empty() {
        Ok(RuleSet::new(domains, rules, Checksum::of(sources)))
    } else {
        Err(ConfigErrors(errors))
    };
    (rules, warnings)
}

/// Reads the rule files at `path` as (file name, text) pairs, sorted by name, for a reload, and
/// logs every directory entry it skips. A directory without rule files is an error when rules are
/// live (`rules_live`): they are not dropped because a deploy emptied the directory for a moment.
/// Without live rules it is no rules, as at start: nothing changed.
pub(super) fn read_sources(
    path: &Path,
    rules_live: bool,
) -> Result<Vec<(String, String)>, ConfigErrors> {
    let empty = if rules_live {
        Empty::Error
    } else {
        Empty::NoRules
    };
    let (sources, warnings) = list_sources(path, empty);
    log_skipped(&warnings);
    sources
}

fn log_skipped(warnings: &[ConfigWarning]) {
    for warning in warnings {
        tracing::info!(file = %warning.file, reason = %warning.message, "not read");
    }
}

/// (file name, text) pairs, or every error reading them.
type Sources = Result<Vec<(String, String)>, ConfigErrors>;

/// What a directory without rule files gives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Empty {
    /// No rules (at start, as envoyproxy/ratelimit).
    NoRules,
    /// An error (on reload: the live rules stay).
    Error,
}

/// Reads the rule files at `path`, with the directory entries skipped as warnings.
fn list_sources(path: &Path, empty: Empty) -> (Sources, Vec<ConfigWarning>) {
    let shown = path.display().to_string();
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) => return (Err(one_error(&shown, format!("cannot read: {e}"))), vec![]),
    };
    if !metadata.is_dir() {
        if !metadata.is_file() {
            return (Err(one_error(&shown, NOT_A_FILE)), vec![]);
        }
        return (read_text(path).map(|text| vec![(shown, text)]), vec![]);
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => return (Err(one_error(&shown, format!("cannot list: {e}"))), vec![]),
    };
    let mut files = Vec::new();
    let mut errors = Vec::new();
    let mut skipped = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(ConfigError {
                    file: shown.clone(),
                    message: format!("cannot list: {e}"),
                });
                continue;
            }
        };
        let file = entry.path();
        let shown_file = file.display().to_string();
        if entry.file_name().to_string_lossy().starts_with('.') {
            skipped.push(ConfigWarning {
                file: shown_file,
                message: HIDDEN.to_owned(),
            });
            continue;
        }
        // `metadata` follows symlinks: Kubernetes mounts ConfigMap files as symlinks. Anything
        // but a file or a directory is an error, not a domain that silently disappears (and a
        // FIFO or device would block or never end a read).
        match std::fs::metadata(&file) {
            Ok(m) if m.is_file() => files.push(file),
            Ok(m) if m.is_dir() => skipped.push(ConfigWarning {
                file: shown_file,
                message: SUBDIRECTORY.to_owned(),
            }),
            Ok(_) => errors.push(ConfigError {
                file: shown_file,
                message: NOT_A_FILE.to_owned(),
            }),
            Err(e) => errors.push(ConfigError {
                file: shown_file,
                message: format!("cannot read: {e}"),
            }),
        }
    }
    files.sort();
    skipped.sort_by(|a, b| a.file.cmp(&b.file));
    if files.is_empty() && errors.is_empty() && empty == Empty::Error {
        errors.push(ConfigError {
            file: shown.clone(),
            message: "no rule files in this directory; the rules that were live stay".to_owned(),
        });
    } else if files.is_empty() && errors.is_empty() {
        skipped.push(ConfigWarning {
            file: shown.clone(),
            message: "no rule files: no limits apply, every request is answered OK until rule \
                      files appear here"
                .to_owned(),
        });
    }
    let mut sources = Vec::with_capacity(files.len());
    for file in files {
        match read_text(&file) {
            Ok(text) => sources.push((file.display().to_string(), text)),
            Err(mut e) => errors.append(&mut e.0),
        }
    }
    let sources = if errors.is_empty() {
        Ok(sources)
    } else {
        Err(ConfigErrors(errors))
    };
    (sources, skipped)
}

/// Why a hidden entry is not read.
const HIDDEN: &str = "not read: the name starts with `.` (hidden files and directories are \
    skipped, as envoyproxy/ratelimit does with RUNTIME_IGNOREDOTFILES=true)";

/// Why a subdirectory is not read.
const SUBDIRECTORY: &str = "not read: a subdirectory (slidegate reads the files directly in the \
    rule directory; envoyproxy/ratelimit also reads subdirectories): move its rule files up";

/// For a rule path that is a FIFO, socket or device: reading it could block forever (a FIFO with
/// no writer) or never end (`/dev/zero`).
const NOT_A_FILE: &str = "cannot read: not a regular file";

/// The largest rule file read, in bytes. Rules take many times their text's size once built
/// (50 MB of rules once needed 1.4 GB), and a file this large is far beyond any real rule set
/// (10,000 rules are about 1 MiB): a bigger one is a mistake, refused before it is read.
pub const MAX_RULE_FILE_BYTES: u64 = 8 * 1024 * 1024;

fn read_text(path: &Path) -> Result<String, ConfigErrors> {
    use std::io::Read as _;
    let error = |message: String| one_error(&path.display().to_string(), message);
    let too_large = || {
        error(format!(
            "file is larger than {} MiB, the limit for one rule file",
            MAX_RULE_FILE_BYTES / (1024 * 1024)
        ))
    };
    let file = std::fs::File::open(path).map_err(|e| error(format!("cannot read: {e}")))?;
    let size = file
        .metadata()
        .map_err(|e| error(format!("cannot read: {e}")))?
        .len();
    if size > MAX_RULE_FILE_BYTES {
        return Err(too_large());
    }
    // The file may grow between the check and the read: never read more than the limit.
    let mut text = String::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(MAX_RULE_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| error(format!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_RULE_FILE_BYTES {
        return Err(too_large());
    }
    Ok(text)
}

fn one_error(file: &str, message: impl Into<String>) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        file: file.to_owned(),
        message: message.into(),
    }])
}

/// Reads one file's YAML (see `read`). `Err` when nothing could be read: a blank file, or a
/// syntax error (yaml_serde's message has the line).
fn parse(file: &Arc<str>, text: &str) -> Result<(FileModel, super::read::Findings), ConfigError> {
    let error = |message: String| ConfigError {
        file: file.to_string(),
        message,
    };
    let blank = text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#')
    });
    if blank {
        // Commonly a file caught half-written; say so rather than "missing field `domain`".
        return Err(error(
            "empty file: a rule file needs a `domain` and `descriptors`".to_owned(),
        ));
    }
    let (model, findings) = read_document::<FileModel>(text).map_err(error)?;
    match model {
        Some(model) => Ok((model, findings)),
        // An empty first document (`---` then another document), or one that is not a map,
        // reported in the findings when it is one.
        None if findings.errors.is_empty() => Err(error(
            "empty document: a rule file needs a `domain` and `descriptors`".to_owned(),
        )),
        None => Ok((FileModel::default(), findings)),
    }
}
