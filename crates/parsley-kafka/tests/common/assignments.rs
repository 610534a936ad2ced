//! Every "assignment taken" event of the process (a stream thread starts
//! the tasks of a new assignment, once per rebalance it takes part in):
//! when, and on which thread. Stream threads are named
//! `parsley-<application>-<instance>-<index>`, so a test counts the
//! rebalances of its own application by the thread name's prefix.
//!
//! The first call installs a process-wide tracing subscriber, so a suite
//! that uses this is a test binary of its own.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The events so far, as (when, thread name).
pub fn taken() -> &'static Mutex<Vec<(Instant, String)>> {
    static TAKEN: OnceLock<Mutex<Vec<(Instant, String)>>> = OnceLock::new();
    TAKEN.get_or_init(|| {
        tracing_subscriber::registry()
            .with(Capture.with_filter(Targets::new().with_target("parsley", tracing::Level::INFO)))
            .init();
        Mutex::new(Vec::new())
    })
}

/// Every "task started" event (a task restored from its changelogs and
/// started on a stream thread), as (when, thread name). Install the
/// capture with [`taken`] first.
pub fn started() -> &'static Mutex<Vec<(Instant, String)>> {
    static STARTED: OnceLock<Mutex<Vec<(Instant, String)>>> = OnceLock::new();
    STARTED.get_or_init(|| Mutex::new(Vec::new()))
}

/// How many tasks the stream threads of `instance` of `application`
/// started so far.
pub fn tasks_started(application: &str, instance: &str) -> usize {
    let prefix = format!("parsley-{application}-{instance}-");
    started()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(_, t)| t.starts_with(&prefix))
        .count()
}

/// How many assignments the stream threads of `application` took so far.
pub fn count(application: &str) -> usize {
    let prefix = format!("parsley-{application}-");
    taken()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(_, t)| t.starts_with(&prefix))
        .count()
}

struct Capture;

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut message = Taken(None);
        event.record(&mut message);
        let log = match message.0 {
            Some(Kind::Assignment) => taken(),
            Some(Kind::Task) => started(),
            None => return,
        };
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        log.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now(), thread));
    }
}

enum Kind {
    Assignment,
    Task,
}

/// Whether an event's message is "assignment taken" or "task started".
struct Taken(Option<Kind>);

impl Visit for Taken {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            match format!("{value:?}").as_str() {
                "assignment taken" => self.0 = Some(Kind::Assignment),
                "task started" => self.0 = Some(Kind::Task),
                _ => {}
            }
        }
    }
}
