//! The Redis password read from a file (`--redis-password-file`), for a password that must not
//! sit in the environment or on the command line (a Kubernetes Secret mounted as a file).
//!
//! A mounted Secret is rotated in place, so the file is read again every time a connection is
//! made (at start, after every reconnect), never kept: rotating the password in Redis and the
//! file together needs no restart. redis-rs asks a [`StreamingCredentialsProvider`] for the
//! credentials when it connects; the stream this one gives yields the file's password once and
//! then stays open without yielding (redis-rs also subscribes once per connection to
//! re-authenticate on a new item, which then sends one redundant `AUTH` with the same password).
//! A connection already authenticated stays so when Redis's password changes, as Redis does.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use ::redis::{BasicAuth, ErrorKind, RedisError, RedisResult, StreamingCredentialsProvider};
use futures::Stream;
use futures::stream::{self, StreamExt};

use crate::store::StoreError;

/// What the error of a password file that cannot be read says (`classify` finds it in the
/// cluster client's errors, which keep only the text).
pub(super) const UNREADABLE: &str = "cannot read the Redis password file";

/// The longest password file read: a path that names something else (`/dev/zero`, a log) ends
/// at this many bytes, as an error.
const MAX_BYTES: u64 = 4096;

/// Where the password is, and the user it goes with.
#[derive(Clone, Debug)]
pub(super) struct PasswordFile {
    path: PathBuf,
    /// The user of the URL, or Redis's `default` user.
    username: String,
}

impl PasswordFile {
    /// The file at `path` for `username` (`None`: Redis's `default` user), and the password it
    /// holds now: a file that cannot be read or holds no password stops the start.
    pub(super) fn open(
        path: &Path,
        username: Option<&str>,
    ) -> Result<(PasswordFile, String), StoreError> {
        let file = PasswordFile {
            path: path.to_path_buf(),
            username: username.unwrap_or("default").to_string(),
        };
        let password = file.read().map_err(StoreError::Backend)?;
        Ok((file, password))
    }

    /// The file's text without the line ending it usually has (`echo pw > file`, a Secret written
    /// by hand); spaces inside and at the start are the password's.
    fn read(&self) -> Result<String, String> {
        use std::io::Read as _;
        let unreadable = |e: &dyn std::fmt::Display| format!("{UNREADABLE} {:?}: {e}", self.path);
        let mut text = String::new();
        std::fs::File::open(&self.path)
            .and_then(|file| file.take(MAX_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| unreadable(&e))?;
        if text.len() as u64 > MAX_BYTES {
            return Err(unreadable(&format!("longer than {MAX_BYTES} bytes")));
        }
        let password = text.trim_end_matches(['\n', '\r']);
        if password.is_empty() {
            return Err(format!("the Redis password file {:?} is empty", self.path));
        }
        Ok(password.to_string())
    }
}

impl StreamingCredentialsProvider for PasswordFile {
    fn subscribe(&self) -> Pin<Box<dyn Stream<Item = RedisResult<BasicAuth>> + Send + 'static>> {
        let file = self.clone();
        // Read off the serving thread: a file on a slow mount must not stall its calls.
        let credentials = async move {
            let read = tokio::task::spawn_blocking(move || {
                file.read()
                    .map(|password| BasicAuth::new(file.username.clone(), password))
            })
            .await
            .unwrap_or_else(|e| Err(format!("{UNREADABLE}: {e}")));
            // An unreadable file is the credentials' fault: reported as an authentication
            // failure (`StoreError::Auth`), not as an outage.
            read.map_err(|why| {
                RedisError::from((ErrorKind::AuthenticationFailed, "password file", why))
            })
        };
        Box::pin(stream::once(credentials).chain(stream::pending()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_file_is_read_at_every_subscription() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("password");
        std::fs::write(&path, "first\n").expect("write");
        let (file, password) = PasswordFile::open(&path, None).expect("open");
        assert_eq!(password, "first");
        std::fs::write(&path, " second pass\r\n").expect("write");
        let auth = file.subscribe().next().await.expect("an item").expect("ok");
        assert_eq!(
            (auth.username(), auth.password()),
            ("default", " second pass")
        );
        std::fs::remove_file(&path).expect("remove");
        let err = file.subscribe().next().await.expect("an item").err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::AuthenticationFailed));
    }

    #[test]
    fn an_empty_or_missing_file_stops_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("password");
        let missing = PasswordFile::open(&path, Some("app")).err();
        assert!(
            format!("{missing:?}").contains("cannot read"),
            "{missing:?}"
        );
        std::fs::write(&path, "\n").expect("write");
        let empty = PasswordFile::open(&path, Some("app")).err();
        assert!(format!("{empty:?}").contains("is empty"), "{empty:?}");
    }
}
