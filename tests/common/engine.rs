//! Spawning the real `corral engine` on a socket in a private temp dir, with a guard
//! that kills it (and keeps its stdin open until then, as a parent would).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::TempDir;

pub struct EngineProc {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub socket: PathBuf,
    pub ready: serde_json::Value,
    pub stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub dir: TempDir,
}

impl EngineProc {
    /// Start `corral engine --model <model> --socket <tmp>/run/e.sock <extra…>` and wait
    /// for its ready line.
    pub fn start(model: &std::path::Path, extra: &[&str]) -> Self {
        let dir = TempDir::new("engine");
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let socket = run.join("e.sock");
        Self::start_at(model, &socket, extra, dir)
            .unwrap_or_else(|(code, err)| panic!("engine failed to start ({code:?}): {err}"))
    }

    /// Like `start`, with the socket path chosen by the caller. On failure returns the
    /// exit status and stderr.
    pub fn start_at(
        model: &std::path::Path,
        socket: &std::path::Path,
        extra: &[&str],
        dir: TempDir,
    ) -> Result<Self, (Option<ExitStatus>, String)> {
        Self::start_with(model, socket, extra, dir, |_| {})
    }

    /// Start in a fresh private run dir (the caller keeps state such as the SSD cache
    /// dir elsewhere), letting `configure` adjust the command first.
    pub fn start_fresh(model: &std::path::Path, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Self {
        let dir = TempDir::new("engine");
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let socket = run.join("e.sock");
        Self::start_with(model, &socket, extra, dir, configure)
            .unwrap_or_else(|(code, err)| panic!("engine failed to start ({code:?}): {err}"))
    }

    pub fn start_with(
        model: &std::path::Path,
        socket: &std::path::Path,
        extra: &[&str],
        dir: TempDir,
        configure: impl FnOnce(&mut Command),
    ) -> Result<Self, (Option<ExitStatus>, String)> {
        let mut cmd = Command::new(super::bin());
        configure(&mut cmd);
        let mut child = cmd
            .arg("engine")
            .arg("--model")
            .arg(model)
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn corral engine");
        let stdin = child.stdin.take();
        let (stderr_lines, rx) = super::capture(&mut child);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
                let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
                return Ok(Self { child, stdin, socket: socket.to_owned(), ready, stderr: stderr_lines, dir });
            }
            if let Ok(Some(status)) = child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                let err = stderr_lines.lock().unwrap().join("\n");
                return Err((Some(status), err));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err((None, "no ready line within 120 s".into()));
            }
        }
    }

    pub fn conn(&self) -> Box<dyn super::http::Stream> {
        super::http::unix(&self.socket)
    }

    pub fn get(&self, path: &str) -> super::http::Response {
        super::http::request(self.conn(), "GET", path, None, &[])
    }

    pub fn post(&self, path: &str, body: &serde_json::Value) -> super::http::Response {
        super::http::request(self.conn(), "POST", path, Some(body.to_string().as_bytes()), &[])
    }

    pub fn post_raw(&self, path: &str, body: &[u8]) -> super::http::Response {
        super::http::request(self.conn(), "POST", path, Some(body), &[])
    }

    pub fn stream(&self, path: &str, body: &serde_json::Value) -> super::http::Sse {
        super::http::Sse::open(self.conn(), path, body.to_string().as_bytes(), &[])
    }

    pub fn stats(&self) -> serde_json::Value {
        self.get("/admin/stats").json()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Wait for exit, up to `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for EngineProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The identity written in a prompt-cache file's header (`docs/formats.md`).
pub fn kv_file_identity(bytes: &[u8]) -> corral_engine::cache::file::Identity {
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    corral_engine::cache::file::Identity {
        model_fingerprint: bytes[16..48].try_into().unwrap(),
        tokenizer_hash: bytes[48..80].try_into().unwrap(),
        shape: corral_engine::kv::KvShape { n_layers: u32_at(116), kv_dim: u32_at(120) },
        recurrent: (u32_at(160) > 0).then(|| corral_engine::recurrent::RecurrentShape {
            layers: u32_at(160),
            conv: u32_at(164),
            ssm: u32_at(168),
        }),
    }
}
