//! The sliding-window Lua script: its arguments, its reply, and the ids of the hits it records.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::store::{Counter, CounterResult, HitKind, MAX_WINDOW, StoreError};

/// The script's source, the files of `sliding_window/` in order (one concept each: the reply and
/// the node's clock, carrying a counter between forms, logs, buckets, deciding a request): its
/// first line is the `#!lua` header (Redis 7.0 or later).
const SOURCE: &str = concat!(
    include_str!("../sliding_window/1_clock.lua"),
    include_str!("../sliding_window/2_carry.lua"),
    include_str!("../sliding_window/3_log.lua"),
    include_str!("../sliding_window/4_buckets.lua"),
    include_str!("../sliding_window/5_decide.lua"),
);

/// The script (see `sliding_window/` for the algorithm), with its `#!lua` header: Redis 7 then
/// checks `maxmemory` before the script runs and refuses the whole call at the limit. redis-rs
/// sends it by SHA (`EVALSHA`) and loads it on `NOSCRIPT`, so a restarted or new Redis node needs
/// no preparation.
pub static SCRIPT: LazyLock<::redis::Script> = LazyLock::new(|| ::redis::Script::new(SOURCE));

/// The same script for servers before Redis 7.0, which read `#!lua` as a Lua syntax error. Its
/// first line takes the header's place (so the line numbers in Redis's messages stay) and does
/// what the header's flags do on 7.x (see [`HEADERLESS_FIRST_LINE`]).
pub static HEADERLESS: LazyLock<::redis::Script> = LazyLock::new(|| {
    let body = SOURCE.split_once('\n').map_or("", |(_, body)| body);
    ::redis::Script::new(&format!("{HEADERLESS_FIRST_LINE}\n{body}"))
});

/// The headerless script's first line:
/// - `redis.replicate_commands()`: the writes after `TIME` are replicated as effects even where
///   `lua-replicate-commands` was turned off (7.0 always does so; the call is a no-op there).
/// - The `maxmemory` check up front. Redis 6 checks memory only at a script's first write that
///   can grow memory, and lets a script that has written once go on past the limit; the trim is a
///   write that cannot, so without this line a Redis at `maxmemory` (`noeviction`) would let every
///   exact counter record past its limit. A `ZADD ... XX` of a member that no counter holds is
///   such a write that changes nothing (on a missing key, on a sorted set; a hash answers
///   `WRONGTYPE`, ignored): at the limit Redis refuses it, and the script answers Redis 7's `OOM`
///   error before it has written anything; otherwise Redis counts the script as having written,
///   as Redis 7 does once its up-front check passed. The health probe is checked as well (its
///   keys hold nothing), and health takes the `OOM` answer for an answer, as on Redis 7.
const HEADERLESS_FIRST_LINE: &str = "redis.replicate_commands() if #KEYS > 0 then local oom = \
    redis.pcall('ZADD', KEYS[1], 'XX', 0, '') if type(oom) == 'table' and oom.err and \
    string.find(oom.err, 'OOM', 1, true) then return redis.error_reply(\"OOM command not allowed \
    when used memory > 'maxmemory' (checked before the script's first write)\") end end";

/// Which of the two scripts a store sends: the one with the header until a server refuses to
/// compile it (Redis 6.x), the headerless one from then on, for every node of the store (it runs
/// on 7.x as well, so a cluster in the middle of an upgrade keeps working).
#[derive(Debug, Default)]
pub struct Dialect {
    headerless: AtomicBool,
}

impl Dialect {
    /// The script this store sends now.
    pub fn script(&self) -> &'static ::redis::Script {
        if self.headerless.load(Ordering::Relaxed) {
            &HEADERLESS
        } else {
            &SCRIPT
        }
    }

    /// Loads the script into the server behind `conn` (after `NOSCRIPT`). A server that cannot
    /// compile the header (before 7.0) gets the headerless script, and the store sends that one
    /// from then on.
    async fn load<C: ::redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> ::redis::RedisResult<()> {
        let script = self.script();
        match script.prepare_invoke().load_async(conn).await {
            Err(e) if !std::ptr::eq(script, &*HEADERLESS) && refuses_header(&e) => {
                HEADERLESS.prepare_invoke().load_async(conn).await?;
                if !self.headerless.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "Redis before 7.0: the sliding-window script runs without its flags \
                         line, so at maxmemory (noeviction) a call is refused at its first write \
                         rather than before it runs (see docs/operations.md)"
                    );
                }
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }
}

/// Whether `e` is a server's refusal to compile the `#!lua` header: Redis 6.x reads it as Lua
/// (`user_script:1: unexpected symbol near '#'`).
fn refuses_header(e: &::redis::RedisError) -> bool {
    let text = e.to_string();
    text.contains("Error compiling script") && text.contains("near '#'")
}

/// The compensation (`bucket_take_back.lua`) for `hits` hits that the script recorded in `bucket`
/// of the bucket counter `key` (and of its provisional hash `log`), decided as `counter`. Sent as
/// `EVAL`: compensations are rare, and a `NOSCRIPT` reply would leave the hits in place.
pub fn take_back_buckets(
    key: &str,
    log: &str,
    bucket: u64,
    hits: u64,
    counter: &Counter,
) -> ::redis::Cmd {
    ::redis::cmd("EVAL")
        .arg(include_str!("../bucket_take_back.lua"))
        .arg(2)
        .arg(key)
        .arg(log)
        .arg(bucket)
        .arg(hits.min(LUA_MAX))
        .arg(bucket_width_micros(counter))
        .clone()
}

/// Largest limit or hit count sent to Lua, whose numbers are doubles: exact integers up to 2^53.
/// A limit of 2^50 is unlimited in practice. Windows are bounded by [`MAX_WINDOW`] instead.
const LUA_MAX: u64 = 1 << 50;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Length of the random instance part of a request id: 62^8 ≈ 2^47.6, so even a thousand replicas
/// started at once collide with a chance of about 10^-9.
const INSTANCE_LEN: usize = 8;

/// Unique ids for requests, and so for the sorted-set members of their hits.
///
/// A member must be unique per counter, or a second hit in the same microsecond would overwrite
/// the first (a sorted set holds each member once) and be admitted without being counted. The id
/// is a random instance part drawn when the store is created (so replicas differ) followed by a
/// per-store sequence number, both base 62: about 12 bytes. The first hit of a request uses the id
/// itself, hit `n > 1` the id plus `:n`; base 62 has no `:`, so members never collide.
#[derive(Debug)]
pub struct RequestIds {
    instance: String,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::new()
    }
}

impl RequestIds {
    /// Draws a fresh random instance id.
    pub fn new() -> RequestIds {
        let mut instance = String::with_capacity(INSTANCE_LEN);
        for _ in 0..INSTANCE_LEN {
            instance.push(BASE62[rand::random_range(0..62)] as char);
        }
        RequestIds {
            instance,
            next: AtomicU64::new(0),
        }
    }

    /// The id of a new request: one allocation of its final size (a clone of the instance part
    /// grown by the sequence number would allocate twice).
    pub fn next(&self) -> String {
        let mut id = String::with_capacity(INSTANCE_LEN + BASE62_DIGITS);
        id.push_str(&self.instance);
        push_base62(&mut id, self.next.fetch_add(1, Ordering::Relaxed));
        id
    }
}

/// Base-62 digits of the largest `u64`.
const BASE62_DIGITS: usize = 11;

fn push_base62(out: &mut String, mut n: u64) {
    let mut digits = [0u8; BASE62_DIGITS];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = BASE62[(n % 62) as usize];
        n /= 62;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[i..].iter().map(|&d| d as char));
}

/// The members the script records for `hits` hits of request `id` (used to take them back).
pub fn members(id: &str, hits: u64) -> Vec<String> {
    (1..=hits.min(LUA_MAX))
        .map(|n| {
            if n == 1 {
                id.to_string()
            } else {
                format!("{id}:{n}")
            }
        })
        .collect()
}

/// One request's part of a script call: its id and the counters the call decides for it.
pub struct CallPart<'a> {
    pub id: &'a str,
    /// One slot's part of a request whose counters span several slots (cluster): its hits are
    /// provisional (taken back if another slot denies), so they also go to each counter's
    /// provisional log.
    pub provisional: bool,
    pub counters: &'a [Counter],
}

/// Suffix of a counter's provisional log (see [`CallPart::provisional`]). Counter keys end in the
/// window's digits, so no counter key ends in it; the hash tag, and so the slot, is the counter's.
pub const PROVISIONAL_SUFFIX: &str = "p";

/// The node's clock outside a cluster (after the prefix): the latest counter "now" a call has
/// decided, which spares each exact log a read of its newest hit (see the script). Counter keys
/// start with `{`, so none is named so.
pub const CLOCK_KEY: &str = "clock";

/// The `EVALSHA` call deciding `parts` in order (in a cluster, all on one slot, and `logs` set:
/// each counter's provisional log is passed after its part's keys; otherwise the node's clock
/// [`CLOCK_KEY`] is passed last). `deadline` is in the server's
/// clock (microseconds of `TIME`, 0 for none; see the `deadline` module): a call that starts later
/// decides nothing.
///
/// Built straight into one [`::redis::Cmd`] buffer: each key is written as `prefix + key` without
/// an intermediate `String`, and the script text is never part of a request (only its SHA; see
/// [`run`] for the `NOSCRIPT` case).
pub fn command(
    script: &::redis::Script,
    prefix: &str,
    logs: bool,
    deadline: u64,
    parts: &[CallPart<'_>],
) -> ::redis::Cmd {
    let counters: usize = parts.iter().map(|p| p.counters.len()).sum();
    let keys = if logs { 2 * counters } else { counters + 1 };
    let mut cmd = ::redis::Cmd::with_capacity(7 + keys + 4 * parts.len() + 5 * counters, 64 * keys);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    for part in parts {
        for c in part.counters {
            cmd.arg(PrefixedKey(prefix, c.key.as_str(), ""));
        }
        if logs {
            for c in part.counters {
                cmd.arg(PrefixedKey(prefix, c.key.as_str(), PROVISIONAL_SUFFIX));
            }
        }
    }
    if !logs {
        cmd.arg(PrefixedKey(prefix, CLOCK_KEY, ""));
    }
    // Each distinct shape once (see the script's arguments): a part names the first part that
    // asks alike. A call holds at most `MAX_BATCH` parts (16), mostly of one or two shapes: on the
    // stack.
    let mut shape_of: smallvec::SmallVec<[usize; 16]> = smallvec::SmallVec::new();
    let mut shapes: smallvec::SmallVec<[&CallPart<'_>; 4]> = smallvec::SmallVec::new();
    for part in parts {
        match shapes.iter().position(|s| same_shape(s, part)) {
            Some(i) => shape_of.push(i + 1),
            None => {
                shapes.push(part);
                shape_of.push(shapes.len());
            }
        }
    }
    cmd.arg(parts.len())
        .arg(if logs { "1" } else { "2" })
        .arg(deadline)
        .arg(shapes.len());
    for shape in &shapes {
        cmd.arg(if shape.provisional { "1" } else { "0" })
            .arg(shape.counters.len());
        for c in shape.counters {
            cmd.arg(c.limit.min(LUA_MAX))
                .arg(window_micros(c.window))
                .arg(c.hits.min(LUA_MAX))
                .arg(flags(c))
                .arg(bucket_width_micros(c));
        }
    }
    for (part, shape) in parts.iter().zip(shape_of) {
        cmd.arg(part.id).arg(shape);
    }
    cmd
}

/// Whether two parts send the script the same arguments but for their ids and keys (compared
/// before they are made into arguments: counters that differ only where their arguments would
/// not, such as limits past [`LUA_MAX`], go as two shapes, which is as correct).
fn same_shape(a: &CallPart<'_>, b: &CallPart<'_>) -> bool {
    a.provisional == b.provisional
        && a.counters.len() == b.counters.len()
        && a.counters.iter().zip(b.counters).all(|(x, y)| {
            x.limit == y.limit
                && x.window == y.window
                && x.hits == y.hits
                && x.kind == y.kind
                && x.shadow == y.shadow
                && x.precision == y.precision
        })
}

/// A counter's flags for the script: 1 shadow, plus 2 charged or 4 returned.
fn flags(c: &Counter) -> &'static str {
    match (c.kind, c.shadow) {
        (HitKind::Admitted, false) => "0",
        (HitKind::Admitted, true) => "1",
        (HitKind::Charged, false) => "2",
        (HitKind::Charged, true) => "3",
        (HitKind::Returned, false) => "4",
        (HitKind::Returned, true) => "5",
    }
}

/// Runs a [`command`] (or a [`probe`]); on `NOSCRIPT` (a restarted or new server) loads the
/// script and retries once, as redis-rs's `Script::invoke_async` does, with the other script's
/// SHA if loading switched the dialect (see [`Dialect::load`]).
pub async fn run<C: ::redis::aio::ConnectionLike>(
    conn: &mut C,
    dialect: &Dialect,
    cmd: &::redis::Cmd,
) -> ::redis::RedisResult<Vec<u8>> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) => {
            dialect.load(conn).await?;
            with_script(cmd, dialect.script()).query_async(conn).await
        }
        other => other,
    }
}

/// `cmd` (`EVALSHA sha ...`) sending `script`'s SHA. A copy, made only after `NOSCRIPT`.
fn with_script(cmd: &::redis::Cmd, script: &::redis::Script) -> ::redis::Cmd {
    let mut out = ::redis::Cmd::new();
    // The script commands are built from simple arguments only (no cursor).
    for (i, arg) in cmd.args_iter().enumerate() {
        if let ::redis::Arg::Simple(bytes) = arg {
            if i == 1 {
                out.arg(script.get_hash());
            } else {
                out.arg(bytes);
            }
        }
    }
    out
}

/// The health probe: the script deciding no request. It answers only its header (the server's
/// `TIME`), so a server that answers it can run every call; one that cannot (an old version,
/// `EVALSHA` renamed away or forbidden by an ACL, a Lua error) fails it as the calls would.
///
/// Outside a cluster it names two keys of different hash slots, which the script leaves alone: a
/// cluster node answers `CROSSSLOT`, as it would every call (each names the node's clock beside
/// its counters), so a cluster node given as `--redis-url` is found before the first request.
/// A cluster's probe names none: there any two slots answer `CROSSSLOT`, healthy or not.
pub fn probe(script: &::redis::Script, prefix: &str, cluster: bool) -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.get_hash());
    if cluster {
        cmd.arg(0);
    } else {
        cmd.arg(2)
            .arg(PrefixedKey(prefix, "probe", "{0}"))
            .arg(PrefixedKey(prefix, "probe", "{1}"));
    }
    // No request, no shape.
    cmd.arg(0).arg("0").arg(0).arg(0);
    cmd
}

/// A Redis key written as prefix, counter key and suffix into one argument.
struct PrefixedKey<'a>(&'a str, &'a str, &'a str);

impl ::redis::ToRedisArgs for PrefixedKey<'_> {
    fn write_redis_args<W: ?Sized + ::redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        let mut arg = out.writer_for_next_arg();
        // Writing to the command's in-memory buffer cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(self.1.as_bytes());
        let _ = arg.write_all(self.2.as_bytes());
    }
}

/// The bucket width the script gets for a counter: 0 for the exact log. A width that does not
/// divide the window (never from validated rules) is sent as the log, which is exact.
fn bucket_width_micros(c: &Counter) -> u64 {
    let window = window_micros(c.window);
    match c.precision.bucket_width().map(window_micros) {
        Some(width) if width > 0 && window.is_multiple_of(width) => width,
        _ => 0,
    }
}

/// The window in microseconds, at most [`MAX_WINDOW`] (what validation lets through): a hit's time
/// plus the window stays an exact integer in Lua.
pub fn window_micros(window: Duration) -> u64 {
    u64::try_from(window.min(MAX_WINDOW).as_micros()).unwrap_or(u64::MAX)
}

/// One counter as the script reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    pub result: CounterResult,
    /// Time until one hit fits, `None` if one fits now or if that time is not certain (feeds the
    /// deny cache).
    pub one_hit_fits_in: Option<Duration>,
    /// The counter is full and some of its hits are provisional: another request's compensation
    /// may take them back early, so its full state must not be cached.
    pub provisional: bool,
    /// The bucket a bucket counter's hits went to (its index in the Redis hash), to take them back.
    pub bucket: Option<u64>,
}

/// The script's answer for the counters it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// No non-shadow counter of this call is over limit; their hits were recorded.
    pub allowed: bool,
    pub counters: Vec<Reported>,
}

/// Integers the script answers per counter.
const PER_COUNTER: usize = 5;

/// Integers of the reply's header: the server's `TIME` and whether the call expired.
const HEADER: usize = 2;

/// What one script call answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The server's `TIME` when the script ran, in microseconds.
    pub now: u64,
    /// One reply per part (an error for a part the script failed on alone), or `None` if the
    /// call reached Redis after its deadline and decided nothing.
    pub replies: Option<Vec<Result<Reply, StoreError>>>,
}

/// The header of a reply: the server's `TIME` (microseconds) and whether the call expired.
pub fn header(reply: &[u8]) -> Option<(u64, bool)> {
    let value = |i: usize| {
        let bytes = reply.get(8 * i..8 * (i + 1))?;
        Some(i64::from_le_bytes(bytes.try_into().ok()?))
    };
    Some((u64::try_from(value(0)?).unwrap_or(0), value(1)? == 1))
}

/// Reads the script's answer to a [`command`]: 64-bit little-endian integers, the header `now,
/// expired`, then (unless expired) per part `allowed, (over, count, reset_after_us, reset1_us,
/// bucket)*`.
pub fn parse(reply: &[u8], parts: &[CallPart<'_>]) -> Result<Answer, StoreError> {
    let decided: usize = parts
        .iter()
        .map(|p| 1 + PER_COUNTER * p.counters.len())
        .sum();
    let values: Vec<i64> = reply
        .chunks_exact(8)
        .map(|v| i64::from_le_bytes(v.try_into().unwrap_or_default()))
        .collect();
    let (now, expired) = header(reply).unwrap_or((0, false));
    let expected = if expired { HEADER } else { HEADER + decided };
    if reply.len() != 8 * expected {
        return Err(StoreError::Incompatible(format!(
            "sliding-window script returned {} bytes, expected {} integers",
            reply.len(),
            expected
        )));
    }
    if expired {
        return Ok(Answer { now, replies: None });
    }
    let mut rest = &values[HEADER..];
    let replies = parts
        .iter()
        .map(|part| {
            let (answer, tail) = rest.split_at(1 + PER_COUNTER * part.counters.len());
            rest = tail;
            parse_one(answer, part.counters)
        })
        .collect();
    Ok(Answer {
        now,
        replies: Some(replies),
    })
}

/// What the script answers as `allowed` for a request it failed on alone.
const FAILED: i64 = 2;

/// One part's `{allowed, (over, count, reset_after_us, reset1_us, bucket)*}`, its length already
/// checked.
fn parse_one(answer: &[i64], counters: &[Counter]) -> Result<Reply, StoreError> {
    if answer[0] == FAILED {
        return Err(StoreError::Backend(
            "the sliding-window script failed on this request (Redis's log says why); the \
             other requests of its call were decided"
                .into(),
        ));
    }
    let micros = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    let counters = answer[1..]
        .chunks_exact(PER_COUNTER)
        .zip(counters)
        .map(|(r, c)| {
            let count = u64::try_from(r[1]).unwrap_or(0);
            Reported {
                result: CounterResult {
                    over_limit: r[0] != 0,
                    count,
                    remaining: c.limit.saturating_sub(count),
                    reset_after: micros(r[2]),
                },
                one_hit_fits_in: (r[3] >= 0).then(|| micros(r[3])),
                provisional: r[3] == -2,
                bucket: u64::try_from(r[4]).ok(),
            }
        })
        .collect();
    Ok(Reply {
        allowed: answer[0] == 1,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Precision;
    use std::collections::HashSet;

    #[test]
    fn ids_are_short_unique_and_separator_free() {
        let a = RequestIds::new();
        let b = RequestIds::new();
        assert_ne!(a.instance, b.instance);
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let id = a.next();
            assert!(id.len() <= INSTANCE_LEN + 3, "{id}");
            assert!(id.bytes().all(|c| c.is_ascii_alphanumeric()));
            assert!(seen.insert(id));
        }
        assert!(seen.insert(b.next()));
    }

    #[test]
    fn base62_digits() {
        for (n, want) in [(0, "0"), (61, "z"), (62, "10"), (u64::MAX, "LygHa16AHYF")] {
            let mut s = String::new();
            push_base62(&mut s, n);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn members_of_a_request() {
        assert_eq!(members("abc", 0), Vec::<String>::new());
        assert_eq!(members("abc", 3), ["abc", "abc:2", "abc:3"]);
    }

    #[test]
    fn a_call_sends_each_shape_once_and_each_request_names_its_own() {
        let counter = |name: &str, limit: u64| Counter {
            key: crate::store::CounterKey::new("d", [("k", name)], Duration::from_secs(1)),
            limit,
            window: Duration::from_secs(1),
            hits: 1,
            shadow: false,
            precision: Precision::Exact,
            kind: HitKind::Admitted,
        };
        let (a, b, c) = ([counter("a", 5)], [counter("b", 5)], [counter("c", 7)]);
        let part = |id, counters| CallPart {
            id,
            provisional: false,
            counters,
        };
        let parts = [part("r1", &a[..]), part("r2", &c[..]), part("r3", &b[..])];
        let cmd = command(&SCRIPT, "p:", false, 0, &parts);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                ::redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect();
        // EVALSHA, the SHA, 4 keys (three counters and the node's clock), then ARGV.
        assert_eq!(args[2], "4");
        let argv = &args[7..];
        let shape = |limit: &'static str| ["0", "1", limit, "1000000", "1", "0", "0"];
        let mut want = vec!["3", "2", "0", "2"];
        want.extend(shape("5"));
        want.extend(shape("7"));
        want.extend(["r1", "1", "r2", "2", "r3", "1"]);
        assert_eq!(argv, want);
    }

    #[test]
    fn parse_checks_the_shape() {
        let key = crate::store::CounterKey::new("d", [], Duration::from_secs(1));
        let c = Counter {
            key,
            limit: 5,
            window: Duration::from_secs(1),
            hits: 1,
            shadow: false,
            precision: Precision::Exact,
            kind: crate::store::HitKind::Admitted,
        };
        let part = |id| CallPart {
            id,
            provisional: false,
            counters: std::slice::from_ref(&c),
        };
        let packed =
            |values: &[i64]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let answered = |values: &[i64], n: usize| -> Vec<Result<Reply, StoreError>> {
            let mut all = vec![1_800_000_000_000_000, 0];
            all.extend_from_slice(values);
            let parts: Vec<CallPart<'_>> = (0..n).map(|_| part("a")).collect();
            let answer = parse(&packed(&all), &parts).expect("parse");
            assert_eq!(answer.now, 1_800_000_000_000_000);
            answer.replies.expect("decided")
        };
        let decided = |values: &[i64], n: usize| -> Vec<Reply> {
            let replies: Result<Vec<Reply>, StoreError> = answered(values, n).into_iter().collect();
            replies.expect("every request decided")
        };
        let replies = decided(&[0, 1, 5, 300, 250, -1], 1);
        assert!(!replies[0].allowed);
        assert_eq!(replies[0].counters[0].result.remaining, 0);
        assert_eq!(
            replies[0].counters[0].one_hit_fits_in,
            Some(Duration::from_micros(250))
        );
        assert!(!replies[0].counters[0].provisional);
        assert_eq!(replies[0].counters[0].bucket, None);
        let replies = decided(&[0, 1, 5, 300, -2, -1, 1, 0, 2, 0, -1, 1_200_000], 2);
        assert!(replies[0].counters[0].provisional);
        assert_eq!(replies[0].counters[0].one_hit_fits_in, None);
        assert!(replies[1].allowed && replies[1].counters[0].result.remaining == 3);
        assert_eq!(replies[1].counters[0].bucket, Some(1_200_000));
        // A request the script failed on alone: an error for it, the other one decided.
        let replies = answered(&[2, 0, 0, 0, 0, 0, 1, 0, 2, 0, -1, -1], 2);
        assert!(
            matches!(replies[0], Err(StoreError::Backend(_))),
            "{replies:?}"
        );
        assert!(replies[1].as_ref().is_ok_and(|r| r.allowed));
        let expired = parse(&packed(&[7, 1]), &[part("a"), part("b")]).expect("expired");
        assert_eq!(
            expired,
            Answer {
                now: 7,
                replies: None
            }
        );
        assert!(parse(&packed(&[7, 0]), &[part("a")]).is_err());
        assert!(parse(&packed(&[7, 0, 1]), &[part("a")]).is_err());
        let one = packed(&[7, 0, 1, 0, 1, 0, -1, -1]);
        assert!(parse(&one, &[part("a"), part("b")]).is_err());
        assert!(parse(&one[..one.len() - 1], &[part("a")]).is_err());
        assert!(parse(&[], &[part("a")]).is_err());
    }
}
