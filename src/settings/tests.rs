//! The flag table of the documentation against the flags themselves.

use clap::Args as _;

use super::Settings;

/// The file with the table of flags (`| flag | env | default | meaning |`), from the crate's root.
const FLAG_TABLE: &str = "docs/flags.md";

/// One row of the table: the flag (`--config`), its variable and its default, backticks kept.
struct Row {
    flag: String,
    env: String,
    default: String,
}

fn rows(text: &str) -> Vec<Row> {
    text.lines()
        .filter(|line| line.starts_with("| `--"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquoted = |cell: &str| cell.trim_matches('`').to_owned();
            Row {
                flag: unquoted(cells[1]),
                env: unquoted(cells[2]),
                default: cells[3].to_owned(),
            }
        })
        .collect()
}

/// Whether the table's default names `shown`, the default `--help` shows: the same text in
/// backticks, or the same number (`1.0` for `1`).
fn names_default(cell: &str, shown: &str) -> bool {
    let Some(literal) = cell
        .strip_prefix('`')
        .and_then(|rest| rest.split('`').next())
    else {
        return false;
    };
    literal == shown
        || matches!((literal.parse::<f64>(), shown.parse::<f64>()), (Ok(a), Ok(b)) if a == b)
}

/// Every `serve` flag has its row, with its variable and the default `--help` shows; a flag whose
/// help states its default in words has one in the table too, and one without a default claims
/// none; and every row names a flag that exists.
#[test]
fn the_flag_table_matches_the_flags() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FLAG_TABLE);
    let text = std::fs::read_to_string(&path).expect("the flag table's file");
    let rows = rows(&text);
    let command = Settings::augment_args(clap::Command::new("serve"));
    let mut wrong = Vec::new();
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        let Some(row) = rows.iter().find(|row| row.flag == flag) else {
            wrong.push(format!("{flag}: no row"));
            continue;
        };
        let env = arg.get_env().map(|env| env.to_string_lossy().into_owned());
        if env.as_deref() != Some(row.env.as_str()) {
            wrong.push(format!(
                "{flag}: env {} in the table, {env:?} in --help",
                row.env
            ));
        }
        let defaults: Vec<String> = (arg.get_default_values().iter())
            .map(|value| value.to_string_lossy().into_owned())
            .collect();
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string());
        let stated = help.is_some_and(|help| help.contains("[default: "));
        let fits = match (
            defaults.is_empty() || arg.is_hide_default_value_set(),
            stated,
        ) {
            (false, _) => names_default(&row.default, &defaults.join(",")),
            (true, true) => !row.default.starts_with('—'),
            (true, false) => !row.default.starts_with('`'),
        };
        if !fits {
            let shown = defaults.join(",");
            wrong.push(format!(
                "{flag}: default {} in the table, {shown:?} in --help",
                row.default
            ));
        }
    }
    for row in &rows {
        if !command
            .get_arguments()
            .any(|arg| arg.get_long() == row.flag.strip_prefix("--"))
        {
            wrong.push(format!("{}: in the table, not a flag", row.flag));
        }
    }
    assert!(
        wrong.is_empty(),
        "{FLAG_TABLE} against --help:\n{}",
        wrong.join("\n")
    );
    assert!(
        rows.len() > 40,
        "the table in {FLAG_TABLE} has {} rows",
        rows.len()
    );
}
