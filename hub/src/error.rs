//! Why a pull failed, each with what a person needs to act on it. Causes are part of
//! the message (fields named `cause`, not `source`), so they are said once.

use std::path::PathBuf;

use crate::choose::ChooseError;
use crate::repo::NameError;
use crate::transfer::{NoSpace, ReplyError};

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Choose(#[from] ChooseError),
    #[error(transparent)]
    Space(#[from] NoSpace),
    #[error("bad endpoint {endpoint:?} (HF_ENDPOINT): {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("{status} from {url}{}: {}", said(.message), auth_hint(.repo, .page, *.token_sent))]
    Auth { status: u16, url: String, repo: String, page: String, token_sent: bool, message: Option<String> },
    #[error("not found on the hub: {url}{}", said(.message))]
    NotFound { url: String, message: Option<String> },
    #[error("{status} from {url}{}", said(.message))]
    Status { status: u16, url: String, message: Option<String> },
    #[error("cannot reach {url}: {cause}")]
    Transport { url: String, cause: Box<ureq::Error> },
    #[error("the hub's answer for {url} is unusable: {reason}")]
    Answer { url: String, reason: String },
    #[error("downloading {url}: {cause}")]
    Reply { url: String, cause: ReplyError },
    #[error(
        "download interrupted at byte {got} of {size} ({cause}); the partial file {} is kept: run the same command again to resume",
        .partial.display()
    )]
    Interrupted { got: u64, size: u64, partial: PathBuf, cause: std::io::Error },
    #[error("the server sent more than the {size} bytes the hub announced; the partial file was deleted")]
    TooLong { size: u64 },
    #[error(
        "checksum mismatch for {file}: the hub says sha256 {expected}, the downloaded bytes hash to {got}; the partial file was deleted"
    )]
    Checksum { file: String, expected: String, got: String },
    #[error("another download of this file is in progress (lock {} is held)", .lock.display())]
    Busy { lock: PathBuf },
    #[error("{op} {}: {cause}", .path.display())]
    Io { op: &'static str, path: PathBuf, cause: std::io::Error },
}

impl HubError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |cause| Self::Io { op, path, cause }
    }
}

fn said(m: &Option<String>) -> String {
    m.as_ref().map(|m| format!(" ({m})")).unwrap_or_default()
}

fn auth_hint(repo: &str, page: &str, token_sent: bool) -> String {
    let who = if token_sent {
        "the token sent (HF_TOKEN, or the one `hf auth login` saved) was refused or has no access to it"
    } else {
        "no token was sent: set HF_TOKEN=hf_… or run `hf auth login`"
    };
    format!(
        "the repository {repo} does not exist, is private, or is gated; {who}. A gated model's terms must be accepted on its page ({page}) with the account of the token"
    )
}
