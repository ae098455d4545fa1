//! The pool's long-running tasks: one per engine process (spawn, ready, watch until the
//! exit) and the keep-alive timer. Both feed events to the slots through the driver.

use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_protocol::ModelId;
use corral_protocol::launch::EngineLaunch;

use crate::child::{self, ExitInfo};
use crate::event::{Event, Exit, Proc, StopReason};
use crate::pool::{Shared, now};
use crate::procs::{Started, wait_exit};

/// The health probe after the ready line (the engine answers it from its I/O thread).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// One engine process from spawn to reaped exit: spawn, wait for the ready line and a
/// health answer (within the load timeout), then watch until it exits.
pub(crate) async fn run_engine(shared: Arc<Shared>, id: ModelId, generation: u64, launch: EngineLaunch) {
    let socket = launch.socket.clone();
    let Started { pid, ready, mut exited, tail, hold } = match shared.procs.start(launch).await {
        Ok(s) => s,
        Err(e) => {
            let line = format!("spawn failed: {e}");
            tracing::error!(model = %id, error = %e, "could not start the engine");
            let info = ExitInfo { code: None, signal: None, at: child::unix_secs(), stderr_tail: vec![line.clone()] };
            if let Some(m) = shared.lock().models.get_mut(&id) {
                m.last_exit = Some(info);
            }
            shared.step(&id, Event::Exited { generation, exit: Exit { code: None, signal: None, line } });
            return;
        }
    };
    if let Some(m) = shared.lock().models.get_mut(&id) {
        m.exited = Some(exited.clone());
        m.tail = Some(tail.clone());
    }
    shared.step(&id, Event::Spawned { generation, proc: Proc { pid, socket: socket.clone() } });
    let up = async {
        // A closed ready channel means the process ended: let the exit branch win.
        let Ok(device) = ready.await else { return std::future::pending().await };
        if let Some(m) = shared.lock().models.get_mut(&id) {
            m.device = Some(device);
        }
        shared.procs.probe(socket.clone(), PROBE_TIMEOUT).await
    };
    let mut watch = exited.clone();
    tokio::select! {
        r = tokio::time::timeout(shared.cfg.load_timeout, up) => match r {
            Ok(Ok(card)) => {
                if let (Some(card), Some(m)) = (card, shared.lock().models.get_mut(&id)) {
                    m.card = Some(card);
                }
                shared.step(&id, Event::Ready { generation });
            }
            Ok(Err(why)) => {
                tracing::error!(model = %id, pid, error = %why, "engine announced ready but does not answer; killing it");
                shared.step(&id, Event::Stop { why: StopReason::LoadTimeout, pid: Some(pid) });
            }
            Err(_) => {
                tracing::error!(model = %id, pid, "engine did not become ready in time; killing it");
                shared.step(&id, Event::Stop { why: StopReason::LoadTimeout, pid: Some(pid) });
            }
        },
        _ = wait_exit(&mut watch) => {}
    }
    let mut info = wait_exit(&mut exited).await;
    if info.stderr_tail.is_empty() {
        info.stderr_tail = tail.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
    }
    let line = child::last_error_line(&info.stderr_tail).unwrap_or_else(|| "no output".into());
    tracing::info!(model = %id, pid, code = ?info.code, signal = ?info.signal, "engine exited");
    let exit = Exit { code: info.code, signal: info.signal, line };
    if let Some(m) = shared.lock().models.get_mut(&id) {
        m.last_exit = Some(info);
        if m.slot.live_generation() == Some(generation) {
            m.exited = None;
        }
    }
    shared.step(&id, Event::Exited { generation, exit });
    drop(hold);
}

/// Stop engines idle past `ttl`. It sleeps until the earliest expiry, or until a lease
/// changes something.
pub(crate) async fn keep_alive_loop(shared: Arc<Shared>, ttl: Duration) {
    loop {
        let notified = shared.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (due, next): (Vec<ModelId>, Option<Instant>) = {
            let g = shared.lock();
            if g.shutting_down {
                return;
            }
            let t = now();
            let deadlines: Vec<(ModelId, Instant)> = g
                .models
                .iter()
                .filter(|(_, m)| !m.settings.pin)
                .filter_map(|(id, m)| Some((id.clone(), m.slot.keep_alive_due(ttl)?)))
                .collect();
            let next = deadlines.iter().map(|(_, at)| *at).filter(|at| *at > t).min();
            (deadlines.into_iter().filter(|(_, at)| *at <= t).map(|(id, _)| id).collect(), next)
        };
        for id in &due {
            tracing::info!(model = %id, ttl_s = ttl.as_secs_f64(), "keep-alive expired; stopping the idle engine");
            shared.step(id, Event::Stop { why: StopReason::KeepAlive, pid: None });
        }
        if !due.is_empty() {
            continue;
        }
        let expiry = async {
            match next {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                // Nothing is idle and ready: only a change can make something expire.
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = &mut notified => {}
            _ = expiry => {}
        }
    }
}
