//! `corral service install|uninstall|status|logs`: run `corral serve` under the
//! platform's service manager — a systemd user unit on Linux, a LaunchAgent on macOS.
//! The files come from `files` (pure); this module writes them and drives
//! `systemctl --user` / `launchctl`.

mod files;
pub mod logfile;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use files::{LABEL, Spec, UNIT};

#[derive(Args)]
pub struct ServiceArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Write the service file and start corral at login (and now).
    Install(InstallArgs),
    /// Stop the service and remove its file.
    Uninstall(ManageArgs),
    /// What the service manager says about it.
    Status,
    /// Show the service's logs.
    Logs(LogsArgs),
}

#[derive(Args)]
struct InstallArgs {
    /// Print the file and the commands instead of writing or running anything.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    manage: ManageArgs,
    /// Flags for `corral serve`, after `--` (e.g. `-- --port 9000 --model-pool 2`).
    #[arg(last = true)]
    serve_args: Vec<String>,
}

#[derive(Args)]
struct ManageArgs {
    /// Only write (or remove) the file; do not ask the service manager to start (stop) it.
    #[arg(long)]
    no_start: bool,
}

#[derive(Args)]
struct LogsArgs {
    /// Keep printing new lines.
    #[arg(short, long)]
    follow: bool,
    /// Lines to show.
    #[arg(short = 'n', long, default_value_t = 100)]
    lines: usize,
}

/// Which service manager this platform has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Manager {
    Systemd,
    Launchd,
}

const MANAGER: Manager = if cfg!(target_os = "macos") { Manager::Launchd } else { Manager::Systemd };

fn home() -> Result<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).context("HOME is not set")
}

/// Where the service file lives.
fn file_path() -> Result<PathBuf> {
    Ok(match MANAGER {
        Manager::Systemd => match std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => home()?.join(".config"),
        }
        .join("systemd/user")
        .join(UNIT),
        Manager::Launchd => home()?.join("Library/LaunchAgents").join(format!("{LABEL}.plist")),
    })
}

fn spec(serve_args: Vec<String>) -> Result<Spec> {
    let exe = std::env::current_exe().context("finding the corral binary")?;
    // serve's default drain deadline plus the engines' SIGTERM -> SIGKILL deadline.
    Ok(Spec { exe, serve_args, log_dir: home()?.join("Library/Logs/corral"), stop_secs: 20 })
}

fn contents(spec: &Spec) -> Vec<u8> {
    match MANAGER {
        Manager::Systemd => files::systemd_unit(spec).into_bytes(),
        Manager::Launchd => files::launchd_plist(spec),
    }
}

fn uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// The commands that start (`true`) or stop the installed service.
fn manager_commands(start: bool, path: &std::path::Path) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let domain = format!("gui/{}", uid());
    match (MANAGER, start) {
        (Manager::Systemd, true) => {
            vec![s(&["systemctl", "--user", "daemon-reload"]), s(&["systemctl", "--user", "enable", "--now", UNIT])]
        }
        (Manager::Systemd, false) => vec![s(&["systemctl", "--user", "disable", "--now", UNIT])],
        (Manager::Launchd, true) => vec![s(&["launchctl", "bootstrap", &domain, &path.display().to_string()])],
        (Manager::Launchd, false) => vec![s(&["launchctl", "bootout", &format!("{domain}/{LABEL}")])],
    }
}

fn run(cmd: &[String]) -> Result<()> {
    let status =
        Command::new(&cmd[0]).args(&cmd[1..]).status().with_context(|| format!("running {}", cmd.join(" ")))?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd.join(" "));
    }
    Ok(())
}

/// Write `bytes` to `path` through a temporary file and a rename: never half-written.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("service file has no directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn install(args: InstallArgs) -> Result<()> {
    let spec = spec(args.serve_args)?;
    let path = file_path()?;
    let bytes = contents(&spec);
    let cmds = if args.manage.no_start { vec![] } else { manager_commands(true, &path) };
    if args.dry_run {
        println!("# {}", path.display());
        print!("{}", String::from_utf8_lossy(&bytes));
        for c in &cmds {
            println!("# then: {}", c.join(" "));
        }
        return Ok(());
    }
    write_atomic(&path, &bytes)?;
    println!("wrote {}", path.display());
    for c in &cmds {
        run(c)?;
    }
    if !cmds.is_empty() {
        println!("corral is running as a service and will start at login; `corral service status` shows it");
    }
    Ok(())
}

fn uninstall(args: ManageArgs) -> Result<()> {
    let path = file_path()?;
    if !args.no_start && path.exists() {
        for c in manager_commands(false, &path) {
            // Already stopped is fine: the file still goes.
            if let Err(e) = run(&c) {
                eprintln!("corral: warning: {e:#}");
            }
        }
    }
    match std::fs::remove_file(&path) {
        Ok(()) => println!("removed {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("no service file at {}", path.display()),
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    if MANAGER == Manager::Systemd && !args.no_start {
        let _ = run(&["systemctl", "--user", "daemon-reload"].map(String::from));
    }
    Ok(())
}

fn status() -> Result<()> {
    let path = file_path()?;
    if !path.exists() {
        bail!("not installed (no {}); `corral service install` installs it", path.display());
    }
    println!("service file: {}", path.display());
    match MANAGER {
        Manager::Systemd => run(&["systemctl", "--user", "--no-pager", "status", UNIT].map(String::from)),
        Manager::Launchd => run(&["launchctl".into(), "print".into(), format!("gui/{}/{LABEL}", uid())]),
    }
}

fn logs(args: LogsArgs) -> Result<()> {
    let n = args.lines.to_string();
    let cmd: Vec<String> = match MANAGER {
        Manager::Systemd => {
            let mut c: Vec<String> =
                ["journalctl", "--user", "--unit", UNIT, "--no-pager", "-n", &n].map(String::from).to_vec();
            if args.follow {
                c.push("--follow".into());
            }
            c
        }
        Manager::Launchd => {
            let file = spec(vec![])?.log_file();
            let mut c = vec!["tail".to_owned(), "-n".to_owned(), n];
            if args.follow {
                c.push("-F".into());
            }
            c.push(file.display().to_string());
            c
        }
    };
    run(&cmd)
}

pub fn service(args: ServiceArgs) -> Result<()> {
    match args.action {
        Action::Install(a) => install(a),
        Action::Uninstall(a) => uninstall(a),
        Action::Status => status(),
        Action::Logs(a) => logs(a),
    }
}
