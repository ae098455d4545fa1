//! A count of work in progress that shutdown can wait on.
//!
//! Monitoring counters are not controls: a request is counted here from the moment it
//! is admitted until its last byte is out (or it is cut), and `wait_zero` wakes when the
//! last guard drops — no polling, and a deadline on every wait. Guards may be dropped on
//! any thread (the engine's generation thread drops them).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Gauge {
    n: AtomicUsize,
    zero: Notify,
}

/// One unit of work; dropping it ends the work.
#[derive(Debug)]
pub struct Guard(Arc<Gauge>);

impl Gauge {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn enter(self: &Arc<Self>) -> Guard {
        self.n.fetch_add(1, Ordering::SeqCst);
        Guard(self.clone())
    }

    pub fn get(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }

    /// Wait until nothing is in progress or `deadline` passes; returns whether it reached
    /// zero.
    pub async fn wait_zero(&self, deadline: Instant) -> bool {
        loop {
            let notified = self.zero.notified();
            tokio::pin!(notified);
            // Registered before the check, so a drop between the check and the await
            // still wakes us.
            notified.as_mut().enable();
            if self.get() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.get() == 0;
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.zero.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_last_guard_or_the_deadline() {
        let g = Gauge::new();
        assert!(g.wait_zero(Instant::now()).await, "nothing in progress");
        let a = g.enter();
        let b = g.enter();
        assert_eq!(g.get(), 2);
        let start = Instant::now();
        assert!(!g.wait_zero(start + Duration::from_secs(5)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(5), "gave up exactly at the deadline");
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.wait_zero(Instant::now() + Duration::from_secs(60)).await })
        };
        drop(a);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "one guard is still held");
        let t = Instant::now();
        std::thread::spawn(move || drop(b)).join().unwrap();
        assert!(waiter.await.unwrap());
        assert!(t.elapsed() < Duration::from_secs(1), "woken by the drop, not by a timer");
    }
}
