//! `corral ps`, `stats`, `load` and `stop` run as a person runs them, against a real
//! `corral serve` with the real models: what they print, what they change, their exit
//! codes, and the errors for an unknown model and for no gateway at all.

use std::process::Output;
use std::time::Duration;

use crate::common::gateway::*;
use crate::common::*;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);

fn corral(gw: &Gateway, args: &[&str]) -> Output {
    let url = format!("http://{}", gw.addr);
    let mut all = args.to_vec();
    all.extend(["--url", &url]);
    run_corral(&all, DEADLINE)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "exit {:?}; stdout: {}; stderr: {}", o.status, stdout(&o), stderr(&o));
    stdout(&o)
}

#[test]
fn load_ps_stats_and_stop_drive_a_real_gateway() {
    let (a, b) = (format!("smol={}", model_path(SMOLLM).display()), format!("gemma={}", model_path(GEMMA).display()));
    let gw = Gateway::start(&["--model", &a, "--model", &b, "--model-pool", "1", "--threads", "1"]);

    let out = ok(corral(&gw, &["ps"]));
    assert_eq!(out, "no engines running (2 models known; `corral load MODEL` starts one)\n");

    // The address from the environment this time.
    let env_url = format!("http://{}", gw.addr);
    let out = ok(run_corral_env(&["load", "smol"], &[("CORRAL_URL", &env_url)], DEADLINE));
    let smol = gw.engine_of("smol");
    let pid = smol["pid"].as_u64().unwrap_or_else(|| panic!("not started: {}", gw.engine()));
    let device = smol["device"].as_str().unwrap().to_owned();
    assert!(out.starts_with(&format!("smol is ready: pid {pid} on {device} (")), "{out}");

    let out = ok(corral(&gw, &["ps"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("NAME  STATE  PID"), "{out}");
    let cells: Vec<&str> = lines[1].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(&cells[..4], ["smol", "ready", &pid.to_string(), &device], "{out}");
    assert!(cells[4].ends_with("MiB"), "resident memory from the engine's stats: {out}");
    assert_eq!(cells[5], "0", "{out}");
    assert_eq!(cells.last(), Some(&"next to evict"), "a full pool of one: {out}");

    let chat = json!({"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    assert_eq!(gw.post("/v1/chat/completions", &chat).status, 200);
    let out = ok(corral(&gw, &["stats"]));
    assert!(out.starts_with(&format!("gateway: pid {}, up ", gw.child.id())), "{out}");
    assert!(out.contains("/v1/chat/completions 1"), "{out}");
    assert!(out.contains("1 spawn, 0 evictions, 0 crashes; no switches"), "{out}");
    assert!(out.contains(&format!("\nsmol: pid {pid} on {device}, up ")), "{out}");
    assert!(out.contains("  requests      1 (0 failed, 0 cancelled)"), "{out}");
    assert!(out.contains("  first token   ") && out.contains("over 1 request\n"), "{out}");

    let raw: Value = serde_json::from_str(&ok(corral(&gw, &["stats", "--json"]))).expect("--json prints JSON");
    assert_eq!(raw["gateway"]["requests_by_route"]["/v1/chat/completions"], 1, "{raw}");
    assert_eq!(raw["engines"]["smol"]["pid"], pid, "{raw}");

    // An unknown model: the gateway's own 404 message, and a failed exit.
    let expected = gw.post("/api/models/nope/load", &json!({})).json()["error"]["message"].as_str().unwrap().to_owned();
    for verb in ["load", "stop"] {
        let o = corral(&gw, &[verb, "nope"]);
        assert_eq!(o.status.code(), Some(1), "{verb}: {}", stderr(&o));
        assert_eq!(stderr(&o), format!("corral: error: {expected}\n"), "{verb}");
        assert!(expected.contains("gemma, smol"), "{expected}");
    }

    let out = ok(corral(&gw, &["stop", "smol"]));
    assert!(out.starts_with("smol stopped ("), "{out}");
    assert_eq!(gw.engine_of("smol")["state"], "stopped");
    assert!(!alive(pid as u32));
    assert_eq!(ok(corral(&gw, &["ps"])), "no engines running (2 models known; `corral load MODEL` starts one)\n");
}

#[test]
fn without_a_gateway_every_verb_says_how_to_start_one() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [vec!["ps"], vec!["stats"], vec!["stats", "--json"], vec!["load", "smol"], vec!["stop", "smol"]] {
        let mut all = args.clone();
        all.extend(["--url", &url]);
        let o = run_corral(&all, DEADLINE);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stderr(&o),
            format!("corral: error: no corral at {url}: connection refused — start it with `corral serve`\n"),
            "{args:?}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let o = run_corral(&["ps", "--url", "https://127.0.0.1:1"], DEADLINE);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("only http:// is supported"), "{}", stderr(&o));
}
