//! Directories other users must not reach into, and sockets left behind by dead
//! processes (pueue's lessons).
//!
//! A directory we keep sockets or cache files in must be a real directory (not a
//! symlink), owned by us, and closed to others: for sockets no group/other bits at all,
//! for cache files at least no group/other write. A missing one is created mode 0700.
//!
//! A socket file is probed by connecting to it: if something answers, another process
//! owns it and it must not be touched; if nothing does, it is stale and may be removed.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No permission bits for group or others (socket directories).
    Private,
    /// Nobody but us may write (cache directories may be readable).
    NoForeignWrites,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("directory {dir}: {reason}")]
pub struct DirError {
    pub dir: PathBuf,
    pub reason: String,
}

/// Create `dir` (mode 0700, with parents) if it is missing, then check it.
pub fn ensure_dir(dir: &Path, access: Access) -> Result<(), DirError> {
    let bad = |reason: String| DirError { dir: dir.to_owned(), reason };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| bad(e.to_string()))?;
        }
        Err(e) => return Err(bad(e.to_string())),
        Ok(_) => {}
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| bad(e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(bad("is a symlink".into()));
    }
    if !meta.is_dir() {
        return Err(bad("is not a directory".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(bad(format!("is owned by uid {}, not {me}", meta.uid())));
    }
    let mode = meta.mode() & 0o777;
    match access {
        Access::Private if mode & 0o077 != 0 => {
            Err(bad(format!("has mode {mode:o}; it must be 700 (no access for other users)")))
        }
        Access::NoForeignWrites if mode & 0o022 != 0 => Err(bad(format!("is writable by other users (mode {mode:o})"))),
        _ => Ok(()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketState {
    Absent,
    /// Something accepts connections on it.
    Live,
    /// A socket file nobody listens on (its process died).
    Stale,
    /// The path exists and is not a socket.
    NotSocket,
}

pub fn probe_socket(path: &Path) -> io::Result<SocketState> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(SocketState::Absent),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Ok(SocketState::NotSocket);
    }
    Ok(match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => SocketState::Live,
        Err(_) => SocketState::Stale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("corral-net-dirs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn creates_private_and_refuses_open_linked_or_plain() {
        let d = tmp("a").join("run");
        ensure_dir(&d, Access::Private).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(ensure_dir(&d, Access::Private).is_err());
        assert!(ensure_dir(&d, Access::NoForeignWrites).is_ok(), "readable by group is fine for caches");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(ensure_dir(&d, Access::NoForeignWrites).is_err());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.parent().unwrap().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(ensure_dir(&link, Access::Private).unwrap_err().reason.contains("symlink"));
        let file = d.join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(ensure_dir(&file, Access::Private).is_err());
        assert_eq!(probe_socket(&file).unwrap(), SocketState::NotSocket);
        std::fs::remove_dir_all(d.parent().unwrap()).unwrap();
    }

    #[test]
    fn sockets_live_stale_absent() {
        let d = tmp("s");
        ensure_dir(&d, Access::Private).unwrap();
        let p = d.join("e.sock");
        assert_eq!(probe_socket(&p).unwrap(), SocketState::Absent);
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert_eq!(probe_socket(&p).unwrap(), SocketState::Live);
        drop(l);
        assert_eq!(probe_socket(&p).unwrap(), SocketState::Stale);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        let d = tmp("owner");
        ensure_dir(&d, Access::Private).unwrap();
        let nobody = nix::unistd::Uid::from_raw(65534);
        if nix::unistd::chown(&d, Some(nobody), None).is_err() {
            eprintln!("cannot chown here (not root): the foreign-owner case is not tried");
            std::fs::remove_dir_all(&d).unwrap();
            return;
        }
        let e = ensure_dir(&d, Access::Private).unwrap_err();
        assert!(e.reason.contains("owned by uid 65534"), "{e}");
        assert!(ensure_dir(&d, Access::NoForeignWrites).is_err(), "nor for caches");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
