//! A small HTTP/1.1 server for the tests that put a filter in front of one: a thread per
//! connection reads the request head and answers `200 OK`, recording the heads it read.
//! Included by tests/common/mod.rs and, through `#[path]`, by the dev crate's tests.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An HTTP/1.1 server on `addr`: a thread per connection reads the request head and answers
/// `200 OK`; the requests it read are recorded.
pub struct HttpServer {
    stop: Arc<AtomicBool>,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    pub fn start(addr: SocketAddr) -> HttpServer {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (s, g) = (stop.clone(), got.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let g = g.clone();
                        std::thread::spawn(move || answer(conn, &g));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        HttpServer {
            stop,
            got,
            thread: Some(thread),
        }
    }

    /// The requests read so far.
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.got.lock().unwrap().clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads a request head (up to its empty line) from `conn`, records it and answers 200.
fn answer(mut conn: TcpStream, got: &Mutex<Vec<Vec<u8>>>) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return, // a flow the filter dropped: nothing came
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    got.lock().unwrap().push(head);
    let body = b"ok\n";
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(reply.as_bytes());
    let _ = conn.write_all(body);
}
