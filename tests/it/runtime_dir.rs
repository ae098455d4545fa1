//! `corral serve` refuses a runtime directory (where engine sockets live) that another
//! user could reach into: a symlink, one open to others, or one owned by someone else
//! (tried when the test runs as root) — exit 1 with a message saying which and naming
//! `--runtime-dir`, before it listens.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::common::gateway::{fake_engine_bin, fake_model};
use crate::common::{TempDir, run_corral};
use serde_json::json;

/// Run `serve` with `run` as its runtime dir: (exit code, stderr, whether it listened).
fn serve_with(dir: &TempDir, run: &Path) -> (Option<i32>, String, bool) {
    let model = fake_model(dir.path(), "m", json!({}));
    let args = [
        "serve",
        "--port",
        "0",
        "--engine-bin",
        fake_engine_bin(),
        "--model",
        model.to_str().unwrap(),
        "--runtime-dir",
        run.to_str().unwrap(),
        "--no-ssd-cache",
    ];
    let out = run_corral(&args, Duration::from_secs(30));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), !out.stdout.is_empty())
}

#[test]
fn a_runtime_dir_others_could_reach_is_refused_before_listening() {
    let dir = TempDir::new("rundir");
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();

    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (code, err, listened) = serve_with(&dir, &link);
    assert_eq!((code, listened), (Some(1), false), "{err}");
    assert!(err.contains("symlink") && err.contains("--runtime-dir"), "{err}");

    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, err, _) = serve_with(&dir, &real);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("mode 755"), "{err}");

    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    if nix::unistd::chown(&real, Some(nix::unistd::Uid::from_raw(65534)), None).is_ok() {
        let (code, err, _) = serve_with(&dir, &real);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("owned by uid 65534"), "{err}");
        nix::unistd::chown(&real, Some(nix::unistd::geteuid()), None).unwrap();
    } else {
        eprintln!("not root: the other-owner case is not tried");
    }
}
