//! The fake engine starts as `corral engine` does: argv flags, a ready line on stdout, a
//! unix socket answering `/health`; and it honours a behaviour from its "model file"
//! (`exit_at_start`).
//!
//! This test is also why the gateway tests find the binary: cargo builds a package's
//! binaries for its integration tests, so `cargo test --workspace` (and nextest) leave
//! `corral-fake-engine` beside `corral` in target/<profile>/ (tests/common/gateway.rs).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use corral_protocol::engine_wire::EngineEvent;

const BIN: &str = env!("CARGO_BIN_EXE_corral-fake-engine");

/// A private directory under the system temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("corral-fake-engine-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create the temp dir");
        Self(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The engine process, killed on drop (a failed assertion must not leave it running).
struct Engine(Child);

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Dir, behaviour: &str) -> Engine {
    let model = dir.0.join("fake.gguf");
    std::fs::write(&model, behaviour).expect("write the model file");
    let socket = dir.0.join("engine.sock");
    let child = Command::new(BIN)
        .args(["--model", model.to_str().expect("a UTF-8 path"), "--socket", socket.to_str().expect("a UTF-8 path")])
        .args(["--id", "fake"])
        // Open stdin: the engine exits when its parent goes (stdin at EOF).
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the fake engine");
    Engine(child)
}

#[test]
fn it_announces_ready_and_answers_health_on_its_socket() {
    let dir = Dir::new("ready");
    let mut engine = start(&dir, "{}");
    let stdout = engine.0.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read the ready line");
    let Some(EngineEvent::Ready(ready)) = EngineEvent::parse(line.trim_end()) else {
        panic!("the first stdout line is not a ready event: {line:?}");
    };
    assert_eq!(ready.pid, engine.0.id());
    assert_eq!(ready.model, "fake");

    let mut s = UnixStream::connect(&ready.socket).expect("connect to the announced socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("set a read deadline");
    s.write_all(b"GET /health HTTP/1.1\r\nhost: engine\r\n\r\n").expect("send the request");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read the answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[test]
fn it_exits_at_start_with_the_code_its_behaviour_names() {
    let dir = Dir::new("exit");
    let mut engine = start(&dir, r#"{"exit_at_start": 78}"#);
    let status = engine.0.wait().expect("wait for the engine");
    assert_eq!(status.code(), Some(78));
}
