//! One file per fuzzing process, rewritten for every input, for the readers that open
//! a path (prompt-cache files, GGUF files). It is unlinked as soon as it is created and
//! reached through `/proc/self/fd` (Linux), so nothing is left behind however the
//! process ends.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

fn scratch() -> &'static Mutex<(File, PathBuf)> {
    static S: OnceLock<Mutex<(File, PathBuf)>> = OnceLock::new();
    S.get_or_init(|| {
        // /dev/shm keeps the writes in memory where there is one.
        let dir = ["/dev/shm", "/tmp"].into_iter().find(|d| std::path::Path::new(d).is_dir()).unwrap_or(".");
        let named = PathBuf::from(dir).join(format!("corral-fuzz-{}", std::process::id()));
        let f = File::options().read(true).write(true).create_new(true).open(&named).expect("a scratch file");
        std::fs::remove_file(&named).expect("the scratch file can be unlinked");
        let path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        Mutex::new((f, path))
    })
}

/// Replace the scratch file's contents with `bytes` and call `read` with its path.
pub fn with_file<T>(bytes: &[u8], read: impl FnOnce(&std::path::Path) -> T) -> T {
    let mut s = scratch().lock().unwrap_or_else(|e| e.into_inner());
    let (f, path) = &mut *s;
    f.set_len(0).expect("truncate the scratch file");
    f.seek(SeekFrom::Start(0)).expect("seek the scratch file");
    f.write_all(bytes).expect("write the scratch file");
    read(path)
}
