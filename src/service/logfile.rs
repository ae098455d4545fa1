//! A size-bounded log file for runs under a service manager that does not rotate
//! (launchd): when the next line would pass `max_bytes`, `corral.log` becomes
//! `corral.log.1` (older ones shift up, the last of `keep` is dropped) and a new file
//! starts. A line is never split across files.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct LogFile {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    state: Mutex<(File, u64)>,
}

/// 10 MiB a file, three old files kept: at most 40 MiB of logs.
pub const MAX_BYTES: u64 = 10 << 20;
pub const KEEP: usize = 3;

impl LogFile {
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let len = file.metadata()?.len();
        Ok(Self { path: path.to_owned(), max_bytes, keep, state: Mutex::new((file, len)) })
    }

    fn numbered(&self, i: usize) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{i}"));
        p.into()
    }

    fn rotate(&self) -> io::Result<File> {
        for i in (1..self.keep).rev() {
            let from = self.numbered(i);
            if from.exists() {
                std::fs::rename(&from, self.numbered(i + 1))?;
            }
        }
        std::fs::rename(&self.path, self.numbered(1))?;
        OpenOptions::new().create(true).append(true).open(&self.path)
    }

    fn write_line(&self, buf: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.1 > 0 && st.1 + buf.len() as u64 > self.max_bytes {
            st.0 = self.rotate()?;
            st.1 = 0;
        }
        st.0.write_all(buf)?;
        st.1 += buf.len() as u64;
        Ok(())
    }
}

/// What `tracing_subscriber` writes one event through.
pub struct Line<'a>(&'a LogFile);

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_line(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_before_a_line_would_pass_the_bound_and_keeps_the_last_files() {
        let dir = std::env::temp_dir().join(format!("corral-logfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("corral.log");
        let log = LogFile::open(&path, 100, 2).unwrap();
        for i in 0..10 {
            log.write_line(format!("line {i:02} {}\n", "x".repeat(30)).as_bytes()).unwrap();
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        // 40-byte lines, 100-byte files: two lines a file; lines 8, 9 current, 6, 7 in .1, 4, 5 in .2.
        assert!(read(&path).starts_with("line 08") && read(&path).lines().count() == 2);
        assert!(read(&dir.join("corral.log.1")).starts_with("line 06"));
        assert!(read(&dir.join("corral.log.2")).starts_with("line 04"));
        assert!(!dir.join("corral.log.3").exists());
        assert!(std::fs::metadata(&path).unwrap().len() <= 100);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
