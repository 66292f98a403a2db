//! The replicas' notice board: small notes each replica posts off the request path, for what an
//! operator asks of all of them at once (`GET /limited`: each replica's most-denied counters).
//!
//! One hash per board, `prefix + "board:" + name`: a field per replica, its value the note after
//! the instant it expires (Unix milliseconds and a space). Readers skip expired notes and delete
//! them, and every post renews the hash's expiry, so a board holds at most one note per live
//! replica and disappears when no replica posts any more.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RedisStore;
use crate::store::StoreError;

impl RedisStore {
    fn board_key(&self, board: &str) -> String {
        format!("{}board:{board}", self.shared.prefix)
    }

    pub(super) async fn post_note(
        &self,
        board: &str,
        author: &str,
        note: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let key = self.board_key(board);
        let expires = unix_millis(SystemTime::now() + ttl);
        let value = format!("{expires} {note}");
        self.command::<i64>(::redis::cmd("HSET").arg(&key).arg(author).arg(value))
            .await?;
        let keep = u64::try_from(ttl.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(3);
        self.command::<i64>(::redis::cmd("PEXPIRE").arg(&key).arg(keep))
            .await?;
        Ok(())
    }

    pub(super) async fn read_notes(
        &self,
        board: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let key = self.board_key(board);
        let all: HashMap<String, String> = self.command(::redis::cmd("HGETALL").arg(&key)).await?;
        let now = unix_millis(SystemTime::now());
        let mut notes = Vec::with_capacity(all.len());
        let mut expired = Vec::new();
        for (author, value) in all {
            let parsed = value
                .split_once(' ')
                .and_then(|(at, note)| Some((at.parse::<u64>().ok()?, note)));
            match parsed {
                Some((at, note)) if at > now => notes.push((author, note.to_owned())),
                _ => expired.push(author),
            }
        }
        if !expired.is_empty() {
            // Best effort: a note left behind is skipped again by the next reader.
            let _ = self
                .command::<i64>(::redis::cmd("HDEL").arg(&key).arg(&expired))
                .await;
        }
        Ok(notes)
    }
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
