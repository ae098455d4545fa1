//! The decisions of a download, as plain functions of numbers and header values: where
//! to start given a partial file, whether a reply continues it, and whether the disk has
//! room. The I/O that follows them is in `download.rs` and `store.rs`.

/// Free space that must remain after a download, so a model never fills the disk.
pub const RESERVE_BYTES: u64 = 1 << 30;

/// What to do with `blobs/<etag>.incomplete` before asking for bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// Ask for the bytes from `from` on (`Range: bytes=<from>-` when `from > 0`).
    Fetch { from: u64 },
    /// The partial file already has every byte: check it and publish it.
    Verify,
    /// The partial file is longer than the file on the hub: it is not this file's
    /// beginning. Empty it and fetch everything.
    Discard,
}

pub fn start(partial_len: u64, size: u64) -> Start {
    match partial_len.cmp(&size) {
        std::cmp::Ordering::Less => Start::Fetch { from: partial_len },
        std::cmp::Ordering::Equal => Start::Verify,
        std::cmp::Ordering::Greater => Start::Discard,
    }
}

/// The `Range` header for a fetch from `from` (none from the beginning).
pub fn range_header(from: u64) -> Option<String> {
    (from > 0).then(|| format!("bytes={from}-"))
}

/// How a reply to a fetch from `from` of a `size`-byte file is taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Accept {
    /// The body continues the partial file at `from`.
    Append,
    /// The body is the whole file (the server ignored `Range`): empty the partial file
    /// and write from the beginning.
    Restart,
    /// 416: the server cannot serve from `from`; empty the partial file and ask again
    /// without a range.
    Refetch,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplyError {
    #[error("the server answered {status} to a download")]
    Status { status: u16 },
    #[error("the server sent bytes {got:?} of a resumed download that starts at byte {from} of {size}")]
    Range { got: String, from: u64, size: u64 },
}

pub fn accept(status: u16, content_range: Option<&str>, from: u64, size: u64) -> Result<Accept, ReplyError> {
    match status {
        200 if from == 0 => Ok(Accept::Append),
        200 => Ok(Accept::Restart),
        206 => {
            let got = content_range.unwrap_or("");
            match parse_content_range(got) {
                Some((start, total)) if start == from && total.is_none_or(|t| t == size) => Ok(Accept::Append),
                _ => Err(ReplyError::Range { got: got.to_owned(), from, size }),
            }
        }
        416 if from > 0 => Ok(Accept::Refetch),
        status => Err(ReplyError::Status { status }),
    }
}

/// `bytes <start>-<end>/<total or *>` → (start, total).
fn parse_content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let start: u64 = start.trim().parse().ok()?;
    let end: u64 = end.trim().parse().ok()?;
    if end < start {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((start, total))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "not enough disk space in {dir}: the download needs {need} bytes ({} GB: {missing} still to fetch + a 1 GiB reserve), {free} bytes ({} GB) are free",
    gb(*.need), gb(*.free)
)]
pub struct NoSpace {
    pub dir: String,
    pub missing: u64,
    pub need: u64,
    pub free: u64,
}

fn gb(b: u64) -> String {
    format!("{:.2}", b as f64 / 1e9)
}

/// Refuses a download whose missing bytes plus the reserve exceed the free space.
pub fn check_space(dir: &str, missing: u64, free: u64) -> Result<(), NoSpace> {
    let need = missing.saturating_add(RESERVE_BYTES);
    if need > free {
        return Err(NoSpace { dir: dir.to_owned(), missing, need, free });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_file_is_resumed_checked_or_discarded() {
        assert_eq!(start(0, 10), Start::Fetch { from: 0 });
        assert_eq!(start(4, 10), Start::Fetch { from: 4 });
        assert_eq!(start(10, 10), Start::Verify);
        assert_eq!(start(11, 10), Start::Discard);
        assert_eq!(range_header(0), None);
        assert_eq!(range_header(4).as_deref(), Some("bytes=4-"));
    }

    #[test]
    fn replies_continue_restart_or_fail() {
        assert_eq!(accept(200, None, 0, 10), Ok(Accept::Append));
        assert_eq!(accept(200, None, 4, 10), Ok(Accept::Restart));
        assert_eq!(accept(206, Some("bytes 4-9/10"), 4, 10), Ok(Accept::Append));
        assert_eq!(accept(206, Some("bytes 4-9/*"), 4, 10), Ok(Accept::Append));
        assert!(matches!(accept(206, Some("bytes 0-9/10"), 4, 10), Err(ReplyError::Range { .. })));
        assert!(matches!(accept(206, Some("bytes 4-9/12"), 4, 10), Err(ReplyError::Range { .. })));
        assert!(matches!(accept(206, None, 4, 10), Err(ReplyError::Range { .. })));
        assert!(matches!(accept(206, Some("bytes 9-4/10"), 4, 10), Err(ReplyError::Range { .. })));
        assert_eq!(accept(416, None, 4, 10), Ok(Accept::Refetch));
        assert_eq!(accept(416, None, 0, 10), Err(ReplyError::Status { status: 416 }));
        assert_eq!(accept(500, None, 4, 10), Err(ReplyError::Status { status: 500 }));
    }

    #[test]
    fn space_needs_the_missing_bytes_and_a_reserve() {
        assert!(check_space("/c", 100, 100 + RESERVE_BYTES).is_ok());
        let e = check_space("/c", 101, 100 + RESERVE_BYTES).unwrap_err();
        assert_eq!((e.need, e.free), (101 + RESERVE_BYTES, 100 + RESERVE_BYTES));
        let msg = e.to_string();
        assert!(msg.contains(&(101 + RESERVE_BYTES).to_string()) && msg.contains(&(100 + RESERVE_BYTES).to_string()));
        assert!(check_space("/c", u64::MAX, u64::MAX - 1).is_err(), "no overflow");
    }
}
