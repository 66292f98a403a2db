//! `GET /limited`: who is being limited now, across every replica that shares the store.
//!
//! Each replica counts its own denies in a structure of fixed size
//! ([`LimitedKeys`](crate::limiter::limited::LimitedKeys)); every [`POST_EVERY`] it posts its
//! [`POSTED`] most-denied counters on the store's notice board
//! ([`Store::post`](crate::store::Store::post): on Redis a hash with a field per replica, at most
//! a few tens of KB each, expired after [`NOTE_TTL`]; the memory store serves one replica and
//! keeps none). `/limited` merges this replica's live list with the others' notes: a counter
//! denied through several replicas shows once, its denies summed and `replicas` saying how many
//! saw it. Others' counts are at most `POST_EVERY` old.
//!
//! The answer (JSON): `replicas` (how many lists were merged), `entries` most denied first, each
//! with `domain`, `rule`, the descriptor `entries` (each value cut to [`MAX_VALUE_CHARS`]
//! characters, or `(hidden)` under `--operator-hide-values`), `denied` (denies since `firstDeny`,
//! at most `overstated` too many), `firstDeny`, `lastDeny` and `replicas`. Query: `?domain=`
//! keeps one domain, `?limit=` the first N (default 50, at most 256).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use crate::limiter::limited::{CAPACITY, LimitedKey};
use crate::service::front::Front;
use crate::service::http_routes::AppState;

/// How often each replica posts its list.
pub const POST_EVERY: Duration = Duration::from_secs(2);

/// How long a posted list counts: a replica that stopped posting drops out after this.
pub const NOTE_TTL: Duration = Duration::from_secs(10);

/// Counters each replica posts.
pub const POSTED: usize = 64;

/// The most characters of a value shown (and posted).
pub const MAX_VALUE_CHARS: usize = 128;

/// Entries of a descriptor shown (and posted); the rest are left out.
const MAX_ENTRIES: usize = 16;

const BOARD: &str = "limited";

/// One row of the list, as posted and as answered.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct Row {
    domain: String,
    rule: String,
    entries: Vec<(String, String)>,
    denied: u64,
    overstated: u64,
    /// Unix milliseconds.
    first_deny: u64,
    last_deny: u64,
    #[serde(default = "one")]
    replicas: u64,
}

fn one() -> u64 {
    1
}

impl Row {
    fn of(key: &LimitedKey) -> Row {
        let (domain, entries) = key.key.decode().unwrap_or_default();
        let entries = entries
            .into_iter()
            .take(MAX_ENTRIES)
            .map(|(k, v)| (cut(k), cut(v)))
            .collect();
        Row {
            domain,
            rule: key.rule.to_string(),
            entries,
            denied: key.denied,
            overstated: key.overstated,
            first_deny: super::unix_millis(key.first),
            last_deny: super::unix_millis(key.last),
            replicas: 1,
        }
    }
}

/// This replica's name on the notice board: random, so that replicas never collide.
pub fn replica_name() -> String {
    use std::hash::BuildHasher;
    let seed = std::hash::RandomState::new();
    format!("{:016x}", seed.hash_one(std::process::id()))
}

/// Posts this replica's list every [`POST_EVERY`] until `stop`.
pub fn spawn_poster(front: Arc<Front>, replica: String, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        // A replica that denies nothing writes nothing (after one empty list replacing its last).
        let mut posted_empty = true;
        let mut tick = tokio::time::interval(POST_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let limiter = front.limiter();
            let rows: Vec<Row> = limiter
                .limited()
                .top(SystemTime::now())
                .iter()
                .take(POSTED)
                .map(Row::of)
                .collect();
            if rows.is_empty() && std::mem::replace(&mut posted_empty, true) {
                continue;
            }
            posted_empty = rows.is_empty();
            let Ok(note) = serde_json::to_string(&rows) else {
                continue;
            };
            // A failed post leaves the previous note to expire; the next one tries again.
            let _ = limiter.store().post(BOARD, &replica, &note, NOTE_TTL).await;
        }
    });
}

#[derive(Debug, Deserialize)]
pub(super) struct Asked {
    domain: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn handler(
    state: AppState,
    hide: bool,
    replica: &str,
    Query(asked): Query<Asked>,
) -> Response {
    let limiter = state.front.limiter();
    let mine: Vec<Row> = limiter
        .limited()
        .top(SystemTime::now())
        .iter()
        .map(Row::of)
        .collect();
    let notes = match limiter.store().notes(BOARD).await {
        Ok(notes) => notes,
        Err(error) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the other replicas' lists: {error}\n"),
            )
                .into_response();
        }
    };
    let mut lists = vec![mine];
    for (author, note) in notes {
        if author != replica {
            lists.push(serde_json::from_str(&note).unwrap_or_default());
        }
    }
    let replicas = lists.len();
    let mut rows = merge(lists);
    if let Some(domain) = &asked.domain {
        rows.retain(|row| row.domain == *domain);
    }
    rows.truncate(asked.limit.unwrap_or(50).min(CAPACITY));
    if hide {
        for row in &mut rows {
            for (_, value) in &mut row.entries {
                *value = super::explain::HIDDEN.to_owned();
            }
        }
    }
    let entries: Vec<_> = rows
        .iter()
        .map(|row| {
            let entries: Vec<_> = row
                .entries
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
            json!({
                "domain": row.domain,
                "rule": row.rule,
                "entries": entries,
                "denied": row.denied,
                "overstated": row.overstated,
                "firstDeny": rfc3339(row.first_deny),
                "lastDeny": rfc3339(row.last_deny),
                "replicas": row.replicas,
            })
        })
        .collect();
    Json(json!({"replicas": replicas, "entries": entries})).into_response()
}

/// What identifies a counter in the lists: domain, rule and entries.
type RowId = (String, String, Vec<(String, String)>);

/// One list from several: a counter (domain, rule, entries) listed by several replicas once,
/// its denies summed; most denied first.
fn merge(lists: Vec<Vec<Row>>) -> Vec<Row> {
    let mut merged: HashMap<RowId, Row> = HashMap::new();
    for row in lists.into_iter().flatten() {
        let id = (row.domain.clone(), row.rule.clone(), row.entries.clone());
        match merged.get_mut(&id) {
            Some(seen) => {
                seen.denied = seen.denied.saturating_add(row.denied);
                seen.overstated = seen.overstated.saturating_add(row.overstated);
                seen.first_deny = seen.first_deny.min(row.first_deny);
                seen.last_deny = seen.last_deny.max(row.last_deny);
                seen.replicas += 1;
            }
            None => {
                merged.insert(id, row);
            }
        }
    }
    let mut rows: Vec<Row> = merged.into_values().collect();
    rows.sort_by(|a, b| b.denied.cmp(&a.denied).then(b.last_deny.cmp(&a.last_deny)));
    rows
}

fn cut(mut text: String) -> String {
    if let Some((at, _)) = text.char_indices().nth(MAX_VALUE_CHARS) {
        text.truncate(at);
    }
    text
}

fn rfc3339(millis: u64) -> String {
    // humantime writes years up to 9999; a note's times come from replicas, but are not trusted.
    const LAST: u64 = 253_402_300_799_999;
    let at = UNIX_EPOCH + Duration::from_millis(millis.min(LAST));
    humantime::format_rfc3339_millis(at).to_string()
}
