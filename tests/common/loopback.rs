//! A test server on 127.0.0.1 in a thread of its own: a current-thread runtime accepts
//! connections and hands each to `conn` on a task; dropping the `Loopback` stops it and
//! joins the thread. The stand-ins (`fake_hub`, `tls_front`) differ only in `conn`.

use std::future::Future;

pub struct Loopback {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Loopback {
    pub fn start<F, Fut>(conn: F) -> Self
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let accept = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else { continue };
                        tokio::spawn(conn(tcp));
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Self { port, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
