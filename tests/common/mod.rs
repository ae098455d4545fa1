//! Helpers for tests that drive the real `corral` binary: model paths, temp dirs, and
//! running the binary with a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn models_dir() -> PathBuf {
    match std::env::var_os("CORRAL_MODELS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/corral/models"),
    }
}

pub fn model_path(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(p.is_file(), "{} is missing: run scripts/models/fetch first", p.display());
    p
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_corral")
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("corral-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `corral` with `args`, killing it if it outlives `deadline`.
pub fn run_corral(args: &[&str], deadline: Duration) -> Output {
    run_corral_env(args, &[], deadline)
}

/// As `run_corral`, with extra environment variables.
pub fn run_corral_env(args: &[&str], envs: &[(&str, &str)], deadline: Duration) -> Output {
    let mut child = Command::new(bin())
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_LOG", "warn")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!(
                "corral {args:?} did not finish within {deadline:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub mod chat;
pub mod engine;
pub mod fake_hub;
pub mod gateway;
pub mod generated;
pub mod http;
pub mod loopback;
pub mod procfs;
pub mod tls_front;
pub mod upstream;

/// Collects a spawned child's stderr lines in the background and hands over the first
/// line it prints on stdout (the rest of stdout is drained).
pub fn capture(child: &mut std::process::Child) -> (Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let err = child.stderr.take().expect("stderr piped");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("stdout piped");
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        for _ in lines {}
    });
    (lines, rx)
}
