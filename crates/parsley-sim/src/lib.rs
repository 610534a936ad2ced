//! # parsley-sim: the conformance kit
//!
//! A deterministic simulator that hosts the real protocol under seeded random
//! interleavings, and a ground-truth oracle that judges every delivery
//! against real happened-before, never against the protocol's own clocks.
//! It is this project's primary correctness gate, and a library so that
//! another host can run the same verification.
//!
//! * [`SimBroker`]: partitions with real offset occupancy (records, commit
//!   and abort markers, aborted records), `read_committed` fetch, retention,
//!   destroyable topics; it answers the protocol's broker-offset queries.
//! * [`SimNode`]: the reference host, one duty at a time (H1-H6); see its
//!   module docs. [`HostFault`] switches one duty off.
//! * [`SimWorld`]: the seeded scheduler (ChaCha8), with budgets that make
//!   worlds drain, and the weighting that buys crashes while records are
//!   held.
//! * [`Oracle`]: causal order, per-channel FIFO, no duplicates and no
//!   re-entry of a node's causal past on every delivery; completeness at
//!   drain, judged for an input added by a redeploy from the host's own
//!   start position and the oracle's claim envelope.
//! * [`AppWorld`]: whole applications on production host cores (anything
//!   behind [`HostThread`]) under a consumer group with rebalances,
//!   zombies, fencing, aborts, crashes, changelogs and retention.
//! * [`EdgeProducer`]: plain producers and observers at the topology's edge.
//! * [`Behavior`]: forward, fan-out, filter, damped feedback; ticks via
//!   [`TickSpec`].
//! * [`EagerProtocol`]: a protocol that ignores claims, which the oracle must
//!   flag.
//! * [`Trace`]: the run digest behind [`SimWorld::trace_hash`].
//!
//! ## A precondition the kit makes explicit: retention and holds
//!
//! The truncation sweep drops stamp-side claims below each channel's log
//! start, on the grounds that retention has deleted those records. That is
//! sound only if no consumer still *holds* such a record: a node holding
//! `c@5` when the log start passes 5 can later receive an effect of `c@5`
//! whose only claim on it was truncated away upstream, and deliver the
//! effect first. The world's retention therefore never moves a log start
//! past a record some consumer still holds (nor past what it has fetched).
//! Operationally: retention on a causal topic must cover consumer lag *and*
//! the longest hold.
//!
//! ## Running a world
//!
//! ```
//! use parsley_protocol::CausalNode;
//! use parsley_sim::*;
//!
//! let config = WorldConfig::new(&[("c1", 1), ("c2", 1)])
//!     .node(NodeSpec::new("p1", &[("c1", 0)], &["c2"], Behavior::Forward(vec![Output::to("c2", 0)])))
//!     .node(NodeSpec::new("check", &[("c1", 0), ("c2", 0)], &[], Behavior::Sink))
//!     .edge(EdgeSpec::producer("source", &[("c1", 0)]));
//! let mut config = config;
//! config.budget.edge_ops = 20;
//! let mut world = SimWorld::<CausalNode>::new(config, 7)?;
//! let stats = world.run()?;
//! assert!(stats.deliveries >= 40);
//! # Ok::<(), WorldFailure>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod app_world;
pub mod behavior;
pub mod broker;
pub mod eager;
pub mod edge;
pub mod node;
pub mod oracle;
pub mod trace;
pub mod world;

pub use app_world::{
    AppBudget, AppFailure, AppStats, AppWorld, AppWorldConfig, Assignor, ConsumerMoves, HostThread,
    HostTransaction, Outcome, SimDirective, SimFault, StoreFault, Streamed, TaskAct, TaskSpec,
    ThreadFactory,
};
pub use behavior::{Behavior, Output, Payload, Route};
pub use broker::{Entry, SimBroker, StoredRecord};
pub use eager::EagerProtocol;
pub use edge::{EdgeProducer, EdgeSpec};
pub use node::{
    HostFault, NodeAction, NodeSpec, Rescope, Reset, ResetTo, SimNode, StartCrash, StartPolicy,
    StepReport, TickSpec, check_offset_claims,
};
pub use oracle::{ActorId, Oracle, RecordId, Violation};
pub use trace::Trace;
pub use world::{Budget, Join, SimWorld, WorldConfig, WorldFailure, WorldStats};
