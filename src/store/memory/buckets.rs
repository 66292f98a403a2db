//! The bounded representation of a memory-store counter: the window in buckets of fixed width.
//!
//! Bucket `i` holds the hits admitted in `[i * width, (i + 1) * width)`. At time `t` every bucket
//! that overlaps the window `(t - W, t]` counts, the oldest one whole: with `W = span * width`
//! those are the buckets `t / width - span ..= t / width`. Counting the partial oldest bucket
//! whole means a hit is counted for at least `W` (so no interval of length `W` holds more than the
//! limit) and at most `W + width` (so capacity comes back at most one width later than with the
//! exact log). Only buckets that hold hits are kept, at most `span + 1` of them: 16 bytes each,
//! whatever the limit and the traffic.

use std::collections::VecDeque;

use super::Series;
use crate::store::MAX_HELD;

/// The buckets of one counter. Times are microseconds on the store's clock.
#[derive(Debug)]
pub(super) struct Buckets {
    /// `(index, hits)` of the buckets holding hits, oldest first.
    counts: VecDeque<(u64, u64)>,
    /// Sum of the buckets' hits, so counting is O(1).
    hits: u64,
    /// Bucket width in microseconds (at least 1).
    width: u64,
    /// Buckets per window: the window is `span * width`.
    span: u64,
}

impl Buckets {
    /// Buckets of `width` for a window of `window` microseconds. A width that does not divide the
    /// window (never from validated rules) rounds the span up: stricter, never looser.
    pub(super) fn new(window: u64, width: u64) -> Buckets {
        let width = width.max(1);
        Buckets {
            counts: VecDeque::new(),
            hits: 0,
            width,
            span: window.div_ceil(width),
        }
    }

    /// The bucket width in microseconds.
    pub(super) fn width(&self) -> u64 {
        self.width
    }

    /// `(index, hits)` of the buckets holding hits, oldest first.
    pub(super) fn held(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().copied()
    }

    /// The first instant at which bucket `index` no longer overlaps the window.
    fn leaves_at(&self, index: u64) -> u64 {
        index
            .saturating_add(self.span)
            .saturating_add(1)
            .saturating_mul(self.width)
    }
}

impl Series for Buckets {
    fn trim(&mut self, now: u64) {
        let current = now / self.width;
        while let Some(&(index, hits)) = self.counts.front() {
            if index.saturating_add(self.span) >= current {
                break;
            }
            self.hits -= hits;
            self.counts.pop_front();
        }
    }

    fn hits(&self) -> u64 {
        self.hits
    }

    fn newest(&self) -> Option<u64> {
        self.counts.back().map(|&(index, _)| index * self.width)
    }

    fn record(&mut self, at: u64, hits: u64) -> u64 {
        let hits = hits.min(MAX_HELD);
        // Past MAX_HELD the oldest hits make room: the counter stays over every limit while it
        // holds that many, and the newest hits keep it so for the longest.
        let mut excess = (self.hits + hits).saturating_sub(MAX_HELD);
        while excess > 0 {
            let Some((_, held)) = self.counts.front_mut() else {
                break;
            };
            let take = excess.min(*held);
            *held -= take;
            self.hits -= take;
            excess -= take;
            if *held == 0 {
                self.counts.pop_front();
            }
        }
        if hits == 0 {
            return 0;
        }
        let index = at / self.width;
        self.hits += hits;
        match self.counts.back_mut() {
            Some((last, count)) if *last == index => *count += hits,
            _ => self.counts.push_back((index, hits)),
        }
        hits
    }

    fn take_back(&mut self, hits: u64) -> u64 {
        let mut left = hits;
        while left > 0 {
            let Some((_, held)) = self.counts.back_mut() else {
                break;
            };
            if *held <= left {
                left -= *held;
                self.counts.pop_back();
            } else {
                *held -= left;
                left = 0;
            }
        }
        self.hits -= hits - left;
        hits - left
    }

    fn when_dropped(&self, k: u64) -> Option<u64> {
        let mut seen = 0;
        for &(index, hits) in &self.counts {
            seen += hits; // at most MAX_HELD in all
            if seen >= k {
                return Some(self.leaves_at(index));
            }
        }
        None
    }

    fn oldest_leaves_at(&self) -> Option<u64> {
        self.counts.front().map(|&(index, _)| self.leaves_at(index))
    }

    fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    fn entries(&self) -> usize {
        self.counts.len()
    }

    fn heap_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    fn shrink(&mut self) {
        if self.counts.capacity() > 4 * self.counts.len().max(4) {
            self.counts.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_overlapping_bucket_counts_whole() {
        // A window of 100 in buckets of 10.
        let mut b = Buckets::new(100, 10);
        b.record(5, 3); // bucket 0
        b.record(57, 2); // bucket 5
        b.record(59, 1); // bucket 5
        assert_eq!((b.hits(), b.entries()), (6, 2));
        // At 109 the window (9, 109] still overlaps bucket 0; at 110 it does not.
        b.trim(109);
        assert_eq!(b.hits(), 6);
        assert_eq!(b.oldest_leaves_at(), Some(110));
        b.trim(110);
        assert_eq!(b.hits(), 3);
        assert_eq!(b.when_dropped(1), Some(160));
        assert_eq!(b.when_dropped(3), Some(160));
        assert_eq!(b.when_dropped(4), None);
        b.trim(160);
        assert!(b.is_empty());
    }
}
