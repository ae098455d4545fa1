//! Opening the chat page in the person's browser once `corral serve` listens, when it was
//! started in an interactive terminal (the binary decides that; `--no-open` says no).
//!
//! The opener (`xdg-open` on Linux, `open` on macOS) is spawned detached — no stdio, its
//! own process group (so the terminal's Ctrl-C, meant for the gateway, never reaches the
//! browser) — and reaped on a thread of its own. Any failure is a log line: the server
//! serves the same without a browser.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// The chat page's address; a server bound to every interface is opened on loopback.
pub fn chat_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/#/chat", SocketAddr::new(ip, addr.port()))
}

fn opener() -> &'static str {
    if cfg!(target_os = "macos") { "open" } else { "xdg-open" }
}

/// Open `url` in the default browser, detached; never fails the caller.
pub fn open_in_browser(url: &str) {
    let program = opener();
    let spawned = Command::new(program)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => {
            tracing::info!(url, program, pid = child.id(), "opening the chat page in a browser");
            let url = url.to_owned();
            let reaper = std::thread::Builder::new().name("open-browser".into()).spawn(move || match child.wait() {
                Ok(s) if s.success() => {}
                Ok(s) => tracing::warn!(url, program, status = %s, "the browser opener failed"),
                Err(e) => tracing::warn!(url, program, error = %e, "waiting for the browser opener failed"),
            });
            if let Err(e) = reaper {
                tracing::warn!(error = %e, "no thread to reap the browser opener");
            }
        }
        Err(e) => tracing::warn!(url, program, error = %e, "could not open a browser; open the address yourself"),
    }
}

#[cfg(test)]
mod tests {
    use super::chat_url;

    #[test]
    fn the_chat_page_of_a_wildcard_bind_is_on_loopback() {
        assert_eq!(chat_url("127.0.0.1:8080".parse().unwrap()), "http://127.0.0.1:8080/#/chat");
        assert_eq!(chat_url("0.0.0.0:9000".parse().unwrap()), "http://127.0.0.1:9000/#/chat");
        assert_eq!(chat_url("[::]:9000".parse().unwrap()), "http://[::1]:9000/#/chat");
        assert_eq!(chat_url("192.168.1.2:80".parse().unwrap()), "http://192.168.1.2:80/#/chat");
    }
}
