//! What the registry suites share: the registry's address, unique names,
//! a gate that can cut the registry off, and the Confluent serializer run
//! through Python.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// The registry's Confluent-compatible URL: `PARSLEY_SCHEMA_REGISTRY`, which
/// the test command sets to the Apicurio Registry it starts. Point it at a
/// registry of your own (Confluent's included) to run the suite there.
pub fn registry_url() -> String {
    std::env::var("PARSLEY_SCHEMA_REGISTRY").expect(
        "PARSLEY_SCHEMA_REGISTRY is not set: run ./scripts/test, or start a registry with scripts/registry/apicurio start and export its URL",
    )
}

/// A name no earlier run used (the registry keeps its subjects).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{nanos:x}_{}", N.fetch_add(1, Ordering::SeqCst))
}

/// A TCP relay in front of the registry that can be closed and opened: a
/// registry that goes down and comes back, with the real one behind it.
/// While closed it refuses new connections and cuts the open ones.
pub struct Gate {
    base: String,
    open: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections made through the gate while it was open.
    pub connections: Arc<AtomicU64>,
}

impl Gate {
    /// A gate in front of the registry at `url`, open or closed.
    pub fn new(url: &str, open: bool) -> Gate {
        let rest = url
            .strip_prefix("http://")
            .expect("the gate relays plain http");
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let target = authority.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let gate = Gate {
            base: format!("http://{local}/{path}"),
            open: Arc::new(AtomicBool::new(open)),
            streams: Arc::default(),
            connections: Arc::default(),
        };
        let (is_open, streams, connections) = (
            gate.open.clone(),
            gate.streams.clone(),
            gate.connections.clone(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !is_open.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                connections.fetch_add(1, Ordering::SeqCst);
                {
                    let mut s = streams.lock().unwrap();
                    s.push(client.try_clone().unwrap());
                    s.push(server.try_clone().unwrap());
                }
                relay(client.try_clone().unwrap(), server.try_clone().unwrap());
                relay(server, client);
            }
        });
        gate
    }

    /// The registry's URL through the gate.
    pub fn url(&self) -> String {
        self.base.trim_end_matches('/').to_owned()
    }

    /// Closes the gate: the registry is unreachable until [`open`](Self::open).
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Opens the gate.
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Runs Confluent's own Python serializer (confluent-kafka's
/// `AvroSerializer` and `AvroDeserializer`) against the registry, through
/// `scripts/registry/confluent_interop.py`. The interpreter is
/// `PARSLEY_CONFLUENT_PYTHON`, the virtual environment the test command
/// prepares with scripts/registry/confluent-python.
pub fn confluent(args: &[&str], stdin: &str) -> String {
    let python = std::env::var("PARSLEY_CONFLUENT_PYTHON").expect(
        "PARSLEY_CONFLUENT_PYTHON is not set: run ./scripts/test, or point it at a Python with confluent-kafka[avro,schemaregistry] (scripts/registry/confluent-python prints one)",
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/registry/confluent_interop.py"
    );
    let mut child = Command::new(python)
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the Confluent interop script starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Confluent serializer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
