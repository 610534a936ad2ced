//! The layer every host drives: the task runner and the host core.
//!
//! * [`task`]: one stage task, sans I/O (decode, gate, logic, fold state,
//!   ticks, partitioning, stamping).
//! * [`partition`]: Kafka's default partitioner; [`identity`]: sender
//!   identities; [`holds`]: hold diagnostics.

pub mod holds;
pub mod identity;
pub mod partition;
pub mod task;
