//! Names on the hub — a repository id (`org/name`), a revision, a file's path inside a
//! repository — validated once, because each of them becomes part of a URL and of a
//! path in the cache. A hostile or broken endpoint must not be able to name a path
//! outside the cache, so the same rules apply to names the hub sends back.

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("{0:?} is not a repository id: expected ORG/NAME, e.g. bartowski/SmolLM2-135M-Instruct-GGUF")]
    Repo(String),
    #[error("{0:?} is not a revision (a branch, a tag or a commit)")]
    Revision(String),
    #[error("{0:?} is not a file path inside a repository")]
    Path(String),
}

/// A model repository: `org/name`. Both parts follow the hub's rules: letters, digits,
/// `-`, `_`, `.`, at most 96 characters, not starting or ending with `-` or `.`, no
/// `--` or `..` (which is what makes the cache folder `models--org--name` reversible).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoId {
    org: String,
    name: String,
}

impl RepoId {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let bad = || NameError::Repo(s.to_owned());
        let (org, name) = s.split_once('/').ok_or_else(bad)?;
        if !valid_part(org) || !valid_part(name) {
            return Err(bad());
        }
        Ok(Self { org: org.to_owned(), name: name.to_owned() })
    }

    pub fn org(&self) -> &str {
        &self.org
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.org, self.name)
    }
}

fn valid_part(p: &str) -> bool {
    let edge = |c: char| c == '-' || c == '.';
    !p.is_empty()
        && p.len() <= 96
        && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !p.starts_with(edge)
        && !p.ends_with(edge)
        && !p.contains("--")
        && !p.contains("..")
}

/// A branch, tag or commit. It names a file under `refs/` in the cache (a branch may
/// hold `/`, e.g. `refs/pr/1`), so no empty or dot-only components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revision(String);

impl Revision {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.len() > 255 || s.chars().any(|c| c.is_control() || c.is_whitespace() || c == '\\') || !clean_segments(s) {
            return Err(NameError::Revision(s.to_owned()));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A full commit id: the hub resolves nothing, and the cache keeps no ref for it.
    pub fn is_commit(&self) -> bool {
        is_commit(&self.0)
    }
}

impl Default for Revision {
    fn default() -> Self {
        Self("main".to_owned())
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A git commit id as the hub sends it (`X-Repo-Commit`, `sha`): 40 lowercase hex digits
/// (64 for SHA-256 repositories). It names a snapshot folder.
pub fn is_commit(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A file's path inside a repository: `/`-separated, relative, no `.` or `..` parts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoPath(String);

impl RepoPath {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.len() > 1024 || s.chars().any(|c| c.is_control() || c == '\\') || !clean_segments(s) {
            return Err(NameError::Path(s.to_owned()));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last component: the file's name.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// Folders above the file (0 for a file at the top of the repository).
    pub fn depth(&self) -> usize {
        self.0.matches('/').count()
    }
}

impl fmt::Display for RepoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn clean_segments(s: &str) -> bool {
    !s.is_empty() && s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// Percent-encodes everything but RFC 3986's unreserved characters (and `/` when
/// `keep_slash`): a revision is one URL segment (`refs%2Fpr%2F1`), a file path several.
pub fn url_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_follow_the_hub_rules() {
        let r = RepoId::parse("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF").unwrap();
        assert_eq!((r.org(), r.name()), ("HuggingFaceTB", "SmolLM2-135M-Instruct-GGUF"));
        assert_eq!(r.to_string(), "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF");
        assert!(RepoId::parse("Qwen/Qwen2.5-0.5B-Instruct-GGUF").is_ok());
        for bad in ["gpt2", "a/b/c", "/b", "a/", "a b/c", "a/b--c", "a/..", "a/-b", "a/b.", "../b", "a/b?x", "a/b%2F"] {
            assert!(RepoId::parse(bad).is_err(), "{bad}");
        }
        assert!(RepoId::parse(&format!("a/{}", "x".repeat(97))).is_err());
    }

    #[test]
    fn revisions_and_paths_name_nothing_outside_their_folder() {
        assert_eq!(Revision::default().as_str(), "main");
        assert!(Revision::parse("refs/pr/1").is_ok());
        assert!(Revision::parse("v1.0").is_ok());
        for bad in ["", "..", "a/../b", "/abs", "a//b", "a\\b", "a/"] {
            assert!(Revision::parse(bad).is_err(), "{bad:?}");
            assert!(RepoPath::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Revision::parse("a b").is_err());
        assert!(RepoPath::parse("a b.gguf").is_ok(), "files may have spaces");
        let c = "0123456789abcdef0123456789abcdef01234567";
        assert!(Revision::parse(c).unwrap().is_commit());
        assert!(!Revision::parse("main").unwrap().is_commit());
        assert!(!is_commit(&c.to_uppercase()));
        assert!(!is_commit("abc"));

        let p = RepoPath::parse("q4/model-Q4_K_M.gguf").unwrap();
        assert_eq!((p.file_name(), p.depth()), ("model-Q4_K_M.gguf", 1));
        assert_eq!(RepoPath::parse("m.gguf").unwrap().depth(), 0);
        assert!(RepoPath::parse("a\nb").is_err());
    }

    #[test]
    fn url_encoding_keeps_unreserved_characters() {
        assert_eq!(url_encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(url_encode("q4/a b+c.gguf", true), "q4/a%20b%2Bc.gguf");
        assert_eq!(url_encode("ü", true), "%C3%BC");
        assert_eq!(url_encode("A-z_0.9~", false), "A-z_0.9~");
    }
}
