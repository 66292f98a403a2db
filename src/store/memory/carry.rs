//! Carrying a memory-store counter across a change of representation.
//!
//! A counter's key does not name its representation, so after a reload that changes a limit's
//! precision (or a limit override asks for another) the counter found under the key may be a log
//! where buckets are asked for, or buckets of another width. The decision that finds it so
//! rebuilds it in the asked form from its hits, conservatively: a log's hit stays at its time, a
//! bucket's hits are placed at the bucket's last microsecond or the counter's "now", whichever is
//! earlier (the latest they can have been admitted), and each goes to the bucket of that instant.
//! Never later than "now": a hit placed ahead would move the counter's clock on (it keeps to its
//! newest hit) and free other hits early. So no hit leaves earlier than it really would have, and the guarantee (no interval of length `W` holds more than `N` admitted
//! hits) holds across the change; a limit lowered below what the counter holds keeps denying
//! until enough has left.

use super::{Counter, Tally, micros};
use crate::store::form::log_held_max;
use crate::store::{HitKind, LOG_RECORD_MAX, Precision};

impl Tally {
    /// This counter in the representation `counter` asks for: as it is when it already has it,
    /// else rebuilt from its hits (see the module docs), the store's clock showing `now`. Buckets
    /// holding more than [`LOG_RECORD_MAX`] hits stay buckets where a log is asked for, and a log
    /// that a charge would take past [`log_held_max`] goes into buckets ([`Precision::for_debt`]).
    pub(super) fn conform(&mut self, counter: &Counter, now: u64) -> &mut Tally {
        let wanted = match counter.precision {
            Precision::Buckets(width) if !width.is_zero() => Some(micros(width)),
            _ => None,
        };
        let has = match self {
            Tally::Log(_) => None,
            Tally::Buckets(buckets) => Some(buckets.width()),
        };
        // A counter holding more than a log records at once stays in buckets until it holds
        // fewer (see `store::form`): carried into a log, a debt would cost an entry per hit.
        let stays = wanted.is_none() && self.series().hits() > LOG_RECORD_MAX;
        if wanted != has && !stays {
            self.carry(counter.precision, counter.window, now);
        } else if has.is_none() && counter.kind == HitKind::Charged {
            // Not after a carry back into a log: that holds at most `LOG_RECORD_MAX`, and a charge
            // kept in a log at most as many (`store::form`), so it could not pass the bound (the
            // script checks after it too, and finds the same).
            let upto = now.max(self.series().newest().unwrap_or(0));
            self.series_mut().trim(upto);
            let held = self.series().hits().saturating_add(counter.hits);
            if held > log_held_max(counter.limit) {
                self.carry(Precision::for_debt(counter.window), counter.window, now);
            }
        }
        self
    }

    /// Rebuilds this counter as `precision` from its hits (see the module docs).
    fn carry(&mut self, precision: Precision, window: std::time::Duration, now: u64) {
        let upto = now.max(self.series().newest().unwrap_or(0));
        let mut carried = Tally::of(precision, window);
        let series = carried.series_mut();
        for (at, hits) in self.latest_instants() {
            series.record(at.min(upto), hits);
        }
        *self = carried;
    }

    /// The hits held, each at the latest instant it can have been admitted, oldest first.
    fn latest_instants(&self) -> Vec<(u64, u64)> {
        match self {
            Tally::Log(log) => log.runs.iter().map(|r| (r.at(), r.hits())).collect(),
            Tally::Buckets(buckets) => {
                let width = buckets.width();
                buckets
                    .held()
                    .map(|(index, hits)| ((index + 1).saturating_mul(width) - 1, hits))
                    .collect()
            }
        }
    }
}
