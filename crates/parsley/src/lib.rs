//! # parsley
//!
//! (crate docs: see below)
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod app;
pub mod codec;
mod driver;
pub mod fold;
pub mod holds;
pub mod identity;
mod logic;
mod message;
pub mod partition;
pub mod probes;
mod stage;
pub mod task;
mod topic;

pub use app::{CompositionError, OwnedNames, Parsley};
pub use codec::{BoxError, Codec, CodecError, Decoded};
pub use driver::{
    DEFAULT_STEP_BUDGET, DriverError, Input, OutputRecord, RawRecord, StageDelivery, TestDriver,
    TestDriverBuilder,
};
pub use fold::{FoldKey, FoldStore, FoldWrites};
pub use holds::{Diagnosis, HeldRecord, WaitingOn};
pub use logic::{
    FoldOutput, HandlerOutput, LogicError, Next, Step, recovering, recovering_fold,
};
pub use message::{Coordinate, Header, Message, Tick};
pub use probes::{Finding, Note, NoteKind, Probe, ProbeFailure, ProbeReport, Samples, probe};
pub use stage::{
    DEFAULT_HOLD_WARNING_AFTER, Stage, StageBuilder, StageError, StateMode, Stateful, Stateless,
};
pub use task::{TaskError, TaskId};
pub use topic::{Emission, IntoNullable, Part, Payload, Topic};

/// The protocol core this crate runs on, re-exported for building raw
/// clocks in tests and for hosts.
pub use parsley_protocol as protocol;
