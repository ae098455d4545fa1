//! `corral service`: the unit it writes is what systemd accepts, `--no-start` installs
//! and removes only the file, and a serve run with the service's log settings writes
//! JSON lines to its log file.

use std::process::Command;
use std::time::Duration;

use crate::common::gateway::{Gateway, fake_model};
use crate::common::{TempDir, run_corral_env};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn stdout(o: &std::process::Output) -> String {
    assert!(o.status.success(), "corral failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn install_writes_a_unit_systemd_accepts_and_uninstall_removes_it() {
    let home = TempDir::new("svc-home");
    let config = home.path().join("config");
    let env = [("HOME", home.path().to_str().unwrap()), ("XDG_CONFIG_HOME", config.to_str().unwrap())];

    // --dry-run prints the unit and the commands, writes nothing.
    let dry = stdout(&run_corral_env(&["service", "install", "--dry-run", "--", "--port", "9123"], &env, DEADLINE));
    let unit_path = config.join("systemd/user/corral.service");
    assert!(dry.starts_with(&format!("# {}\n", unit_path.display())), "{dry}");
    let exec = format!("ExecStart=\"{}\" \"serve\" \"--no-open\" \"--port\" \"9123\"", crate::common::bin());
    assert!(dry.contains(&exec), "{dry}");
    assert!(dry.contains("# then: systemctl --user enable --now corral.service"), "{dry}");
    assert!(!unit_path.exists());

    let out = stdout(&run_corral_env(&["service", "install", "--no-start", "--", "--port", "9123"], &env, DEADLINE));
    assert!(out.contains(&unit_path.display().to_string()));
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    assert!(unit.contains(&exec) && unit.contains("Restart=on-failure") && unit.contains("KillMode=control-group"));

    // systemd's own checker, where the machine has it.
    if Command::new("systemd-analyze").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let v = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&unit_path).output().unwrap();
        let msgs = String::from_utf8_lossy(&v.stderr);
        // Offline verify may note the absent user manager; anything about our unit fails.
        let ours: Vec<&str> = msgs.lines().filter(|l| l.contains("corral.service")).collect();
        assert!(ours.is_empty() && v.status.success(), "systemd-analyze verify: {msgs}");
    } else {
        eprintln!("systemd-analyze not installed: unit not verified");
    }

    let out = stdout(&run_corral_env(&["service", "uninstall", "--no-start"], &env, DEADLINE));
    assert!(out.contains("removed"), "{out}");
    assert!(!unit_path.exists());
    let out = stdout(&run_corral_env(&["service", "uninstall", "--no-start"], &env, DEADLINE));
    assert!(out.contains("no service file"), "{out}");
}

#[test]
fn under_the_service_settings_logs_are_json_lines_in_the_log_file() {
    let dir = TempDir::new("svc-log");
    let log = dir.path().join("logs/corral.log");
    let model = fake_model(dir.path(), "fake", json!({}));
    let gw = Gateway::start_in_env(
        dir,
        &["--model", model.to_str().unwrap()],
        &[("CORRAL_LOG_FORMAT", "json"), ("CORRAL_LOG_FILE", log.to_str().unwrap())],
    );
    assert_eq!(gw.get("/health").status, 200);
    let text = std::fs::read_to_string(&log).expect("log file written");
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert!(lines.iter().any(|l| l["message"] == "gateway listening"), "{text}");
    assert!(gw.stderr.lock().unwrap().iter().all(|l| !l.contains("gateway listening")));
}
