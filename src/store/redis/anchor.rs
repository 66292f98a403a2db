//! A timer kept pending on each worker thread that calls the store, so that arming a call's
//! deadline costs no system call.
//!
//! tokio's timer driver unparks itself whenever a timer is registered that expires before the
//! driver's next planned wake-up, or when it has none planned: on a worker's single-threaded
//! runtime that is a write to the runtime's eventfd and one more trip through `epoll_wait`, even
//! when the timer is armed on the runtime's own thread. Every Redis call arms its deadline
//! (`--redis-timeout`), and a worker that had just answered everything had no timer pending, so
//! under load about one call in four paid that write (docs/benchmarks.md, *Redis store: kernel
//! time per call*). An anchor, a timer that is always pending and always expires before any call's
//! deadline would (half the timeout away), keeps the driver's next wake-up earlier than every
//! deadline armed after it. It wakes its worker twice per timeout, and stops once the thread has
//! decided no request for [`IDLE`], so an idle server stays idle (the health check's pings start
//! none); the next request starts it again.

use std::cell::Cell;
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};

/// How long an anchor keeps ticking without a decision on its thread.
const IDLE: Duration = Duration::from_secs(1);

thread_local! {
    /// Decisions asked on this thread (wrapping).
    static CALLS: Cell<u64> = const { Cell::new(0) };
    /// Whether this thread has an anchor (or cannot have one: not a single-threaded runtime).
    static ANCHORED: Cell<bool> = const { Cell::new(false) };
}

/// Notes a decision asked on this thread, whose deadline is `timeout` away, and starts the thread's
/// anchor if it has none. Only on a single-threaded runtime: a multi-threaded one may run the
/// anchor on another thread than the calls it is meant for.
pub(super) fn call(timeout: Duration) {
    call_with(timeout, IDLE);
}

fn call_with(timeout: Duration, idle: Duration) {
    let _ = CALLS.try_with(|calls| calls.set(calls.get().wrapping_add(1)));
    if ANCHORED
        .try_with(|anchored| anchored.replace(true))
        .unwrap_or(true)
    {
        return;
    }
    let Ok(runtime) = Handle::try_current() else {
        let _ = ANCHORED.try_with(|anchored| anchored.set(false));
        return;
    };
    if runtime.runtime_flavor() == RuntimeFlavor::CurrentThread {
        runtime.spawn(anchor((timeout / 2).max(Duration::from_millis(1)), idle));
    }
}

/// Ticks every `period` until its thread has asked no decision for `idle`.
async fn anchor(period: Duration, idle: Duration) {
    /// Lets the thread start another anchor once this one ends, or is dropped with its runtime.
    struct Unanchor;
    impl Drop for Unanchor {
        fn drop(&mut self) {
            let _ = ANCHORED.try_with(|anchored| anchored.set(false));
        }
    }
    let _unanchor = Unanchor;
    let calls = || CALLS.try_with(Cell::get).unwrap_or(0);
    let idle_ticks = (idle.as_micros() / period.as_micros().max(1)).max(1);
    let (mut seen, mut quiet) = (calls(), 0);
    while quiet < idle_ticks {
        tokio::time::sleep(period).await;
        let now = calls();
        if now == seen {
            quiet += 1;
        } else {
            (seen, quiet) = (now, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchored() -> bool {
        ANCHORED.with(Cell::get)
    }

    /// One anchor per thread while calls come; it ends once they stop for `idle`, and the next
    /// call starts another. (Real time, with margins of several ticks.)
    #[tokio::test]
    async fn one_anchor_per_thread_while_calls_come() {
        let (timeout, idle) = (Duration::from_millis(10), Duration::from_millis(50));
        call_with(timeout, idle);
        assert!(anchored(), "the first call starts the anchor");
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            call_with(timeout, idle);
            assert!(anchored(), "an anchor runs while calls come");
        }
        tokio::time::sleep(idle * 4).await;
        assert!(
            !anchored(),
            "no call for four times `idle`: the anchor has ended"
        );
        call_with(timeout, idle);
        assert!(anchored(), "the next call starts another");
    }
}
