//! Crashes on a real broker: the ledger example runs as a child process and
//! is killed with SIGKILL mid-stream; a second instance of the same
//! application takes over. Every order is settled exactly once in the
//! committed output: nothing lost, nothing duplicated.
//!
//! Needs a broker (`PARSLEY_BOOTSTRAP`); a plain `cargo test` skips it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bootstrap, config, create_topics, unique};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Produces orders `from..to` to `topic`, one every 10 ms, on its own
/// thread, so a kill lands while records still arrive.
fn produce_paced(topic: &str, from: usize, to: usize) -> std::thread::JoinHandle<()> {
    let topic = topic.to_owned();
    std::thread::spawn(move || {
        let producer: BaseProducer = config().create().unwrap();
        for i in from..to {
            let key = format!("k{i:04}");
            producer
                .send(
                    BaseRecord::to(&topic)
                        .partition(0)
                        .key(&key)
                        .payload(&format!("{i}")),
                )
                .map_err(|(e, _)| e)
                .unwrap();
            producer.flush(Duration::from_secs(20)).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// Waits until `n` outputs are committed (the instance made progress).
fn wait_for_progress(topic: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while read(topic, n, Duration::from_secs(3)).len() < n {
        assert!(Instant::now() < deadline, "the instance made no progress");
    }
}

/// Every order settled once, in order, and nothing more committed.
fn assert_exactly_once(topic: &str, out: &[(String, String)], n: usize) {
    let expected: Vec<(String, String)> = (0..n)
        .map(|i| (format!("k{i:04}"), format!("order {i}")))
        .collect();
    assert_eq!(out, expected.as_slice(), "exactly once, in order");
    assert_eq!(
        read(topic, n + 1, Duration::from_secs(3)).len(),
        n,
        "no duplicates: nothing else was committed"
    );
}

/// The ledger example, built by `cargo test` next to this test binary.
fn ledger_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("examples").join("ledger");
    assert!(bin.exists(), "{} not built", bin.display());
    bin
}

/// Starts an instance and waits until it says it runs.
fn spawn(args: &[&str]) -> Child {
    let mut child = Command::new(ledger_binary())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "running", "the instance did not start");
    // Keep reading, so the instance can print until it exits; its last
    // line (its rejoin count) shows in the test's output.
    let name = args.last().map_or_else(String::new, |s| (*s).to_owned());
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            eprintln!("instance {name}: {line}");
        }
    });
    child
}

/// Committed (key, value) pairs of `topic`, read until `n` arrived or
/// `within` passed.
fn read(topic: &str, n: usize, within: Duration) -> Vec<(String, String)> {
    common::read_committed(topic, 1, n, within)
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect()
}

#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_killed_instance_loses_and_duplicates_nothing() {
    let (o, p, s, app) = (
        unique("orders"),
        unique("payments"),
        unique("settled"),
        unique("app"),
    );
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let bootstrap = bootstrap();
    let args = [
        bootstrap.as_str(),
        app.as_str(),
        o.as_str(),
        p.as_str(),
        s.as_str(),
    ];
    const N: usize = 400;
    let feeding = produce_paced(&o, 0, N);

    let mut first = spawn(&args);
    // Let it commit part of the stream, then kill it without warning.
    wait_for_progress(&s, 50);
    first.kill().unwrap();
    first.wait().unwrap();
    let at_kill = read(&s, N, Duration::from_secs(2)).len();

    let mut second = spawn(&args);
    feeding.join().unwrap();
    let out = read(&s, N, Duration::from_secs(90));
    drop(second.stdin.take());
    let closed = second.wait().unwrap();

    assert!(
        at_kill < N,
        "the kill landed mid-stream ({at_kill} of {N} committed)"
    );
    eprintln!(
        "{at_kill} of {N} committed when the first instance was killed; {} after the second",
        out.len()
    );
    assert_eq!(out.len(), N, "nothing lost");
    assert_exactly_once(&s, &out, N);
    assert!(closed.success(), "the second instance closed cleanly");
}

/// A zombie is fenced: an instance frozen with SIGSTOP mid-stream loses its
/// task to another instance; when it wakes, its commit is refused, nothing
/// it wrote becomes visible, and it gives the task up (the other instance
/// finishes the stream exactly once). Then it joins the group again as a
/// healthy member: once the other instance leaves, the woken one takes the
/// task over and settles the next orders, exactly once.
#[test]
#[ignore = "needs a broker: set PARSLEY_BOOTSTRAP"]
fn a_frozen_instance_is_fenced_when_it_wakes() {
    let (o, p, s, app) = (
        unique("orders"),
        unique("payments"),
        unique("settled"),
        unique("app"),
    );
    create_topics(&[(&o, 1), (&p, 1), (&s, 1)]);
    let bootstrap = bootstrap();
    let args = |instance: &'static str| {
        vec![
            bootstrap.clone(),
            app.clone(),
            o.clone(),
            p.clone(),
            s.clone(),
            instance.to_owned(),
        ]
    };
    const N: usize = 300;
    const M: usize = 100;
    let feeding = produce_paced(&o, 0, N);
    let a_args = args("a");
    let mut a = spawn(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    wait_for_progress(&s, 30);
    let signal = |sig: &str, child: &Child| {
        let ok = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    };
    signal("-STOP", &a);
    let frozen_at = read(&s, N, Duration::from_secs(2)).len();
    let b_args = args("b");
    let mut b = spawn(&b_args.iter().map(String::as_str).collect::<Vec<_>>());
    feeding.join().unwrap();
    let out = read(&s, N, Duration::from_secs(120));
    assert!(frozen_at < N, "frozen mid-stream");
    assert_exactly_once(&s, &out, N);
    signal("-CONT", &a);
    std::thread::sleep(Duration::from_secs(5));
    // The live instance leaves; the woken one must take the task over.
    drop(b.stdin.take());
    let b_exit = b.wait().unwrap();
    assert!(b_exit.success(), "the live instance closed cleanly");
    produce_paced(&o, N, N + M).join().unwrap();
    let out = read(&s, N + M, Duration::from_secs(120));
    drop(a.stdin.take());
    let a_exit = a.wait().unwrap();
    eprintln!(
        "{frozen_at} of {N} committed when frozen; {} of {} in the end; the woken instance exited with {a_exit}",
        out.len(),
        N + M
    );
    assert_exactly_once(&s, &out, N + M);
    assert!(
        a_exit.success(),
        "the woken instance rejoined and closed cleanly"
    );
}
