//! The exact representation of a memory-store counter: the time of every hit in its window, as a
//! ring of packed runs (see the store's module docs for the layout and what it costs).

use std::collections::VecDeque;

use super::Series;
use crate::store::MAX_HELD;

const HIT_BITS: u32 = 12;
const MAX_RUN_HITS: u64 = 1 << HIT_BITS;
const MAX_TIME: u64 = (1 << (64 - HIT_BITS)) - 1;

/// Hits recorded in one microsecond: the time in the upper bits, `hits - 1` in the lower ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run(u64);

impl Run {
    /// `hits` must be in `1..=MAX_RUN_HITS`; `at` is capped to the representable range.
    fn new(at: u64, hits: u64) -> Run {
        debug_assert!((1..=MAX_RUN_HITS).contains(&hits));
        Run((at.min(MAX_TIME) << HIT_BITS) | (hits - 1))
    }

    pub(super) fn at(self) -> u64 {
        self.0 >> HIT_BITS
    }

    pub(super) fn hits(self) -> u64 {
        (self.0 & (MAX_RUN_HITS - 1)) + 1
    }
}

/// The sliding log of one counter.
#[derive(Debug)]
pub(super) struct Log {
    pub(super) runs: VecDeque<Run>,
    /// Sum of the runs' hits, so counting is O(1).
    hits: u64,
    /// The counter's window in microseconds, kept so a sweep can expire the log on its own.
    window: u64,
}

impl Log {
    pub(super) fn new(window: u64) -> Log {
        Log {
            runs: VecDeque::new(),
            hits: 0,
            window,
        }
    }

    /// Drops the runs that left the window `(now - window, now]`.
    fn trim(&mut self, now: u64) {
        while let Some(run) = self.runs.front() {
            if run.at().saturating_add(self.window) > now {
                break;
            }
            self.hits -= run.hits();
            self.runs.pop_front();
        }
    }

    fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    fn newest(&self) -> Option<u64> {
        self.runs.back().map(|r| r.at())
    }

    fn oldest(&self) -> Option<u64> {
        self.runs.front().map(|r| r.at())
    }

    /// Appends `hits` at `at` (never before the newest run), merging into the newest run when it
    /// has the same time. Past [`MAX_HELD`] hits in all, the oldest make room (the log stays over
    /// every limit either way). Returns the hits recorded.
    fn record(&mut self, at: u64, hits: u64) -> u64 {
        let recorded = hits.min(MAX_HELD);
        let mut excess = (self.hits + recorded).saturating_sub(MAX_HELD);
        while excess > 0 {
            let Some(first) = self.runs.front_mut() else {
                break;
            };
            let held = first.hits();
            let take = excess.min(held);
            self.hits -= take;
            excess -= take;
            if take == held {
                self.runs.pop_front();
            } else {
                *first = Run::new(first.at(), held - take);
            }
        }
        let mut hits = recorded;
        self.hits += hits;
        if let Some(last) = self.runs.back_mut()
            && last.at() == at.min(MAX_TIME)
        {
            let room = MAX_RUN_HITS - last.hits();
            let add = room.min(hits);
            *last = Run::new(at, last.hits() + add);
            hits -= add;
        }
        while hits > 0 {
            let add = hits.min(MAX_RUN_HITS);
            self.runs.push_back(Run::new(at, add));
            hits -= add;
        }
        recorded
    }

    /// Removes up to `hits` of the newest hits; returns how many it removed.
    fn take_back(&mut self, hits: u64) -> u64 {
        let mut left = hits;
        while left > 0 {
            let Some(last) = self.runs.back_mut() else {
                break;
            };
            let held = last.hits();
            if held <= left {
                self.runs.pop_back();
                left -= held;
            } else {
                *last = Run::new(last.at(), held - left);
                left = 0;
            }
        }
        self.hits -= hits - left;
        hits - left
    }

    /// The instant at which the oldest `k` hits will all have left the window, if the log holds
    /// that many.
    fn when_dropped(&self, k: u64) -> Option<u64> {
        let mut seen = 0;
        for run in &self.runs {
            seen += run.hits();
            if seen >= k {
                return Some(run.at().saturating_add(self.window));
            }
        }
        None
    }

    /// Bytes on the heap for the ring (not the map slot).
    fn heap_bytes(&self) -> usize {
        self.runs.capacity() * std::mem::size_of::<Run>()
    }

    /// Gives memory back after a burst once the log is much smaller than its ring.
    fn shrink(&mut self) {
        if self.runs.capacity() > 4 * self.runs.len().max(4) {
            self.runs.shrink_to_fit();
        }
    }
}

impl Series for Log {
    fn trim(&mut self, now: u64) {
        Log::trim(self, now)
    }
    fn hits(&self) -> u64 {
        self.hits
    }
    fn newest(&self) -> Option<u64> {
        Log::newest(self)
    }
    fn record(&mut self, at: u64, hits: u64) -> u64 {
        Log::record(self, at, hits)
    }
    fn take_back(&mut self, hits: u64) -> u64 {
        Log::take_back(self, hits)
    }
    fn when_dropped(&self, k: u64) -> Option<u64> {
        Log::when_dropped(self, k)
    }
    fn oldest_leaves_at(&self) -> Option<u64> {
        self.oldest().map(|o| o.saturating_add(self.window))
    }
    fn is_empty(&self) -> bool {
        Log::is_empty(self)
    }
    fn entries(&self) -> usize {
        self.runs.len()
    }
    fn heap_bytes(&self) -> usize {
        Log::heap_bytes(self)
    }
    fn shrink(&mut self) {
        Log::shrink(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_packs_time_and_hits() {
        let run = Run::new(123_456_789, 4096);
        assert_eq!((run.at(), run.hits()), (123_456_789, 4096));
        let run = Run::new(u64::MAX, 1);
        assert_eq!((run.at(), run.hits()), (MAX_TIME, 1));
    }

    #[test]
    fn log_merges_same_microsecond_and_splits_big_requests() {
        let mut log = Log::new(1_000);
        log.record(10, 3);
        log.record(10, 2);
        assert_eq!(log.runs.len(), 1);
        log.record(11, 10_000);
        assert_eq!(log.hits, 10_005);
        assert_eq!(log.runs.len(), 4); // 5 | 4096 4096 1808
        assert_eq!(log.when_dropped(5), Some(1_010));
        assert_eq!(log.when_dropped(6), Some(1_011));
        assert_eq!(log.when_dropped(10_006), None);
        log.trim(1_010);
        assert_eq!(log.hits, 10_000);
    }
}
