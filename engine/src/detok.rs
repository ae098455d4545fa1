//! Incremental detokenization: token bytes in, valid UTF-8 text out. A multi-byte
//! character split across tokens is held back until it completes; bytes that can never
//! form a character become U+FFFD. Never emits broken UTF-8.

#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes; return the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` is valid UTF-8 by definition.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// End of stream: whatever is left is an incomplete character.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            char::REPLACEMENT_CHARACTER.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_split_characters() {
        let mut d = Utf8Stream::new();
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(d.push(b"a"), "a");
        assert_eq!(d.push(&euro[..1]), "");
        assert_eq!(d.push(&euro[1..2]), "");
        assert_eq!(d.push(&euro[2..]), "€");
        let crab = "🦀".as_bytes();
        assert_eq!(d.push(&[b'x', crab[0], crab[1]]), "x");
        assert_eq!(d.push(&[crab[2], crab[3], b'y']), "🦀y");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn replaces_invalid_bytes() {
        let mut d = Utf8Stream::new();
        assert_eq!(d.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
        assert_eq!(d.push(&[0xe2, 0x82]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
