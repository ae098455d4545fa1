//! The service definitions `corral service install` writes, as pure functions of a
//! `Spec`: a systemd user unit (Linux) and a launchd LaunchAgent property list (macOS).

use std::path::{Path, PathBuf};

/// launchd's label and the unit's name.
pub const LABEL: &str = "dev.corral.serve";
pub const UNIT: &str = "corral.service";

/// What the service runs and where its files go.
pub struct Spec {
    /// The `corral` binary (absolute).
    pub exe: PathBuf,
    /// Arguments after `serve` (the user's flags); `--no-open` is always added.
    pub serve_args: Vec<String>,
    /// Where a LaunchAgent's stdout/stderr go (launchd does not rotate them, so corral
    /// writes its own size-bounded log file there and these catch only what escapes it).
    pub log_dir: PathBuf,
    /// How long `corral serve` may take to stop (its drain deadline plus the engines'
    /// SIGTERM → SIGKILL deadline); the service manager waits longer than this.
    pub stop_secs: u64,
}

impl Spec {
    /// The full command line: the binary, `serve`, `--no-open`, the user's flags.
    pub fn argv(&self) -> Vec<String> {
        let mut v = vec![self.exe.display().to_string(), "serve".to_owned(), "--no-open".to_owned()];
        v.extend(self.serve_args.iter().cloned());
        v
    }

    /// The size-bounded log file corral writes under launchd.
    pub fn log_file(&self) -> PathBuf {
        self.log_dir.join("corral.log")
    }
}

/// One word of a unit's `ExecStart=`, quoted for systemd: inside double quotes `\` and
/// `"` are escaped, and the specifier and variable characters `%`/`$` doubled.
fn systemd_word(w: &str) -> String {
    let mut out = String::with_capacity(w.len() + 2);
    out.push('"');
    for c in w.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A systemd user unit: restarted on failure (not on a clean stop), the whole control
/// group (the gateway and its engines) stopped together, and a stop timeout above
/// corral's own drain deadline so a clean stop is never cut short.
pub fn systemd_unit(spec: &Spec) -> String {
    let exec: Vec<String> = spec.argv().iter().map(|w| systemd_word(w)).collect();
    format!(
        "[Unit]\n\
         Description=corral local LLM server\n\
         Documentation=https://github.com/corral-llm/corral\n\
         \n\
         [Service]\n\
         Type=exec\n\
         ExecStart={exec}\n\
         Environment=CORRAL_LOG_FORMAT=json\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         KillMode=control-group\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec={stop}\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        exec = exec.join(" "),
        stop = spec.stop_secs + 10,
    )
}

/// A LaunchAgent: started at login, restarted when it exits unsuccessfully (KeepAlive
/// on failure only), not more often than every 10 s, JSON logs to a size-bounded file.
pub fn launchd_plist(spec: &Spec) -> Vec<u8> {
    use plist::{Dictionary, Value};
    let path = |p: &Path| Value::String(p.display().to_string());
    let mut keep_alive = Dictionary::new();
    keep_alive.insert("SuccessfulExit".into(), Value::Boolean(false));
    let mut env = Dictionary::new();
    env.insert("CORRAL_LOG_FORMAT".into(), Value::String("json".into()));
    env.insert("CORRAL_LOG_FILE".into(), path(&spec.log_file()));
    let mut d = Dictionary::new();
    d.insert("Label".into(), Value::String(LABEL.into()));
    d.insert("ProgramArguments".into(), Value::Array(spec.argv().into_iter().map(Value::String).collect()));
    d.insert("RunAtLoad".into(), Value::Boolean(true));
    d.insert("KeepAlive".into(), Value::Dictionary(keep_alive));
    d.insert("ThrottleInterval".into(), Value::Integer(10.into()));
    d.insert("ExitTimeOut".into(), Value::Integer((spec.stop_secs + 10).into()));
    d.insert("ProcessType".into(), Value::String("Interactive".into()));
    d.insert("EnvironmentVariables".into(), Value::Dictionary(env));
    d.insert("StandardOutPath".into(), path(&spec.log_dir.join("stdout.log")));
    d.insert("StandardErrorPath".into(), path(&spec.log_dir.join("stderr.log")));
    let mut out = Vec::new();
    Value::Dictionary(d).to_writer_xml(&mut out).expect("writing to a Vec cannot fail");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            exe: PathBuf::from("/opt/my tools/corral"),
            serve_args: vec!["--port".into(), "9000".into(), "--model".into(), "a=/m/100%$HOME\"x\".gguf".into()],
            log_dir: PathBuf::from("/Users/me/Library/Logs/corral"),
            stop_secs: 20,
        }
    }

    #[test]
    fn unit_quotes_every_word_and_keeps_the_stop_deadline_above_ours() {
        let u = systemd_unit(&spec());
        assert!(u.contains(
            r#"ExecStart="/opt/my tools/corral" "serve" "--no-open" "--port" "9000" "--model" "a=/m/100%%$$HOME\"x\".gguf""#
        ));
        assert!(u.contains("TimeoutStopSec=30\n"));
        assert!(u.contains("Restart=on-failure\n") && u.contains("KillMode=control-group\n"));
        assert!(u.contains("WantedBy=default.target\n"));
    }

    #[test]
    fn plist_round_trips_with_the_arguments_intact() {
        let bytes = launchd_plist(&spec());
        let v = plist::Value::from_reader_xml(&bytes[..]).expect("valid plist");
        let d = v.as_dictionary().expect("a dictionary");
        assert_eq!(d.get("Label").and_then(|v| v.as_string()), Some(LABEL));
        let args: Vec<&str> = d
            .get("ProgramArguments")
            .and_then(|v| v.as_array())
            .unwrap()
            .iter()
            .map(|v| v.as_string().unwrap())
            .collect();
        assert_eq!(args, spec().argv());
        assert_eq!(d.get("RunAtLoad").and_then(|v| v.as_boolean()), Some(true));
        let keep = d.get("KeepAlive").and_then(|v| v.as_dictionary()).unwrap();
        assert_eq!(keep.get("SuccessfulExit").and_then(|v| v.as_boolean()), Some(false));
        assert_eq!(d.get("ThrottleInterval").and_then(|v| v.as_signed_integer()), Some(10));
        let env = d.get("EnvironmentVariables").and_then(|v| v.as_dictionary()).unwrap();
        assert_eq!(
            env.get("CORRAL_LOG_FILE").and_then(|v| v.as_string()),
            Some("/Users/me/Library/Logs/corral/corral.log")
        );
    }
}
