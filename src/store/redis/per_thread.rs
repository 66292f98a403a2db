//! One Redis connection per thread that calls the store.
//!
//! slidegate serves calls on several worker threads, each with a single-threaded runtime (see
//! `slidegate::server`). A redis-rs connection runs a driver task on the runtime that first
//! used it; a call from another thread then costs two cross-thread wake-ups (request to the
//! driver, reply back), more than the call's own work. So the store keeps one connection per
//! thread: each is connected lazily, on first use, by the thread that will use it, and its
//! driver lives on that thread's runtime. Requests of one thread still share one pipelined
//! connection.
//!
//! Threads get a sequential slot the first time they call any store; a store with N
//! connections gives slot `s` connection `s % N`. Threads that share a connection (more threads
//! than connections) stay correct, only slower.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `count` values (at least one), one per calling thread as far as they go.
pub struct PerThread<T>(Vec<T>);

impl<T> PerThread<T> {
    pub fn new<E>(count: usize, make: impl FnMut() -> Result<T, E>) -> Result<Self, E> {
        let values = std::iter::repeat_with(make).take(count.max(1));
        Ok(PerThread(values.collect::<Result<_, E>>()?))
    }

    /// The calling thread's value.
    pub fn get(&self) -> &T {
        &self.0[thread_slot() % self.0.len()]
    }
}

/// The calling thread's slot, assigned on its first call.
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|slot| *slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_keeps_its_value_and_threads_spread_over_all() {
        let values = std::sync::Arc::new(
            PerThread::new(3, {
                let mut n = 0;
                move || {
                    n += 1;
                    Ok::<_, ()>(n)
                }
            })
            .expect("values"),
        );
        let here = *values.get();
        assert_eq!(*values.get(), here, "a thread always gets the same value");
        // Slots are handed out in order, so 30 new threads cover every value (even if tests on
        // other threads take slots in between).
        let mut seen: Vec<i32> = (0..30)
            .map(|_| {
                let values = std::sync::Arc::clone(&values);
                std::thread::spawn(move || *values.get())
                    .join()
                    .expect("thread")
            })
            .collect();
        seen.push(here);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![1, 2, 3], "new threads use every value");
    }
}
