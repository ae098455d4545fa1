//! `corral serve` opens the chat page in a browser only when a person started it at a
//! terminal. The terminal is a real pseudo-terminal (util-linux `script`); the browser
//! opener is a stand-in `xdg-open`, first on PATH, that writes down the address it got.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::gateway::*;
use crate::common::*;
use serde_json::{Value, json};

/// `<dir>/bin/xdg-open` appending its argument to `<dir>/opened`; returns the PATH to use.
fn fake_opener(dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let opener = bin.join("xdg-open");
    std::fs::write(&opener, format!("#!/bin/sh\nprintf '%s\\n' \"$1\" >> '{}'\n", dir.join("opened").display()))
        .unwrap();
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

fn opened(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("opened")).ok()
}

/// `corral serve` under a pseudo-terminal, killed on drop.
struct InTerminal {
    script: Child,
    pid: Option<u32>,
    addr: String,
}

impl InTerminal {
    fn start(dir: &Path, extra: &[&str]) -> Self {
        let model = fake_model(dir, "m", json!({}));
        let mut argv = vec![
            bin().to_owned(),
            "serve".into(),
            "--port".into(),
            "0".into(),
            "--runtime-dir".into(),
            dir.join("run").display().to_string(),
            "--no-ssd-cache".into(),
            "--responses-dir".into(),
            dir.join("responses").display().to_string(),
            "--engine-bin".into(),
            fake_engine_bin().into(),
            "--model".into(),
            model.display().to_string(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        // The temp paths hold no quote; quote each word for script's shell.
        let line = argv.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" ");
        let mut script = Command::new("script")
            .args(["-qfec", &line, "/dev/null"])
            .env("PATH", fake_opener(dir))
            .env("RUST_LOG", "info")
            // Kept open: script ends the session when its input ends.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("util-linux `script` runs");
        let out = script.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(start) = line.find("{\"event\":\"listening\"") {
                    let _ = tx.send(line[start..].trim_end().to_owned());
                }
            }
        });
        let mut me = Self { script, pid: None, addr: String::new() };
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("corral serve listens under a terminal");
        let v: Value = serde_json::from_str(&line).unwrap();
        me.pid = v["pid"].as_u64().map(|p| p as u32);
        me.addr = v["addr"].as_str().unwrap().to_owned();
        me
    }

    fn health(&self) -> u16 {
        crate::common::http::request(crate::common::http::tcp(&self.addr), "GET", "/health", None, &[]).status
    }
}

impl Drop for InTerminal {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.script.kill();
        let _ = self.script.wait();
    }
}

fn temp(tag: &str) -> (TempDir, PathBuf) {
    let t = TempDir::new(tag);
    let p = t.path().to_owned();
    (t, p)
}

#[test]
fn serve_at_a_terminal_opens_the_chat_page_once_it_listens() {
    let (_t, dir) = temp("open");
    let gw = InTerminal::start(&dir, &[]);
    assert!(wait_until(Duration::from_secs(10), || opened(&dir).is_some()), "no browser was opened");
    assert_eq!(gw.health(), 200);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(opened(&dir).unwrap(), format!("http://{}/#/chat\n", gw.addr), "opened once, at the chat page");
}

#[test]
fn no_open_or_a_start_without_a_terminal_opens_nothing() {
    let (_t, dir) = temp("noopen");
    let gw = InTerminal::start(&dir, &["--no-open"]);
    let piped_dir = TempDir::new("noopen-piped");
    let path = fake_opener(piped_dir.path());
    let model = fake_model(piped_dir.path(), "m", json!({})).display().to_string();
    let piped_path = piped_dir.path().to_owned();
    let piped =
        Gateway::start_in_env(piped_dir, &["--engine-bin", fake_engine_bin(), "--model", &model], &[("PATH", &path)]);
    assert_eq!(gw.health(), 200);
    assert_eq!(piped.get("/health").status, 200);
    // The opener runs right after the listening line; give a wrong one ample time to show.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(opened(&dir), None, "--no-open at a terminal");
    assert_eq!(opened(&piped_path), None, "stdin and stdout not a terminal");
}
