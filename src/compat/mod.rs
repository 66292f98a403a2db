//! envoyproxy/ratelimit's environment, read once at start and mapped onto slidegate's settings.
//!
//! A deployment of envoyproxy/ratelimit (Istio's sample, most Helm charts) configures it with
//! environment variables: `REDIS_URL=redis:6379`, `RUNTIME_ROOT=/data`, `USE_STATSD=false`, ...
//! Switching should mean changing the image and nothing else, so [`translate`] reads those
//! variables and says which of slidegate's settings they stand for, typed ([`Value`]);
//! [`Translation::apply`] sets each one only where the command line and the `SLIDEGATE_*`
//! variables left it at its default: slidegate's own settings always win.
//!
//! The layer is off unless the environment looks like envoyproxy/ratelimit's: at least one of its
//! variables other than the generic `HOST`, `PORT`, `LOG_LEVEL` and `LOG_FORMAT` is set (a shell
//! or platform may export those for other reasons).
//!
//! Every variable is either honoured (mapped, or not needed because slidegate already behaves
//! that way), or named in [`Translation::unhonoured`] for one startup warning, or, where slidegate
//! cannot serve as configured (quota mode, a gRPC TLS or Unix-socket listener, xDS,
//! memcached), a [`CompatError`] that stops the start. So is a malformed value: a start with a
//! setting silently dropped would look healthy and behave differently.
//!
//! No other module knows these variables' names.

mod behaviour;
mod known;
mod listeners;
mod redis;
mod rules;
#[cfg(test)]
mod tests;
mod value;

use crate::settings::{LOG_TARGET, Settings};
use known::{GENERIC, KNOWN};

pub use value::{SETTING_IDS, Value};

/// The settings envoyproxy/ratelimit's environment stands for, and what it asks that slidegate
/// does not do.
#[derive(Debug, Default)]
pub struct Translation {
    /// Settings to apply where slidegate's own are unset.
    pub settings: Vec<Setting>,
    /// Variables set but not honoured, each with the reason; empty when all were honoured.
    pub unhonoured: Vec<Unhonoured>,
    /// Variables honoured at a cost the operator must know of, each with that cost.
    pub warnings: Vec<Caveat>,
}

/// One of slidegate's settings, from one or more of envoyproxy/ratelimit's variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub value: Value,
    /// The variables it came from, for the log (values can hold secrets: `REDIS_AUTH`).
    pub from: &'static str,
}

impl Setting {
    /// The setting's identifier: the `serve` flag's name with `_` for `-` (`redis_url`).
    pub fn id(&self) -> &'static str {
        self.value.id()
    }
}

/// A variable that is set but not honoured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhonoured {
    pub variable: &'static str,
    pub why: &'static str,
}

/// A variable honoured at a cost: logged as a warning at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caveat {
    pub variable: &'static str,
    pub cost: &'static str,
}

/// A value slidegate cannot start with, naming the variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}: {problem}")]
pub struct CompatError {
    pub variable: &'static str,
    pub problem: String,
}

/// Reads envoyproxy/ratelimit's variables through `env` (a lookup by name; `std::env::var` in the
/// binary). `None` when none of its distinctive variables is set.
pub fn translate(env: impl Fn(&str) -> Option<String>) -> Result<Option<Translation>, CompatError> {
    let env = Env::new(env);
    if !KNOWN
        .iter()
        .any(|name| !GENERIC.contains(name) && env.get(name).is_some())
    {
        return Ok(None);
    }
    let mut out = Translation::default();
    rules::refuse_what_cannot_be_served(&env)?;
    if !rules::xds(&env, &mut out)? {
        rules::files(&env, &mut out)?;
    }
    listeners::listeners(&env, &mut out)?;
    redis::redis(&env, &mut out)?;
    behaviour::logging(&env, &mut out)?;
    behaviour::behaviour(&env, &mut out)?;
    behaviour::observability(&env, &mut out)?;
    for name in KNOWN {
        if env.get(name).is_some() && !env.was_read(name) {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why: "slidegate has no such setting",
            });
        }
    }
    Ok(Some(out))
}

/// The lookup, remembering which variables a mapping read (the rest are unhonoured).
struct Env<F> {
    lookup: F,
    read: std::cell::RefCell<Vec<&'static str>>,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn new(lookup: F) -> Self {
        Env {
            lookup,
            read: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// The value, `None` when unset or empty (envoyproxy/ratelimit's defaults then apply).
    fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|value| !value.is_empty())
    }

    /// [`Env::get`], marking the variable as honoured.
    fn take(&self, name: &'static str) -> Option<String> {
        self.read.borrow_mut().push(name);
        self.get(name)
    }

    fn was_read(&self, name: &str) -> bool {
        self.read.borrow().contains(&name)
    }

    /// A boolean as Go's `strconv.ParseBool` reads it (`1`, `t`, `true`, `TRUE`, `0`, `f`, ...).
    fn flag(&self, name: &'static str) -> Result<Option<bool>, CompatError> {
        let Some(value) = self.take(name) else {
            return Ok(None);
        };
        match value.as_str() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(Some(true)),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(Some(false)),
            _ => Err(invalid(name, &value, "expected true or false")),
        }
    }

    fn port(&self, name: &'static str) -> Result<Option<u16>, CompatError> {
        self.take(name)
            .map(|value| {
                value
                    .parse::<u16>()
                    .map_err(|_| invalid(name, &value, "expected a port number (0-65535)"))
            })
            .transpose()
    }

    /// Honoured as long as it is unset or `expected`; otherwise named with `why`.
    fn expect_flag(
        &self,
        name: &'static str,
        expected: bool,
        why: &'static str,
        out: &mut Translation,
    ) -> Result<(), CompatError> {
        if self.flag(name)?.is_some_and(|value| value != expected) {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why,
            });
        }
        Ok(())
    }

    /// Named with `why` when set at all.
    fn unhonoured_if_set(&self, name: &'static str, why: &'static str, out: &mut Translation) {
        if self.take(name).is_some() {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why,
            });
        }
    }
}

fn invalid(variable: &'static str, value: &str, expected: &str) -> CompatError {
    CompatError {
        variable,
        problem: format!("{expected}, got {value:?}"),
    }
}

fn unsupported(variable: &'static str, problem: &str) -> CompatError {
    CompatError {
        variable,
        problem: problem.to_owned(),
    }
}

fn set(out: &mut Translation, value: Value, from: &'static str) {
    out.settings.push(Setting { value, from });
}

impl Translation {
    /// Fills `settings` with each setting the user did not give ([`Settings::given`]): a flag
    /// on the command line and a `SLIDEGATE_*` variable win over envoyproxy/ratelimit's.
    ///
    /// The settings filled are checked as the flags would be: `--redis-sentinel` and
    /// `--redis-cluster` exclude each other, whichever side gave them. (Every other constraint
    /// between flags holds already: the environment gives each setting with those it needs.)
    pub fn apply(&self, settings: &mut Settings) -> Result<(), clap::Error> {
        for setting in &self.settings {
            if !settings.given.contains(setting.id()) {
                setting.value.clone().set(settings);
            }
        }
        if !settings.store.redis_sentinel.is_empty() && !settings.store.redis_cluster.is_empty() {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ArgumentConflict,
                "the argument '--redis-sentinel <REDIS_SENTINEL>' cannot be used with \
                 '--redis-cluster <REDIS_CLUSTER>'\n",
            ));
        }
        Ok(())
    }

    /// Logs what the environment set, and, in one warning, what it asked for that slidegate
    /// does not do.
    pub fn log(&self) {
        let mapped: Vec<String> = (self.settings.iter())
            .map(|setting| format!("{} -> --{}", setting.from, setting.id().replace('_', "-")))
            .collect();
        tracing::info!(
            target: LOG_TARGET,
            mapped = %mapped.join(", "),
            "envoyproxy/ratelimit environment read (slidegate's own flags and SLIDEGATE_* variables take precedence)"
        );
        for warning in &self.warnings {
            tracing::warn!(target: LOG_TARGET, variable = warning.variable, "{}", warning.cost);
        }
        if self.unhonoured.is_empty() {
            return;
        }
        let variables: Vec<&str> = self.unhonoured.iter().map(|u| u.variable).collect();
        let reasons: Vec<String> = (self.unhonoured.iter())
            .map(|u| format!("{}: {}", u.variable, u.why))
            .collect();
        tracing::warn!(
            target: LOG_TARGET,
            variables = %variables.join(","),
            reasons = %reasons.join("; "),
            "envoyproxy/ratelimit settings not honoured by slidegate"
        );
    }
}
