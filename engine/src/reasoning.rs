//! Reasoning ("thinking") in a model's output: `<think>…</think>` is split out of the
//! answer, and whether a template is asked to think is decided in one place.
//!
//! Models that reason write their thoughts between `<think>` and `</think>` before
//! the answer; some templates open the tag in the generation prompt themselves (the
//! output then starts inside it). `ThinkSplit` takes the output as it is released and
//! yields reasoning and answer text; what could still be the start of a tag is held
//! back, so neither side ever shows a piece of one.

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// The rendered prompt ends inside an open `<think>`.
pub fn prompt_opens(prompt: &str) -> bool {
    prompt.rfind(OPEN).is_some_and(|o| prompt.rfind(CLOSE).is_none_or(|c| c < o))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

pub struct ThinkSplit {
    inside: bool,
    /// Nothing but whitespace has been released yet (a `<think>` may still open).
    at_start: bool,
    /// Just after `</think>`: the whitespace before the answer is not content.
    after_close: bool,
    held: String,
}

impl ThinkSplit {
    /// `inside`: the prompt opened `<think>` itself (`prompt_opens`), so the output
    /// starts as reasoning.
    pub fn new(inside: bool) -> Self {
        Self { inside, at_start: true, after_close: false, held: String::new() }
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.advance(&mut out, false);
        out
    }

    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        self.advance(&mut out, true);
        out
    }

    fn advance(&mut self, out: &mut Vec<Part>, last: bool) {
        loop {
            if !self.inside && self.at_start {
                // Only a `<think>` at the very start (after whitespace) opens reasoning.
                let trimmed = self.held.trim_start();
                if let Some(rest) = trimmed.strip_prefix(OPEN) {
                    self.held = rest.to_owned();
                    self.inside = true;
                    self.at_start = false;
                    continue;
                }
                if !last && (trimmed.is_empty() || OPEN.starts_with(trimmed)) {
                    return;
                }
                self.at_start = false;
            }
            if !self.inside {
                if self.after_close {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return;
                    }
                    self.held = rest.to_owned();
                    self.after_close = false;
                }
                emit(out, Part::Answer(std::mem::take(&mut self.held)));
                return;
            }
            if let Some(at) = self.held.find(CLOSE) {
                let thought: String = self.held.drain(..at + CLOSE.len()).collect();
                emit(out, Part::Reasoning(thought[..at].to_owned()));
                self.inside = false;
                self.after_close = true;
                continue;
            }
            let keep = if last { 0 } else { tail_prefix_len(&self.held, CLOSE) };
            let ready: String = self.held.drain(..self.held.len() - keep).collect();
            emit(out, Part::Reasoning(ready));
            return;
        }
    }
}

fn emit(out: &mut Vec<Part>, part: Part) {
    let empty = matches!(&part, Part::Reasoning(t) | Part::Answer(t) if t.is_empty());
    if empty {
        return;
    }
    match (out.last_mut(), part) {
        (Some(Part::Reasoning(a)), Part::Reasoning(b)) | (Some(Part::Answer(a)), Part::Answer(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

/// The longest tail of `s` that is a proper prefix of `pat`.
fn tail_prefix_len(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && pat.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// How hard a request asks the model to reason (OpenAI `reasoning_effort`, Responses
/// `reasoning.effort`, Anthropic `thinking`): `None` turns thinking off, any other
/// level on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effort {
    None,
    Minimal,
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "minimal" => Self::Minimal,
            "low" => Self::Low,
            "medium" => Self::Medium,
            "high" => Self::High,
            _ => return None,
        })
    }
}

/// `enable_thinking` for the template: an explicit `chat_template_kwargs.enable_thinking`
/// wins, then the request's effort, then the server's `--thinking`; `None` leaves the
/// template's own default.
pub fn enable_thinking(explicit: Option<bool>, effort: Option<Effort>, server: Option<bool>) -> Option<bool> {
    explicit.or(effort.map(|e| e != Effort::None)).or(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(prompt: &str, text: &str) -> (String, String) {
        let whole = {
            let mut s = ThinkSplit::new(prompt_opens(prompt));
            let mut parts = s.push(text);
            parts.extend(s.finish());
            parts
        };
        for size in 1..=6 {
            let mut s = ThinkSplit::new(prompt_opens(prompt));
            let mut parts = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for c in chars.chunks(size) {
                parts.extend(s.push(&c.iter().collect::<String>()));
            }
            parts.extend(s.finish());
            assert_eq!(join(&parts), join(&whole), "chunks of {size}");
        }
        join(&whole)
    }

    fn join(parts: &[Part]) -> (String, String) {
        let mut r = (String::new(), String::new());
        for p in parts {
            match p {
                Part::Reasoning(t) => r.0.push_str(t),
                Part::Answer(t) => r.1.push_str(t),
            }
        }
        r
    }

    #[test]
    fn splits_thoughts_from_the_answer() {
        assert_eq!(split_all("", "<think>\nIt is 4.\n</think>\n\nFour."), ("\nIt is 4.\n".into(), "Four.".into()));
        assert_eq!(split_all("", "  <think>a</think>b"), ("a".into(), "b".into()));
        assert_eq!(
            split_all("", "No thoughts. <think>x</think>"),
            (String::new(), "No thoughts. <think>x</think>".into())
        );
        assert_eq!(split_all("", "<thin"), (String::new(), "<thin".into()));
    }

    #[test]
    fn a_prompt_that_opens_the_tag_starts_inside() {
        assert_eq!(split_all("<|im_start|>assistant\n<think>\n", "hmm</think>Yes."), ("hmm".into(), "Yes.".into()));
        assert_eq!(split_all("<think>x</think> then", "plain"), (String::new(), "plain".into()));
        // Cut short while thinking: all of it is reasoning.
        assert_eq!(split_all("<think>", "still thinking </thi"), ("still thinking </thi".into(), String::new()));
    }

    #[test]
    fn precedence_of_thinking_controls() {
        assert_eq!(enable_thinking(Some(false), Some(Effort::High), Some(true)), Some(false));
        assert_eq!(enable_thinking(None, Some(Effort::None), Some(true)), Some(false));
        assert_eq!(enable_thinking(None, Some(Effort::Low), Some(false)), Some(true));
        assert_eq!(enable_thinking(None, None, Some(false)), Some(false));
        assert_eq!(enable_thinking(None, None, None), None);
        assert_eq!(Effort::parse("minimal"), Some(Effort::Minimal));
        assert_eq!(Effort::parse("extreme"), None);
    }
}
