//! # parsley
//!
//! Causal delivery order for Kafka stream processing. A record reaches your
//! logic only after every cause of it that your stage consumes has been
//! delivered there; when A causally precedes B, every stage that consumes
//! both processes A before B. Nothing is ever reordered, dropped or released
//! on a timeout: a record whose cause is missing waits, and state that
//! cannot be trusted fails the task.
//!
//! This is the crate applications are written against. Your logic is pure
//! functions over values; everything imperative (gating, decoding, state,
//! stamping, partitioning, the transaction) lives in the stage runtime. The
//! broker-less [`TestDriver`] runs that runtime in memory, so the whole
//! application, its ordering guarantee included, is testable in plain
//! `cargo test`. This crate has no C dependencies.
//!
//! ## A walk through: two stages, state and ticks
//!
//! **Topics** are typed values declared once, with their codecs. A hop
//! between stages is the same `Topic` used as one stage's sink and the
//! next stage's source.
//!
//! ```
//! use parsley::{Codec, Topic};
//! // account id -> order total
//! let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
//! // account id -> payment amount
//! let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
//! // account id -> balance after an order was settled
//! let settlements: Topic<String, i64> = Topic::new("settlements", Codec::utf8(), Codec::int64());
//! ```
//!
//! **Logic** is a handler (message to emissions) or a fold (state and
//! message to a [`Step`]: next state plus emissions). Emissions are minted
//! by their topic, `topic.send(key, value)`, and compare with `==`, so logic
//! tests need no runtime at all. (Logic that forwards a key or value it was
//! handed takes the message by value instead, with
//! [`StageBuilder::on_owned`] or [`StageBuilder::fold_owned`], and moves
//! them into its emission.)
//!
//! ```
//! # use parsley::{Codec, Topic};
//! use parsley::{Message, Step};
//! # let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
//! # let settlements: Topic<String, i64> = Topic::new("settlements", Codec::utf8(), Codec::int64());
//! let out = settlements.clone();
//! let settle = move |balance: i64, m: &Message<String, i64>| {
//!     let next = balance - m.value().copied().unwrap_or(0);
//!     Step::to(next).emit(out.send(m.key().cloned(), next))
//! };
//! assert_eq!(
//!     settle(100, &Message::new(&orders, "acct-1", 30)),
//!     Step::to(70).emit(settlements.send("acct-1", 70))
//! );
//! ```
//!
//! **Stages** wire logic to topics. The first stage keeps a balance per
//! account (state is keyed by the message key's encoded bytes); the second
//! stage watches settlements and, once a minute, emits an audit cut from a
//! tick: wall-clock time that reaches logic as a delivered record.
//! [`Parsley::named`] composes them under an application id, which names
//! every topic and store the application owns.
//!
//! ```
//! use std::time::Duration;
//! use parsley::{Codec, Parsley, Stage, Step, Tick, TestDriver, Topic, Input};
//!
//! let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
//! let payments: Topic<String, i64> = Topic::new("payments", Codec::utf8(), Codec::int64());
//! let settlements: Topic<String, i64> = Topic::new("settlements", Codec::utf8(), Codec::int64());
//! let audits: Topic<String, String> = Topic::new("audits", Codec::utf8(), Codec::utf8());
//!
//! // Declaring a sink hands back what the logic emits through (`Copy`, so
//! // each closure takes its own); a handle exists only for a declared sink.
//! let mut settlement = Stage::named("settlement").state(Codec::int64(), || 0);
//! let out = settlement.add_sink(&settlements);
//! let balances = settlement.store(Codec::utf8()); // typed state, for tests
//! let settlement = settlement
//!     .fold(&orders, move |balance, m| {
//!         let next = balance - m.value().copied().unwrap_or(0);
//!         Step::to(next).emit(out.send(m.key().cloned(), next))
//!     })
//!     .fold(&payments, |balance, m| {
//!         Step::to(balance + m.value().copied().unwrap_or(0))
//!     })
//!     .build()?;
//!
//! // The auditor counts settlements per account and cuts on each tick.
//! let mut auditor = Stage::named("auditor").state(Codec::int64(), || 0);
//! let cuts = auditor.add_sink(&audits);
//! let seen = auditor.store(Codec::utf8());
//! let auditor = auditor
//!     .fold(&settlements, |seen, _m| Step::to(seen + 1))
//!     .tick_fold(Duration::from_secs(60), move |ticks, tick: &Tick| {
//!         Step::to(ticks + 1).emit(cuts.send(None, format!("cut {} at {}", ticks + 1, tick.timestamp())))
//!     })
//!     .build()?;
//!
//! let app = Parsley::named("payments-app", [settlement, auditor])?;
//! assert_eq!(app.tick_topic("auditor"), Some("payments-app-auditor-ticks"));
//!
//! // Test the wiring: pipe records in, read committed outputs back.
//! let mut driver = TestDriver::new(&app)?;
//! driver.pipe(&payments, "acct-1", 100)?;
//! driver.pipe(&orders, "acct-1", 30)?;
//! assert_eq!(driver.read_value(&settlements)?, Some(Some(70)));
//! assert!(driver.is_empty(&settlements)?); // every output read
//! assert_eq!(driver.state(&balances, "acct-1")?, Some(70));
//! assert_eq!(driver.state(&seen, "acct-1")?, Some(1));
//!
//! // Every output carries the stamp headers that order it downstream.
//! let settled = &driver.records(&settlements)?[0];
//! assert!(settled.is_stamped());
//! assert_eq!(settled.sender(), Some(app.sender_id("settlement", 0)));
//!
//! // See the guarantee: a payment stamped as caused by an order that has
//! // not arrived yet is held, not processed.
//! let order = driver.next_coordinate(&orders, "acct-2")?;
//! driver.pipe_input(&payments, Input::new("acct-2", 50).after(&order))?;
//! let held = driver.held();
//! assert_eq!(held.len(), 1);
//! assert_eq!(held[0].coordinate.topic, "payments");
//! assert_eq!(held[0].waiting_on[0].topic(), "orders");
//! println!("{}", held[0]); // "... vc-hold-not-fetched waiting on orders:0 offset 0 ..."
//!
//! // The cause arrives: the order is processed first, then the payment.
//! driver.pipe(&orders, "acct-2", 20)?;
//! assert!(driver.held().is_empty());
//! let delivered = driver.delivered_to("settlement");
//! let n = delivered.len();
//! assert_eq!(delivered[n - 2], order);
//! assert_eq!(delivered[n - 1].topic, "payments");
//! assert_eq!(driver.read_values(&settlements)?, vec![-20]);
//! assert_eq!(driver.state(&balances, "acct-2")?, Some(30));
//!
//! // Ticks: advancing the wall clock past the interval emits a tick to the
//! // tick topic, which the auditor consumes back through the gate.
//! driver.advance_wall_clock(Duration::from_secs(60))?;
//! assert_eq!(driver.values(&audits)?, vec!["cut 1 at 60000".to_string()]);
//! assert_eq!(driver.tick_state_of(&seen, 0)?, Some(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Errors are values, failures abort
//!
//! A handler or fold may return `Result`. An `Err` (or a panic, or a codec
//! error) fails the task: the step's transaction aborts, nothing it did is
//! committed, and the retry redelivers the same records in the same causal
//! order. In the driver the failing call returns [`DriverError::Task`] and
//! the next call retries. A failure that is a fact of your domain is not a
//! task failure: return it as an emission, or wrap the logic in
//! [`recovering`] / [`recovering_fold`] to route its `Err` to an error sink.
//!
//! ```
//! use parsley::{Codec, DriverError, Emission, Message, Parsley, Stage, TaskError, TestDriver, Topic};
//! let orders: Topic<String, i64> = Topic::new("orders", Codec::utf8(), Codec::int64());
//! let stage = Stage::named("picky")
//!     .on(&orders, |m: &Message<String, i64>| -> Result<Vec<Emission>, String> {
//!         if m.value() == Some(&0) { Err("empty order".into()) } else { Ok(vec![]) }
//!     })
//!     .build()?;
//! let app = Parsley::named("shop", [stage])?;
//! let mut driver = TestDriver::new(&app)?;
//! let err = driver.pipe(&orders, "o-1", 0).unwrap_err();
//! assert!(matches!(err, DriverError::Task(TaskError::Logic { .. })));
//! // Deterministic failures recur on every retry: the record blocks its channel.
//! assert!(driver.run().is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## JSON, dead letters and ticks over state
//!
//! [`Codec::json`] (the default `json` feature) carries serde types.
//! Wrapped in [`Codec::attempting`], a source topic whose producers you do
//! not control delivers bytes that are not valid JSON as
//! [`Decoded::Malformed`] instead of failing the task, and
//! [`Emission::dead_letter`] sends them on with the error and their source
//! coordinate in headers. [`StageBuilder::tick_fold_over`] gives tick logic
//! a read view of every key's state, for periodic summaries.
//! `examples/enrichment.rs` puts the three together
//! (`cargo run -p parsley --example enrichment`).
//!
//! ## Contract probes
//!
//! [`probe`] runs your application in a driver with samples you supply and
//! reports every contract finding at once (key codecs, stamps, sink
//! decoding, undeclared sinks, failing logic, misdirected samples), plus
//! notes (unsampled sources, unreached sinks, tick topics to create, store
//! names to keep stable). See [`probes`].
//!
//! ## Map
//!
//! * [`Topic`], [`Codec`], [`Decoded`]: typed topics and codecs.
//! * [`Message`], [`Tick`], [`Emission`], [`Step`]: what logic sees and
//!   returns; [`recovering`], [`recovering_fold`].
//! * [`Stage`], [`StageBuilder`], [`Parsley`]: wiring and composition;
//!   [`Sink`]: what logic emits through; [`StateView`]: keyed state for
//!   tick logic; [`StateStore`]: typed state for tests.
//! * [`TestDriver`]: the broker-less host; [`HeldRecord`]: hold diagnostics.
//! * [`probe`]: test-time contract probes.
//! * [`runtime`]: what every host drives. [`runtime::worker::Worker`] is
//!   the host core (one per stream thread: task grouping, start positions,
//!   position capture, transactions over many tasks, abort and fencing,
//!   changelog restore, ticks and sweeps); [`task`] is one task's runner;
//!   [`runtime::changelog`] the changelog layout; [`partition`]: Kafka's
//!   default partitioner; [`identity`]: sender identities; [`fold`]: the
//!   fold-state store layout. The TestDriver, the simulator's application
//!   worlds and the Kafka runtime all drive the same worker.
//! * [`protocol`]: the causal protocol core, re-exported.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
// Errors here end a step (the transaction aborts), so they are off the hot
// path; keeping them unboxed keeps them easy to match in tests.
#![allow(clippy::result_large_err)]

// What users write: topics, codecs, messages, logic, fold state, stages,
// the application.
mod api;
// The runner and host core every host drives.
pub mod runtime;
// The broker-less test host and contract probes.
mod testing;

use api::{app, key_filter, logic, message, stage, topic};
pub use api::{codec, describe, fold};
pub use runtime::{holds, identity, partition, task};
use testing::driver;
pub use testing::probes;

pub use app::{CompositionError, OwnedNames, Parsley};
pub use codec::{BoxError, Codec, CodecError, Decoded};
pub use describe::Topology;
pub use driver::{
    DEFAULT_STEP_BUDGET, DriverError, Input, KeyValue, OutputRecord, RawRecord, StageDelivery,
    TestDriver, TestDriverBuilder,
};
pub use fold::{FoldKey, FoldStore, FoldWrites, StateView};
pub use holds::{Diagnosis, HeldRecord, WaitingOn};
pub use logic::{
    Emissions, EmissionsIntoIter, FoldOutput, HandlerOutput, LogicError, Next, Step, recovering,
    recovering_fold,
};
pub use message::{Coordinate, Header, Message, Tick};
pub use probes::{
    Finding, Note, NoteKind, Probe, ProbeFailure, ProbeReport, Samples, probe, probe_cluster,
};
pub use stage::{
    DEFAULT_HOLD_WARNING_AFTER, Stage, StageBuilder, StageError, StateDeclaredFirst, StateMode,
    StateStore, Stateful, Stateless,
};
pub use task::{TaskError, TaskId};
pub use topic::{
    DEAD_LETTER_ERROR, DEAD_LETTER_OFFSET, DEAD_LETTER_PARTITION, DEAD_LETTER_TOPIC, Emission,
    IntoNullable, Part, Payload, Sink, Topic,
};

/// The protocol core this crate runs on, re-exported for building raw
/// clocks in tests and for hosts.
pub use parsley_protocol as protocol;
