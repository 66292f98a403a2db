//! The connection age: a gRPC connection older than `--grpc-max-connection-age` gets a GOAWAY,
//! its calls in flight finish, and it closes; one still open `--grpc-max-connection-age-grace`
//! later is closed anyway. Envoy keeps an HTTP/2 connection to a rate-limit service for as long
//! as it lives, so without this the replicas that start after a scale-out (or a rollout) get no
//! calls from the Envoys that were already connected; a GOAWAY makes each one reconnect, and the
//! new connection lands wherever the Service's balancing sends it. As grpc-go's server does
//! (and envoyproxy/ratelimit with it), each connection's age gets a random ±10 % so that the
//! connections made together do not all cycle together.

use std::pin::Pin;
use std::task::Context;
#[cfg(test)]
use std::task::Poll;
use std::time::Duration;

use rand::Rng as _;
use tokio::time::{Instant, Sleep};

/// What the age asks of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Aged {
    /// Old enough: send GOAWAY and close once the calls in flight end.
    GoAway,
    /// The grace after the GOAWAY is over: close now.
    Cut,
}

/// The deadlines of one connection; nothing when the age is zero (never).
pub(super) struct Age {
    next: Option<Pin<Box<Sleep>>>,
    grace: Duration,
    going_away: bool,
}

impl Age {
    pub(super) fn new(max_age: Duration, grace: Duration) -> Self {
        let next = (!max_age.is_zero()).then(|| {
            let jitter = rand::rng().random_range(0.9..=1.1);
            Box::pin(tokio::time::sleep(max_age.mul_f64(jitter)))
        });
        Age {
            next,
            grace,
            going_away: false,
        }
    }

    /// [`Aged::GoAway`] once, when the age is reached, then [`Aged::Cut`] when the grace ends.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Option<Aged> {
        let sleep = self.next.as_mut()?;
        if sleep.as_mut().poll(cx).is_pending() {
            return None;
        }
        if self.going_away {
            self.next = None;
            return Some(Aged::Cut);
        }
        self.going_away = true;
        let cut = Instant::now() + self.grace;
        sleep.as_mut().reset(cut);
        // Registers the waker for the grace's end.
        let _ = sleep.as_mut().poll(cx);
        Some(Aged::GoAway)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    async fn next(age: &mut Age) -> Aged {
        poll_fn(|cx| match age.poll(cx) {
            Some(aged) => Poll::Ready(aged),
            None => Poll::Pending,
        })
        .await
    }

    #[tokio::test]
    async fn goaway_within_ten_percent_of_the_age_then_cut_after_the_grace() {
        let start = Instant::now();
        let mut age = Age::new(Duration::from_millis(500), Duration::from_millis(200));
        assert_eq!(next(&mut age).await, Aged::GoAway);
        let at = start.elapsed();
        let window = Duration::from_millis(450)..Duration::from_millis(700);
        assert!(window.contains(&at), "{at:?}");
        assert_eq!(next(&mut age).await, Aged::Cut);
        let grace = start.elapsed() - at;
        let window = Duration::from_millis(200)..Duration::from_millis(400);
        assert!(window.contains(&grace), "{grace:?}");
    }

    #[test]
    fn zero_is_never() {
        assert!(
            Age::new(Duration::ZERO, Duration::from_secs(1))
                .next
                .is_none()
        );
    }
}
