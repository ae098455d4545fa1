//! Stop strings matched on decoded text. Text that could still be the start of a stop
//! string is held back, so a stop split across tokens is found and never emitted; the
//! text before the stop is emitted and generation ends.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: Option<String>,
}

pub enum StopScan {
    /// Emit this text and keep going.
    Continue(String),
    /// Emit this text (the part before the stop string) and finish.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), matched: None }
    }

    pub fn push(&mut self, text: &str) -> StopScan {
        if self.stops.is_empty() {
            return StopScan::Continue(text.to_owned());
        }
        self.held.push_str(text);
        // Earliest full match wins.
        if let Some((at, stop)) =
            self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s))).min_by_key(|m| m.0)
        {
            let out = self.held[..at].to_owned();
            self.matched = Some(stop.clone());
            self.held.clear();
            return StopScan::Stopped(out);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let keep = self.stops.iter().map(|s| longest_suffix_prefix(&self.held, s)).max().unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        StopScan::Continue(out)
    }

    /// The stop string that ended generation, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// End of generation for another reason: release held text.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of `stop`,
/// cut on a char boundary.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.as_bytes().starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopScan::Continue(t) => out.push_str(&t),
                StopScan::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stop_across_token_boundaries_is_not_emitted() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn false_starts_are_released() {
        assert_eq!(run(&["END"], &["hello E", "N", "x"]), ("hello ENx".into(), false));
        assert_eq!(run(&["END"], &["EN"]), ("EN".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "abc"], &["xxab", "c"]), ("xxa".into(), true));
        assert_eq!(run(&[], &["anything"]), ("anything".into(), false));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&["éx"], &["café", "y"]), ("caféy".into(), false));
    }
}
