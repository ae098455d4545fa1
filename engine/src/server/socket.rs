//! The engine's unix socket: created mode 0600 inside a directory that must be a real
//! directory (not a symlink), owned by us, mode 0700, so no other user can reach it.
//! A socket file left by a dead engine is probed first and removed only if nothing
//! answers; a live one means another engine owns the path.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use corral_net::dirs::{self, Access, SocketState};

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("socket path {0} has no parent directory")]
    NoParent(PathBuf),
    #[error("socket directory {dir}: {reason}")]
    BadDir { dir: PathBuf, reason: String },
    #[error("socket {0} is in use by a running process")]
    InUse(PathBuf),
    #[error("{path} exists and is not a socket")]
    NotSocket { path: PathBuf },
    #[error("socket {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Make sure `dir` exists, is ours, is not a symlink and is closed to others.
pub fn check_dir(dir: &Path) -> Result<(), SocketError> {
    dirs::ensure_dir(dir, Access::Private).map_err(|e| SocketError::BadDir { dir: e.dir, reason: e.reason })
}

/// Bind `path` (after the directory checks), mode 0600.
pub fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, SocketError> {
    let dir =
        path.parent().filter(|p| !p.as_os_str().is_empty()).ok_or_else(|| SocketError::NoParent(path.to_owned()))?;
    check_dir(dir)?;
    clear_stale(path)?;
    let io = |source| SocketError::Io { path: path.to_owned(), source };
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(io)?;
    // The directory is 0700, so nobody else could use the socket before this chmod.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    Ok(listener)
}

fn clear_stale(path: &Path) -> Result<(), SocketError> {
    let io = |source| SocketError::Io { path: path.to_owned(), source };
    match dirs::probe_socket(path).map_err(io)? {
        SocketState::Absent => Ok(()),
        SocketState::Live => Err(SocketError::InUse(path.to_owned())),
        SocketState::NotSocket => Err(SocketError::NotSocket { path: path.to_owned() }),
        SocketState::Stale => {
            tracing::info!(socket = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(io)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("corral-sock-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn creates_private_dir_and_socket() {
        let d = tmp("ok").join("run");
        let sock = d.join("e.sock");
        let l = bind(&sock).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&sock).unwrap().mode() & 0o777, 0o600);
        // A second engine on the same live path is refused.
        assert!(matches!(bind(&sock), Err(SocketError::InUse(_))));
        drop(l);
        // The listener is gone but the file remains: stale, so it is replaced.
        assert!(bind(&sock).is_ok());
        std::fs::remove_dir_all(d.parent().unwrap()).unwrap();
    }

    #[test]
    fn refuses_open_or_foreign_dirs() {
        let d = tmp("open");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(bind(&d.join("e.sock")), Err(SocketError::BadDir { .. })));
        let link = tmp("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = bind(&link.join("e.sock")).unwrap_err();
        assert!(matches!(err, SocketError::BadDir { .. }), "{err}");
        std::fs::write(d.join("plain"), b"x").unwrap();
        assert!(matches!(bind(&d.join("plain")), Err(SocketError::NotSocket { .. })));
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
