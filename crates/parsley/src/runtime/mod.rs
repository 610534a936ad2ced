//! The layer every host drives: the task runner and the host core.
//!
//! * [`worker`]: the host core, one per stream thread: assignment, start
//!   positions, position capture, transactions over many tasks, abort and
//!   fencing, punctuation. Every host drives it.
//! * [`task`]: one stage task, sans I/O (decode, gate, logic, fold state,
//!   ticks, partitioning, stamping).
//! * [`failure`]: what a failure does: the task that failed stops, the
//!   others go on, and a restart waits one step of its backoff.
//! * [`changelog`]: how a task's stores travel through changelog topics and
//!   come back; [`local`]: the same stores kept on the host's disk between
//!   runs; [`restore`]: a starting task's changelog replay as a job a host
//!   can run off its processing path; [`paging`]: held records kept on
//!   disk instead of in memory.
//! * [`metrics`]: what each task records through the metrics facade, and
//!   the snapshot a host publishes.
//! * [`host`]: what a host supplies (topic metadata, broker offsets,
//!   changelog reads) and the values it exchanges with the worker.
//! * [`partition`]: Kafka's default partitioner; [`identity`]: sender
//!   identities; [`holds`]: hold diagnostics; [`query`]: reads of a
//!   task's committed fold state, after causes when asked.

pub mod changelog;
pub mod failure;
pub mod holds;
pub mod host;
pub mod identity;
pub mod local;
pub mod metrics;
pub mod paging;
pub mod partition;
pub mod query;
pub mod restore;
pub mod task;
pub mod worker;
