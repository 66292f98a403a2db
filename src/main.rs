//! The `slidegate` command line: `serve` (the default) and `check-config`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sliding-window rate-limit service for Envoy (RateLimitService v3) and nginx.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checks rule files and prints every error (exit 1) or a summary (exit 0).
    CheckConfig {
        /// A rule file, or a directory of `*.yaml`/`*.yml` files.
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { path }) => check_config(&path),
        None => ExitCode::FAILURE,
    }
}

/// `slidegate check-config PATH`: one error per line on stderr and exit 1, or a summary and exit 0.
fn check_config(path: &std::path::Path) -> ExitCode {
    match slidegate::config::load_path(path) {
        Ok(rules) => {
            let domains = rules
                .rules()
                .iter()
                .map(|r| r.domain.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            println!("OK: {} rules in {} domains", rules.rule_count(), domains);
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}
