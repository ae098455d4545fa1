//! Spawning the real `corral serve` on 127.0.0.1:0 with a private runtime dir, with a
//! kill-on-drop guard, and helpers to call it over TCP.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::TempDir;
use super::http::{self, Response, Sse};

pub struct Gateway {
    pub child: Child,
    pub addr: String,
    pub stderr: Arc<Mutex<Vec<String>>>,
    pub dir: TempDir,
}

/// A fake engine "model": a `.gguf` file holding the fake engine's behaviour as JSON.
pub fn fake_model(dir: &Path, name: &str, behaviour: Value) -> PathBuf {
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, behaviour.to_string()).unwrap();
    p
}

/// The fake engine (tests/fake-engine, package `corral-fake-engine`). It is another
/// workspace member, so cargo gives these tests no `CARGO_BIN_EXE_` for it: it is found
/// next to the `corral` binary, where cargo builds it for the same profile when its own
/// package's tests are built too (`cargo test --workspace`, nextest `--workspace`). A test
/// run of this package alone (`cargo test --test it`) builds only `corral`: then the fake
/// engine must exist and be newer than its source, or this names the command that builds it.
pub fn fake_engine_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let corral = Path::new(super::bin());
        let bin = corral.with_file_name("corral-fake-engine");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-engine/src/main.rs");
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let problem = match (modified(&bin), modified(&source)) {
            (None, _) => Some("is missing"),
            (Some(built), Some(edited)) if built < edited => Some("is older than its source"),
            _ => None,
        };
        if let Some(problem) = problem {
            // The profile's flag, from the directory cargo built into (target/<profile>/).
            let profile = match corral.parent().and_then(Path::file_name).and_then(|d| d.to_str()) {
                Some("debug") | None => String::new(),
                Some("release") => " --release".into(),
                Some(other) => format!(" --profile {other}"),
            };
            panic!(
                "{} {problem}: the gateway tests start the fake engine, the binary of the workspace \
                 member corral-fake-engine; run them with `cargo test --workspace{profile}`, or build it \
                 first with `cargo build -p corral-fake-engine{profile}`",
                bin.display()
            );
        }
        bin.display().to_string()
    })
}

/// `corral serve` over fake-engine models (name, behaviour), plus `extra` flags.
pub fn fake_gateway(models: &[(&str, Value)], extra: &[&str]) -> Gateway {
    let dir = TempDir::new("fakegw");
    let mut args: Vec<String> = vec!["--engine-bin".into(), fake_engine_bin().into()];
    for (name, behaviour) in models {
        args.push("--model".into());
        args.push(fake_model(dir.path(), name, behaviour.clone()).display().to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Gateway::start_in(dir, &refs)
}

impl Gateway {
    /// `corral serve --port 0 --runtime-dir <tmp>/run <args…>`.
    pub fn start(args: &[&str]) -> Self {
        let dir = TempDir::new("gateway");
        Self::start_in(dir, args)
    }

    /// Unless the arguments say otherwise, the SSD tier goes to `<tmp>/kv`, stored
    /// Responses to `<tmp>/responses`, the Hugging Face cache is `<tmp>/hf-hub` and the
    /// config directory `<tmp>/config`, never the user's.
    pub fn start_in(dir: TempDir, args: &[&str]) -> Self {
        Self::start_in_env(dir, args, &[])
    }

    /// As `start_in`, with extra environment variables for the gateway. `--port 0`
    /// unless the arguments give a port.
    pub fn start_in_env(dir: TempDir, args: &[&str], envs: &[(&str, &str)]) -> Self {
        let run = dir.path().join("run");
        let mut cmd = Command::new(super::bin());
        cmd.arg("serve");
        if !args.contains(&"--port") {
            cmd.args(["--port", "0"]);
        }
        cmd.arg("--runtime-dir").arg(&run).args(args);
        if !args.iter().any(|a| *a == "--ssd-cache" || *a == "--no-ssd-cache") {
            cmd.arg("--ssd-cache").arg(dir.path().join("kv"));
        }
        if !args.contains(&"--responses-dir") {
            cmd.arg("--responses-dir").arg(dir.path().join("responses"));
        }
        // The user's Hugging Face cache is no test's business: an empty one unless the
        // test names one.
        cmd.env("HF_HUB_CACHE", dir.path().join("hf-hub"));
        // Nor is the user's config file.
        cmd.env("XDG_CONFIG_HOME", dir.path().join("config")).env_remove("CORRAL_CONFIG");
        let mut child = cmd
            .envs(envs.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn corral serve");
        let (stderr, rx) = super::capture(&mut child);
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("gateway did not start: {}", stderr.lock().unwrap().join("\n"))
        });
        let v: Value = serde_json::from_str(&line).expect("listening line");
        assert_eq!(v["event"], "listening");
        let addr = v["addr"].as_str().unwrap().to_owned();
        Self { child, addr, stderr, dir }
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    pub fn get(&self, path: &str) -> Response {
        http::request(http::tcp(&self.addr), "GET", path, None, &[])
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        http::request(http::tcp(&self.addr), "POST", path, Some(body.to_string().as_bytes()), &[])
    }

    pub fn stream(&self, path: &str, body: &Value) -> Sse {
        Sse::open(http::tcp(&self.addr), path, body.to_string().as_bytes(), &[])
    }

    pub fn engine(&self) -> Value {
        self.get("/engine").json()
    }

    pub fn engine_of(&self, model: &str) -> Value {
        self.engine()["engines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["model"] == model)
            .cloned()
            .unwrap_or(Value::Null)
    }

    pub fn stats(&self) -> Value {
        self.get("/stats").json()
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.stats()["gateway"][name].as_u64().unwrap()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // SIGKILL: the engines die with us (stdin EOF, parent-death signal).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a process exists and has not exited (a zombie waiting to be reaped by
/// whoever inherited it counts as gone).
pub fn alive(pid: u32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|st| st != "Z" && st != "X"),
        Err(_) => !std::path::Path::new("/proc/self").exists(),
    }
}

/// Sockets left in a runtime directory.
pub fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_socket())).map(|e| e.path()).collect())
        .unwrap_or_default()
}

pub fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
