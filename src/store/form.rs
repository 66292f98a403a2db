//! The representation a counter is decided in, for one request. Both stores ask this module, so
//! they decide every request in the same forms.
//!
//! A counter's representation is its limit's [`Precision`], with two exceptions:
//! - **A charge too large for a log** is recorded in buckets ([`Precision::for_debt`]): a charged
//!   counter kept as the exact log whose hits exceed its limit or [`LOG_RECORD_MAX`]. A log holds
//!   one entry per hit (one Redis member each), so it could not keep such a debt whole; buckets
//!   keep any charge as one number, and so the whole debt denies for as long as it stays in the
//!   window, whatever a later reload makes of the limit. The counter is carried into buckets
//!   (its hits kept), and the next decision that asks for the log carries it back once it holds
//!   at most [`LOG_RECORD_MAX`] hits; until then it is decided as those buckets.
//! - **A log that charges would take past [`log_held_max`]** is carried into those buckets by the
//!   store when the charge comes (charges land over the limit, one entry each, so without this
//!   a log's size would follow the charged traffic rather than its limit), and stays there as
//!   above. Every hit is kept, as a count. The bound is more than a log carried back may hold by
//!   [`LOG_RECORD_MAX`], so a counter moves between the forms at most once per that many hits.
//! - **A counter named twice in one request in two representations** (a rule and a limit override
//!   on the same entries and window share one counter) is decided in the coarser of them for
//!   the whole request: buckets over the log, wider buckets over narrower ones. Buckets count the
//!   oldest bucket whole, so the coarser form is the stricter one; and one form per counter is what
//!   lets the request be decided as one log (each occurrence sees the hits the earlier ones add).

use std::borrow::Cow;
use std::time::Duration;

use super::{Counter, HitKind, MAX_HITS, Precision};
use crate::Scratch;

/// The most hits a log records at once, and the most a counter kept in buckets may hold to be
/// carried back into a log (`--max-hits`' default; `LOG_CARRY_MAX` in
/// `sliding_window/2_carry.lua`).
pub const LOG_RECORD_MAX: u64 = 4096;

/// The most hits a counter kept as the exact log holds after a charge: its limit (what admitted
/// hits alone can fill) or [`LOG_RECORD_MAX`], whichever is more, and [`LOG_RECORD_MAX`] over it.
/// A charge that would take the log past it carries the log into buckets
/// ([`Precision::for_debt`]); `log_held_max` in `sliding_window/2_carry.lua` is the same. Checked
/// at a key's first naming in a request, so a request naming it again may add its hits past it.
pub fn log_held_max(limit: u64) -> u64 {
    limit.max(LOG_RECORD_MAX).saturating_add(LOG_RECORD_MAX)
}

impl Precision {
    /// The buckets a counter of `window` takes to hold a debt: the automatic width (a sixtieth or
    /// a fiftieth of the window), or the whole window as one bucket where neither divides it.
    pub fn for_debt(window: Duration) -> Precision {
        match Precision::automatic(u64::MAX, window) {
            Precision::Exact => Precision::Buckets(window.max(Duration::from_micros(1))),
            buckets => buckets,
        }
    }

    /// Orders representations from the finest (the log) to the coarsest (the widest buckets).
    fn coarseness(self) -> Duration {
        self.bucket_width().unwrap_or(Duration::ZERO)
    }
}

/// The representation `counter` is recorded in on its own: its precision, or buckets for a charge
/// too large for a log (see the module docs).
pub fn own_form(counter: &Counter) -> Precision {
    recorded_in(
        counter.precision,
        counter.kind,
        counter.limit,
        counter.window,
        counter.hits,
    )
}

/// The representation `hits` of `kind` on a counter of `limit` per `window` kept with `precision`
/// are recorded in: [`own_form`] before the counter is built (the limiter's budget needs it).
pub fn recorded_in(
    precision: Precision,
    kind: HitKind,
    limit: u64,
    window: Duration,
    hits: u64,
) -> Precision {
    match precision {
        Precision::Exact if kind == HitKind::Charged && hits > limit.min(LOG_RECORD_MAX) => {
            Precision::for_debt(window)
        }
        precision => precision,
    }
}

/// `counters` as a store decides them: each one's precision set to the form it is decided in (see
/// the module docs) and its hits capped at [`MAX_HITS`]; borrowed as they are in the usual case,
/// where nothing changes.
pub fn decided_forms(counters: &[Counter]) -> Cow<'_, [Counter]> {
    // The usual request: every counter in one precision, its own, within the cap. Nothing to
    // compare, nothing to build.
    let one = counters.first().map(|c| c.precision);
    let as_asked =
        |c: &Counter| Some(c.precision) == one && c.hits <= MAX_HITS && own_form(c) == c.precision;
    if counters.iter().all(as_asked) {
        return Cow::Borrowed(counters);
    }
    let own: Scratch<Precision> = counters.iter().map(own_form).collect();
    let forms: Scratch<Precision> = counters
        .iter()
        .zip(&own)
        .map(|(counter, &form)| {
            counters
                .iter()
                .zip(&own)
                .filter(|&(other, &f)| {
                    f.coarseness() > form.coarseness() && other.key == counter.key
                })
                .map(|(_, &f)| f)
                .max_by_key(|f| f.coarseness())
                .unwrap_or(form)
        })
        .collect();
    let unchanged = |(c, &f): (&Counter, &Precision)| c.precision == f && c.hits <= MAX_HITS;
    if counters.iter().zip(&forms).all(unchanged) {
        return Cow::Borrowed(counters);
    }
    Cow::Owned(
        counters
            .iter()
            .zip(&forms)
            .map(|(c, &precision)| Counter {
                precision,
                hits: c.hits.min(MAX_HITS),
                ..c.clone()
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CounterKey;

    const MINUTE: Duration = Duration::from_secs(60);

    fn counter(name: &str, limit: u64, precision: Precision, kind: HitKind, hits: u64) -> Counter {
        Counter {
            key: CounterKey::new("d", [("k", name)], MINUTE),
            limit,
            window: MINUTE,
            hits,
            shadow: false,
            precision,
            kind,
        }
    }

    #[test]
    fn a_charge_larger_than_its_log_goes_to_buckets() {
        let second = Precision::Buckets(Duration::from_secs(1));
        let exact = |hits| counter("a", 10, Precision::Exact, HitKind::Charged, hits);
        assert_eq!(own_form(&exact(10)), Precision::Exact);
        assert_eq!(own_form(&exact(11)), second);
        assert_eq!(own_form(&exact(u64::MAX)), second);
        let large = counter("a", 5000, Precision::Exact, HitKind::Charged, 4097);
        assert_eq!(own_form(&large), second);
        // Admitted hits over the limit are never recorded: their form is the limit's.
        let admitted = counter("a", 10, Precision::Exact, HitKind::Admitted, 11);
        assert_eq!(own_form(&admitted), Precision::Exact);
        // A window no sixtieth or fiftieth of which is a whole microsecond: one bucket.
        let odd = Duration::from_micros(7);
        assert_eq!(Precision::for_debt(odd), Precision::Buckets(odd));
    }

    #[test]
    fn a_counter_named_twice_takes_the_coarser_form() {
        let second = Precision::Buckets(Duration::from_secs(1));
        let wide = Precision::Buckets(Duration::from_secs(6));
        let rule = counter("a", 5, Precision::Exact, HitKind::Admitted, 1);
        let other = counter("b", 5, Precision::Exact, HitKind::Admitted, 1);
        let over = counter("a", 1000, second, HitKind::Admitted, 1);
        let widest = counter("a", 10_000, wide, HitKind::Admitted, 1);
        let plain = [rule.clone(), other.clone()];
        assert!(matches!(decided_forms(&plain), Cow::Borrowed(_)));
        let forms = |cs: &[Counter]| -> Vec<Precision> {
            decided_forms(cs).iter().map(|c| c.precision).collect()
        };
        assert_eq!(
            forms(&[rule.clone(), other.clone(), over.clone()]),
            [second, Precision::Exact, second]
        );
        assert_eq!(forms(&[over.clone(), rule.clone()]), [second, second]);
        assert_eq!(forms(&[rule, over, widest]), [wide, wide, wide]);
    }
}
