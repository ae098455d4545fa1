//! `ModelId`: the name a request's `model` field routes by.
//!
//! Ids end up in file names (sockets, cache directories) and log fields, so they are
//! validated once here: bounded length, a conservative charset, no path components.

use std::fmt;

/// Longest accepted id, in bytes.
pub const MAX_MODEL_ID_LEN: usize = 128;

/// A validated model id (`[A-Za-z0-9._:-]`, not starting with `.` or `-`, no `..`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelIdError {
    #[error("model id is empty")]
    Empty,
    #[error("model id is longer than {MAX_MODEL_ID_LEN} bytes")]
    TooLong,
    #[error("model id {id:?} contains {ch:?}; allowed are letters, digits and . _ : -")]
    BadChar { id: String, ch: char },
    #[error("model id {0:?} must not start with '.' or '-' or contain '..'")]
    BadShape(String),
}

impl ModelId {
    pub fn new(id: impl Into<String>) -> Result<Self, ModelIdError> {
        let id = id.into();
        if id.is_empty() {
            return Err(ModelIdError::Empty);
        }
        if id.len() > MAX_MODEL_ID_LEN {
            return Err(ModelIdError::TooLong);
        }
        if let Some(ch) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))) {
            return Err(ModelIdError::BadChar { id, ch });
        }
        if id.starts_with('.') || id.starts_with('-') || id.contains("..") {
            return Err(ModelIdError::BadShape(id));
        }
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The file name of the socket of this model's `generation`-th engine: short (unix
    /// socket paths are limited to ~104 bytes) and derived from a hash, never from the
    /// raw id.
    pub fn socket_name(&self, generation: u64) -> String {
        let h = self.0.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193));
        format!("e-{h:08x}-{generation}.sock")
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_file_stems() {
        for ok in ["SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m", "qwen3:8b", "a"] {
            assert_eq!(ModelId::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_paths_and_junk() {
        assert_eq!(ModelId::new(""), Err(ModelIdError::Empty));
        assert!(matches!(ModelId::new("a/b"), Err(ModelIdError::BadChar { ch: '/', .. })));
        assert!(matches!(ModelId::new("a\\b"), Err(ModelIdError::BadChar { .. })));
        assert!(matches!(ModelId::new("x y"), Err(ModelIdError::BadChar { .. })));
        assert!(matches!(ModelId::new(".hidden"), Err(ModelIdError::BadShape(_))));
        assert!(matches!(ModelId::new("-flag"), Err(ModelIdError::BadShape(_))));
        assert!(matches!(ModelId::new("a..b"), Err(ModelIdError::BadShape(_))));
        assert_eq!(ModelId::new("x".repeat(MAX_MODEL_ID_LEN + 1)), Err(ModelIdError::TooLong));
        assert!(ModelId::new("x".repeat(MAX_MODEL_ID_LEN)).is_ok());
    }

    #[test]
    fn socket_names_are_short_and_per_generation() {
        let id = ModelId::new("x".repeat(MAX_MODEL_ID_LEN)).unwrap();
        assert!(id.socket_name(u64::MAX).len() < 40);
        assert_ne!(id.socket_name(1), id.socket_name(2));
        assert_eq!(ModelId::new("a").unwrap().socket_name(3), "e-e40c292c-3.sock");
    }
}
