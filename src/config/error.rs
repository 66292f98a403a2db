//! Configuration errors: each names the file and the path to the bad field.

use std::fmt;

/// One problem in one rule file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The file (or directory) the error is about.
    pub file: String,
    /// Where and what, e.g. `descriptors[0].rate_limit.unit: unknown unit "fortnight"`.
    pub message: String,
}

/// Every problem found in one load; a load either succeeds whole or reports all of these.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// Something a load went on past: a value read differently from a strict YAML reading (as
/// envoyproxy/ratelimit's parser reads it), a duplicate key, a skipped file. Printed by
/// `check-config` and logged, never a reason to refuse the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The file (or directory entry) the warning is about.
    pub file: String,
    /// Where and what, e.g. `descriptors[0].shadow_mode: \`yes\` read as true (...)`.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}
