//! A replica's health as data: what each observation (a periodic check, a request's
//! fate) does to it. Pure: the checker and the forwarder feed it, `now` comes in.
//!
//! | state | observation | next |
//! |---|---|---|
//! | any | check answered 200 | `up` |
//! | any | a request got a response head | `up` |
//! | any | connection refused (check or request) | `down` at once |
//! | `unknown`, `up` | another failure (timeout, broken exchange, check not 200) | `down` at the second in a row |
//! | `down` | another failure | `down` |
//!
//! `unknown` (before the first check) and `up` replicas take requests; `down` ones do not
//! until a check puts them back.

use std::time::Instant;

/// Failures in a row (other than a refused connection) that take a replica out.
pub const FALL: u32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Unknown,
    Up,
    Down,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Up => "up",
            State::Down => "down",
        }
    }
}

/// What was seen of a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The health check answered 200.
    CheckOk,
    /// A request got its response head (any status: the server answers).
    Answered,
    /// Nothing listens there (or the connect timed out).
    Refused(String),
    /// It was reached, but the exchange failed: a timeout, a broken connection, a check
    /// answered with another status.
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub state: State,
    /// Failures since the last success.
    pub fails: u32,
    pub last_error: Option<String>,
    /// When the state last changed.
    pub since: Instant,
}

impl Health {
    pub fn new(now: Instant) -> Self {
        Self { state: State::Unknown, fails: 0, last_error: None, since: now }
    }

    /// Whether requests may go there.
    pub fn usable(&self) -> bool {
        self.state != State::Down
    }

    /// Apply one observation; returns the state it left when it changed.
    pub fn on(&mut self, seen: Seen, now: Instant) -> Option<State> {
        let next = match seen {
            Seen::CheckOk | Seen::Answered => {
                self.fails = 0;
                State::Up
            }
            Seen::Refused(e) => {
                self.fails += 1;
                self.last_error = Some(e);
                State::Down
            }
            Seen::Failed(e) => {
                self.fails += 1;
                self.last_error = Some(e);
                if self.fails >= FALL { State::Down } else { self.state }
            }
        };
        if next == self.state {
            return None;
        }
        let from = std::mem::replace(&mut self.state, next);
        self.since = now;
        Some(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_table() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut h = Health::new(t0);
        assert!(h.usable() && h.state == State::Unknown);
        assert_eq!(h.on(Seen::CheckOk, t1), Some(State::Unknown));
        assert_eq!((h.state, h.since), (State::Up, t1));
        // One failure is not enough; the second in a row is.
        assert_eq!(h.on(Seen::Failed("timeout".into()), t1), None);
        assert!(h.usable());
        assert_eq!(h.on(Seen::Failed("timeout".into()), t1), Some(State::Up));
        assert!(!h.usable());
        assert_eq!(h.last_error.as_deref(), Some("timeout"));
        assert_eq!(h.on(Seen::Failed("again".into()), t1), None);
        // A check brings it back; a success resets the count.
        assert_eq!(h.on(Seen::CheckOk, t1), Some(State::Down));
        assert_eq!(h.on(Seen::Failed("x".into()), t1), None);
        assert_eq!(h.on(Seen::Answered, t1), None);
        assert_eq!(h.on(Seen::Failed("x".into()), t1), None, "the count started again");
        // A refused connection takes it out at once, from any state.
        assert_eq!(h.on(Seen::Refused("refused".into()), t1), Some(State::Up));
        let mut fresh = Health::new(t0);
        assert_eq!(fresh.on(Seen::Refused("refused".into()), t1), Some(State::Unknown));
        assert_eq!(fresh.on(Seen::Answered, t1), Some(State::Down));
        assert_eq!(fresh.state, State::Up);
    }
}
