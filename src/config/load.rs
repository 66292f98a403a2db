//! Loading rule files (one file or a directory) into a [`RuleSet`].
//!
//! A load is all or nothing and reports every problem of every file: an operator fixing a
//! directory of rules should see the whole list at once, not one error per attempt.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::checksum::Checksum;
use super::validate::{Compiled, compile};
use super::{ConfigError, ConfigErrors, RuleSet, model::FileModel};

/// Loads one file, or every `*.yaml`/`*.yml` in a directory (not recursive, dotfiles skipped).
///
/// A directory without rule files is an error: a rate limiter started with no rules would let
/// everything through while looking healthy.
pub fn load_path(path: &Path) -> Result<RuleSet, ConfigErrors> {
    load_sources(&read_sources(path)?)
}

/// Builds a rule set from (file name, YAML text) pairs; the names appear in errors.
pub fn load_sources(sources: &[(String, String)]) -> Result<RuleSet, ConfigErrors> {
    if sources.is_empty() {
        return Err(ConfigErrors(vec![ConfigError {
            file: "(no files)".to_owned(),
            message: "no rule files given; slidegate needs at least one domain".to_owned(),
        }]));
    }
    let mut errors = Vec::new();
    let mut domains = HashMap::new();
    let mut defined_in: HashMap<String, Arc<str>> = HashMap::new();
    let mut rules = Vec::new();
    for (name, text) in sources {
        let file: Arc<str> = Arc::from(name.as_str());
        let compiled = parse(&file, text).and_then(|model| compile(&file, model));
        match compiled {
            Err(mut file_errors) => errors.append(&mut file_errors),
            Ok(Compiled {
                domain,
                rules: tree,
                list,
            }) => {
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
        }
    }
    if errors.is_empty() {
        Ok(RuleSet::new(domains, rules, Checksum::of(sources)))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Reads the rule files at `path` as (file name, text) pairs, sorted by name.
pub(super) fn read_sources(path: &Path) -> Result<Vec<(String, String)>, ConfigErrors> {
    let shown = path.display().to_string();
    let metadata =
        std::fs::metadata(path).map_err(|e| one_error(&shown, format!("cannot read: {e}")))?;
    if !metadata.is_dir() {
        if !metadata.is_file() {
            return Err(one_error(&shown, NOT_A_FILE));
        }
        let text = read_text(path)?;
        return Ok(vec![(shown, text)]);
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| one_error(&shown, format!("cannot list: {e}")))?;
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => {
                if !is_rule_file(&entry.file_name().to_string_lossy()) {
                    continue;
                }
                let file = entry.path();
                // `metadata` follows symlinks: Kubernetes mounts ConfigMap files as symlinks.
                // Subdirectories are skipped; anything else named like a rule file must be one: a
                // dangling symlink or a FIFO is an error, not a domain that silently disappears
                // (and a FIFO or device would block or never end a read).
                match std::fs::metadata(&file) {
                    Ok(m) if m.is_file() => files.push(file),
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => errors.push(ConfigError {
                        file: file.display().to_string(),
                        message: NOT_A_FILE.to_owned(),
                    }),
                    Err(e) => errors.push(ConfigError {
                        file: file.display().to_string(),
                        message: format!("cannot read: {e}"),
                    }),
                }
            }
            Err(e) => errors.push(ConfigError {
                file: shown.clone(),
                message: format!("cannot list: {e}"),
            }),
        }
    }
    files.sort();
    if files.is_empty() && errors.is_empty() {
        return Err(one_error(
            &shown,
            "no rule files (*.yaml or *.yml) in this directory; slidegate does not start \
             without rules",
        ));
    }
    let mut sources = Vec::with_capacity(files.len());
    for file in files {
        match read_text(&file) {
            Ok(text) => sources.push((file.display().to_string(), text)),
            Err(mut e) => errors.append(&mut e.0),
        }
    }
    if errors.is_empty() {
        Ok(sources)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// For a rule path that is a FIFO, socket or device: reading it could block forever (a FIFO with
/// no writer) or never end (`/dev/zero`).
const NOT_A_FILE: &str = "cannot read: not a regular file";

/// `*.yaml` or `*.yml`, not hidden (editors' swap and backup files start with a dot).
fn is_rule_file(name: &str) -> bool {
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

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

/// Parses one file's YAML. Errors keep yaml_serde's field path and line, plus a hint where we
/// can guess what was meant.
fn parse(file: &Arc<str>, text: &str) -> Result<FileModel, Vec<ConfigError>> {
    let error = |message: String| {
        vec![ConfigError {
            file: file.to_string(),
            message,
        }]
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
    serde_yaml::from_str(text).map_err(|e| {
        let message = e.to_string();
        error(match hint(&message) {
            Some(hint) => format!("{message} ({hint})"),
            None => message,
        })
    })
}

/// envoyproxy/ratelimit features that slidegate does not implement, with what to do instead.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "quota_mode",
        "envoyproxy/ratelimit's quota_mode is not supported by slidegate",
    ),
    (
        "metadata",
        "descriptor metadata is not supported by slidegate",
    ),
];

/// A hint for serde's "unknown field `X`, expected one of ...", non-string keys and numbers.
fn hint(message: &str) -> Option<String> {
    if message.contains("expected field identifier") {
        return Some("keys must be strings".to_owned());
    }
    if message.contains("more than one document") {
        return Some("one file holds one domain; put each domain in its own file".to_owned());
    }
    if message.contains("expected u64") {
        return Some("must be a whole number, 0 or more".to_owned());
    }
    let start = message.find("unknown field `")? + "unknown field `".len();
    let unknown = message.get(start..)?.split('`').next()?;
    if let Some((_, hint)) = UNSUPPORTED.iter().find(|(field, _)| *field == unknown) {
        return Some((*hint).to_owned());
    }
    let expected = message.get(start + unknown.len() + 1..)?;
    let squash = |s: &str| s.replace(['_', '-'], "").to_ascii_lowercase();
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .find(|field| squash(field) == squash(unknown))
        .map(|field| format!("did you mean `{field}`?"))
}

#[cfg(test)]
mod tests {
    use super::hint;

    #[test]
    fn hints_for_misspelled_and_unsupported_fields() {
        let message = "descriptors[0]: unknown field `ratelimit`, expected one of `key`, \
                       `rate_limit`, `rate_limits` at line 3 column 5";
        assert_eq!(hint(message).as_deref(), Some("did you mean `rate_limit`?"));
        let message = "descriptors[0]: unknown field `quota_mode`, expected one of `key`";
        assert!(hint(message).is_some_and(|h| h.contains("not supported")));
        assert_eq!(hint("unknown field `zzz`, expected `key`"), None);
        assert_eq!(hint("something else"), None);
    }
}
