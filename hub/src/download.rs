//! Streaming a file's bytes into its `.incomplete` file: every byte is hashed as it is
//! written, so the SHA-256 is known the moment the last byte lands; a resumed download
//! first hashes the bytes already on disk.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::HubError;

/// Told how a transfer goes (a progress bar in the binary; nothing in tests).
pub trait Progress {
    /// A transfer of `size` bytes begins with `done` of them already on disk.
    fn begin(&self, name: &str, size: u64, done: u64);
    fn advance(&self, bytes: u64);
    fn finish(&self);
}

pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _: &str, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

const BUF: usize = 1 << 20;

/// The `.incomplete` file open for appending, with the hash of what it holds.
pub struct Partial {
    path: PathBuf,
    file: File,
    hasher: Sha256,
    len: u64,
}

impl Partial {
    /// Opens (or creates) the partial file and hashes its first `keep` bytes (at most what
    /// it holds), dropping any beyond them.
    pub fn open(path: &Path, keep: u64) -> Result<Self, HubError> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(HubError::io("opening", path))?;
        let keep = keep.min(file.metadata().map_err(HubError::io("reading", path))?.len());
        file.set_len(keep).map_err(HubError::io("truncating", path))?;
        let mut hasher = Sha256::new();
        file.seek(SeekFrom::Start(0)).map_err(HubError::io("reading", path))?;
        let mut buf = vec![0u8; BUF];
        let mut left = keep;
        while left > 0 {
            let n = file.read(&mut buf[..BUF.min(left as usize)]).map_err(HubError::io("reading", path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
        file.seek(SeekFrom::Start(keep)).map_err(HubError::io("seeking", path))?;
        Ok(Self { path: path.to_owned(), file, hasher, len: keep - left })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every byte (the server sent the whole file, not the rest of it).
    pub fn restart(&mut self) -> Result<(), HubError> {
        self.file.set_len(0).map_err(HubError::io("truncating", &self.path))?;
        self.file.seek(SeekFrom::Start(0)).map_err(HubError::io("seeking", &self.path))?;
        self.hasher = Sha256::new();
        self.len = 0;
        Ok(())
    }

    /// Appends `body` until it ends, refusing to grow past `size`. An interrupted body
    /// leaves the bytes received so far on disk, flushed, for the next run to resume.
    pub fn append(&mut self, body: &mut dyn Read, size: u64, progress: &dyn Progress) -> Result<(), HubError> {
        let mut buf = vec![0u8; BUF];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(cause) => {
                    let _ = self.file.sync_data();
                    return Err(HubError::Interrupted { got: self.len, size, partial: self.path.clone(), cause });
                }
            };
            if self.len + n as u64 > size {
                let _ = std::fs::remove_file(&self.path);
                return Err(HubError::TooLong { size });
            }
            self.file.write_all(&buf[..n]).map_err(HubError::io("writing", &self.path))?;
            self.hasher.update(&buf[..n]);
            self.len += n as u64;
            progress.advance(n as u64);
        }
        if self.len < size {
            let _ = self.file.sync_data();
            let cause = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection closed early");
            return Err(HubError::Interrupted { got: self.len, size, partial: self.path.clone(), cause });
        }
        Ok(())
    }

    /// Hex SHA-256 of every byte written; the file is synced and closed.
    pub fn finish(self) -> Result<String, HubError> {
        self.file.sync_all().map_err(HubError::io("syncing", &self.path))?;
        Ok(hex(&self.hasher.finalize()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flaky<'a> {
        data: &'a [u8],
        cut_at: usize,
    }

    impl Read for Flaky<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.data.is_empty() {
                return Ok(0);
            }
            if self.cut_at == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
            }
            let n = buf.len().min(self.data.len()).min(self.cut_at).min(7);
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.cut_at -= n;
            Ok(n)
        }
    }

    #[test]
    fn a_resumed_download_hashes_like_a_whole_one() {
        let dir = std::env::temp_dir().join(format!("corral-hub-download-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("e.incomplete");
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole = hex(&Sha256::digest(&data));

        let mut p = Partial::open(&path, 0).unwrap();
        let err = p.append(&mut Flaky { data: &data, cut_at: 400 }, 1000, &NoProgress).unwrap_err();
        assert!(matches!(err, HubError::Interrupted { got: 400, size: 1000, .. }), "{err}");
        drop(p);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 400);

        let mut p = Partial::open(&path, 400).unwrap();
        assert_eq!(p.len(), 400);
        p.append(&mut Flaky { data: &data[400..], cut_at: usize::MAX }, 1000, &NoProgress).unwrap();
        assert_eq!(p.finish().unwrap(), whole);
        assert_eq!(std::fs::read(&path).unwrap(), data);

        // A short body is an interruption; a long one is refused and deleted.
        let mut p = Partial::open(&path, 0).unwrap();
        let err = p.append(&mut &data[..10], 1000, &NoProgress).unwrap_err();
        assert!(matches!(err, HubError::Interrupted { got: 10, .. }));
        p.restart().unwrap();
        assert!(p.is_empty());
        assert!(matches!(p.append(&mut &data[..], 999, &NoProgress), Err(HubError::TooLong { size: 999 })));
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
