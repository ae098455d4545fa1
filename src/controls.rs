//! `corral load MODEL` and `corral stop MODEL`: a running gateway's model controls
//! (`POST /api/models/{id}/load` and `/unload`, the engines page's buttons). Each waits
//! for the action to finish — the engine ready, or gone — with a spinner on a terminal,
//! then prints one line; an unknown model is the gateway's 404 message and a non-zero exit.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use corral_protocol::ModelId;

use crate::client::{Target, block_on};
use crate::human;
use crate::ps::EngineInfo;

#[derive(Args)]
pub struct ControlArgs {
    /// The model's id, as `/v1/models` lists it.
    model: String,
    #[command(flatten)]
    target: Target,
    /// How long to wait for the gateway's answer (a load waits for the engine to be ready).
    #[arg(long, default_value = "15m", value_parser = crate::serve::parse_duration, env = "CORRAL_CLIENT_TIMEOUT")]
    timeout: Duration,
}

/// Ask, wait with a spinner, read the model's `/engine` entry from the answer.
fn control(args: &ControlArgs, action: &str, doing: &str) -> Result<(EngineInfo, Duration)> {
    // Checked here so a typo with a `/` in it never reaches another route.
    let id =
        ModelId::new(args.model.as_str()).map_err(|e| anyhow::anyhow!("{:?} is not a model id: {e}", args.model))?;
    let gw = args.target.gateway()?;
    let spinner = indicatif::ProgressBar::new_spinner().with_message(format!("{doing} {id}…"));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let t = Instant::now();
    let answer = block_on(gw.post(&format!("/api/models/{id}/{action}"), args.timeout));
    spinner.finish_and_clear();
    let view: EngineInfo = serde_json::from_slice(&answer?).context("reading the gateway's answer")?;
    Ok((view, t.elapsed()))
}

pub fn load(args: ControlArgs) -> Result<()> {
    let (view, took) = control(&args, "load", "loading")?;
    println!("{}", loaded(&view, took)?);
    Ok(())
}

pub fn stop(args: ControlArgs) -> Result<()> {
    let (view, took) = control(&args, "unload", "stopping")?;
    println!("{}", stopped(&view, took)?);
    Ok(())
}

/// `smol is ready: pid 4242 on cpu (1.3s)`.
pub fn loaded(e: &EngineInfo, took: Duration) -> Result<String> {
    if e.state != "ready" {
        bail!("{} is {} after the load", e.model, e.state);
    }
    let pid = e.pid.map_or_else(String::new, |p| format!("pid {p}"));
    let device = e.device.as_deref().map_or_else(String::new, |d| format!(" on {d}"));
    Ok(format!("{} is ready: {pid}{device} ({})", e.model, human::duration(took)))
}

/// `smol stopped (0.4s)`; an engine still there when the gateway's stop deadline ran out
/// (it has been killed by then) is an error, so a script notices.
pub fn stopped(e: &EngineInfo, took: Duration) -> Result<String> {
    if e.state != "stopped" {
        bail!("{} is still {} after the stop deadline; `corral ps` shows what it does", e.model, e.state);
    }
    Ok(format!("{} stopped ({})", e.model, human::duration(took)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: &str, pid: Option<u32>) -> EngineInfo {
        let json = serde_json::json!({"model": "smol", "state": state, "pid": pid, "device": "cpu",
                                      "in_flight": 0, "started_at": 1, "last_used_at": 2});
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_load_answer_says_where_the_engine_runs() {
        let ready = loaded(&view("ready", Some(4242)), Duration::from_millis(1_340)).unwrap();
        assert_eq!(ready, "smol is ready: pid 4242 on cpu (1.3s)");
        let e = loaded(&view("starting", None), Duration::ZERO).unwrap_err();
        assert_eq!(e.to_string(), "smol is starting after the load");
    }

    #[test]
    fn a_stop_is_done_only_once_the_engine_is_stopped() {
        assert_eq!(stopped(&view("stopped", None), Duration::from_millis(420)).unwrap(), "smol stopped (0.4s)");
        let e = stopped(&view("draining", Some(7)), Duration::ZERO).unwrap_err().to_string();
        assert!(e.starts_with("smol is still draining after the stop deadline"), "{e}");
    }
}
