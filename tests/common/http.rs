//! A minimal blocking HTTP/1.1 client over a unix or TCP stream: enough to check
//! statuses, headers and bodies, to read SSE events as they arrive (chunked encoding),
//! and to hang up mid-stream on purpose.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

pub fn unix(path: &Path) -> Box<dyn Stream> {
    let s = UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    Box::new(s)
}

pub fn tcp(addr: &str) -> Box<dyn Stream> {
    let s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    Box::new(s)
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn send(stream: &mut dyn Stream, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    // A server may answer (413) and close before reading a large body: the response is
    // still there to read, so a failed body write is not the test's failure.
    if let Some(b) = body {
        let _ = stream.write_all(b);
    }
    let _ = stream.flush();
}

/// Status line and headers, leaving the reader at the body.
pub fn read_head(r: &mut BufReader<Box<dyn Stream>>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    (status, headers)
}

/// Reads a body: chunked, by length, or to EOF. A chunked body cut short (no final
/// zero-size chunk) is reported as `complete == false`.
pub struct BodyReader {
    pub r: BufReader<Box<dyn Stream>>,
    chunked: bool,
    remaining: Option<usize>,
    pub complete: bool,
    done: bool,
}

impl BodyReader {
    pub fn new(r: BufReader<Box<dyn Stream>>, headers: &[(String, String)]) -> Self {
        let h = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone());
        let chunked = h("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let remaining = h("content-length").and_then(|v| v.parse().ok());
        Self { r, chunked, remaining, complete: false, done: false }
    }

    /// Next piece of body bytes; `None` at the end (or when the connection drops).
    pub fn next_piece(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        if self.chunked {
            let mut line = String::new();
            if self.r.read_line(&mut line).ok()? == 0 {
                self.done = true;
                return None;
            }
            let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
            if size == 0 {
                let mut crlf = String::new();
                let _ = self.r.read_line(&mut crlf);
                self.done = true;
                self.complete = true;
                return None;
            }
            let mut buf = vec![0; size + 2];
            if self.r.read_exact(&mut buf).is_err() {
                self.done = true;
                return None;
            }
            buf.truncate(size);
            Some(buf)
        } else if let Some(n) = self.remaining {
            let mut buf = vec![0; n];
            let ok = self.r.read_exact(&mut buf).is_ok();
            self.done = true;
            self.complete = ok;
            ok.then_some(buf)
        } else {
            let mut buf = Vec::new();
            let _ = self.r.read_to_end(&mut buf);
            self.done = true;
            self.complete = true;
            (!buf.is_empty()).then_some(buf)
        }
    }

    pub fn read_all(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(p) = self.next_piece() {
            out.extend(p);
        }
        out
    }
}

/// Send `head` (request line, headers and the blank line, exactly as given) and `body`
/// on a fresh TCP connection to `addr`, and read the answer: for requests a well-behaved
/// client would not send. The server may answer and close before reading all of `body`.
pub fn raw(addr: &str, head: &str, body: &[u8]) -> Response {
    let mut s = tcp(addr);
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let body = BodyReader::new(r, &headers).read_all();
    Response { status, headers, body }
}

pub fn request(
    mut stream: Box<dyn Stream>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Response {
    send(stream.as_mut(), method, path, body, headers);
    let mut r = BufReader::new(stream);
    let (status, headers) = read_head(&mut r);
    let mut b = BodyReader::new(r, &headers);
    let body = b.read_all();
    Response { status, headers, body }
}

/// An open SSE response: events (the `data:` payloads) as they arrive.
pub struct Sse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: BodyReader,
    buf: String,
}

impl Sse {
    pub fn open(mut stream: Box<dyn Stream>, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Self {
        send(stream.as_mut(), "POST", path, Some(body), headers);
        let mut r = BufReader::new(stream);
        let (status, headers) = read_head(&mut r);
        let body = BodyReader::new(r, &headers);
        Self { status, headers, body, buf: String::new() }
    }

    pub fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let ev: String = self.buf.drain(..i + 2).collect();
                let data: Vec<&str> = ev.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                if data.is_empty() {
                    continue; // comments / keep-alives
                }
                return Some(data.join("\n"));
            }
            let piece = self.body.next_piece()?;
            self.buf.push_str(&String::from_utf8_lossy(&piece));
        }
    }

    /// All remaining events.
    pub fn collect(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_event()).collect()
    }
}
