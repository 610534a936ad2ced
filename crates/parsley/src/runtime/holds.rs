//! Hold diagnostics: which record is held, and what it is waiting for.
//!
//! Only queue heads are reported: a head blocks its channel, so the records
//! queued behind it wait on it, not on causes of their own. Reports carry
//! coordinates, claims and watermarks, never key or value bytes.

use std::fmt;

use parsley_protocol::{Channel, SenderId, TopicId, UnmetClaim, VectorClock};

use crate::message::Coordinate;

/// Why a claim is not yet met, with the stable `vc-hold-*` code of each case.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Diagnosis {
    /// The claimed record has not been fetched here yet: it is in flight, or
    /// not yet written. Look at the cause topic's producer and lag.
    NotFetched,
    /// The claimed record has been fetched here (or the consumer has
    /// fetched past its offset, which a transaction marker occupies) but a
    /// held head on that channel keeps the claim unmet; follow that head.
    HeldUpstream,
    /// A sequence claim names a sender this task has never delivered a
    /// record from on that channel.
    SenderUnseen,
    /// A sequence claim is ahead of what has been delivered from that sender
    /// on that channel: its later records are in flight or uncommitted.
    SenderBehind,
}

impl Diagnosis {
    /// The stable log code.
    pub fn code(self) -> &'static str {
        match self {
            Diagnosis::NotFetched => "vc-hold-not-fetched",
            Diagnosis::HeldUpstream => "vc-hold-held-upstream",
            Diagnosis::SenderUnseen => "vc-hold-sender-unseen",
            Diagnosis::SenderBehind => "vc-hold-sender-behind",
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Diagnosis::NotFetched => {
                "the cause has not reached this consumer yet; check the cause topic's producer and lag"
            }
            Diagnosis::HeldUpstream => {
                "the cause is fetched but held itself; follow that channel's head"
            }
            Diagnosis::SenderUnseen => {
                "nothing from that sender has been delivered on the channel yet"
            }
            Diagnosis::SenderBehind => {
                "that sender's later records are in flight or their transaction is open"
            }
        }
    }
}

/// One cause a held record is still waiting for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum WaitingOn {
    /// An offset claim: every record up to `offset` on the channel.
    Offset {
        /// The claimed channel's topic name.
        topic: String,
        /// The claimed partition.
        partition: i32,
        /// The claimed offset.
        offset: i64,
        /// Delivered (or skipped) up to here on that channel.
        frontier: i64,
        /// Highest offset fetched on that channel.
        received: i64,
        /// Last consumer position reported for that channel.
        position: i64,
        /// Why it is unmet.
        diagnosis: Diagnosis,
    },
    /// A sequence claim: every record `sender` sent to the channel up to
    /// send sequence `seq`.
    Sequence {
        /// The claimed channel's topic name.
        topic: String,
        /// The claimed partition.
        partition: i32,
        /// The claimed sender.
        sender: SenderId,
        /// The claimed send sequence.
        seq: i64,
        /// The highest sequence delivered from that sender on the channel.
        delivered_seq: Option<i64>,
        /// Why it is unmet.
        diagnosis: Diagnosis,
    },
}

impl WaitingOn {
    /// The diagnostics form of one of the protocol's unmet claims, with
    /// topic names from `name`.
    pub(crate) fn from_unmet(u: UnmetClaim, name: impl Fn(Channel) -> String) -> WaitingOn {
        match u {
            UnmetClaim::Offset {
                channel,
                offset,
                frontier,
                received,
                position,
            } => WaitingOn::Offset {
                topic: name(channel),
                partition: channel.partition,
                offset,
                frontier,
                received,
                position,
                // Fetched through the claim: the record itself, or the
                // consumer's position past it (a transaction marker or an
                // aborted record there is never handed over). Then the gap
                // is a held head on that channel, not the fetch.
                diagnosis: if received >= offset || position > offset {
                    Diagnosis::HeldUpstream
                } else {
                    Diagnosis::NotFetched
                },
            },
            UnmetClaim::Sequence {
                channel,
                sender,
                seq,
                delivered,
            } => WaitingOn::Sequence {
                topic: name(channel),
                partition: channel.partition,
                sender,
                seq,
                delivered_seq: delivered.map(|d| d.seq),
                diagnosis: if delivered.is_some() {
                    Diagnosis::SenderBehind
                } else {
                    Diagnosis::SenderUnseen
                },
            },
        }
    }

    /// The diagnosis.
    pub fn diagnosis(&self) -> Diagnosis {
        match self {
            WaitingOn::Offset { diagnosis, .. } | WaitingOn::Sequence { diagnosis, .. } => {
                *diagnosis
            }
        }
    }

    /// The claimed channel's topic name.
    pub fn topic(&self) -> &str {
        match self {
            WaitingOn::Offset { topic, .. } | WaitingOn::Sequence { topic, .. } => topic,
        }
    }
}

impl fmt::Display for WaitingOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitingOn::Offset {
                topic,
                partition,
                offset,
                frontier,
                position,
                diagnosis,
                ..
            } => write!(
                f,
                "{} waiting on {topic}:{partition} offset {offset} (local frontier {frontier}, position {position}): {}",
                diagnosis.code(),
                diagnosis.advice()
            ),
            WaitingOn::Sequence {
                topic,
                partition,
                sender,
                seq,
                delivered_seq,
                diagnosis,
            } => write!(
                f,
                "{} waiting on {topic}:{partition} sender {sender} seq {seq} (delivered {}): {}",
                diagnosis.code(),
                delivered_seq.map_or("none".to_owned(), |s| s.to_string()),
                diagnosis.advice()
            ),
        }
    }
}

/// A record gating its channel: the head of a hold queue.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HeldRecord {
    /// The stage.
    pub stage: String,
    /// The task's partition.
    pub task_partition: i32,
    /// The held record's own coordinate.
    pub coordinate: Coordinate,
    /// The held record's timestamp.
    pub timestamp: i64,
    /// How long (by the host's wall clock) the record has gated its
    /// channel: since it became the head of its queue (on arrival, or when
    /// the head before it was delivered). A head restored from the
    /// changelog counts from its restore.
    pub held_for_ms: i64,
    /// Records in the channel's queue, the head included.
    pub queue_depth: usize,
    /// Every cause it still waits for.
    pub waiting_on: Vec<WaitingOn>,
}

impl HeldRecord {
    /// A one-line, payload-free summary.
    pub fn summary(&self) -> String {
        let causes: Vec<String> = self.waiting_on.iter().map(ToString::to_string).collect();
        format!(
            "stage '{}' task {} has held {} for {}ms (queue depth {}): {}",
            self.stage,
            self.task_partition,
            self.coordinate,
            self.held_for_ms,
            self.queue_depth,
            causes.join("; ")
        )
    }
}

impl fmt::Display for HeldRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// Sorts holds longest-held first; equal ages in stage and coordinate
/// order, so every listing (a task's, a driver's, an instance's) is
/// deterministic and reads the same.
pub fn sort_longest_first(held: &mut [HeldRecord]) {
    held.sort_by(|a, b| {
        b.held_for_ms
            .cmp(&a.held_for_ms)
            .then_with(|| a.stage.cmp(&b.stage))
            .then_with(|| a.coordinate.cmp(&b.coordinate))
    });
}

/// A clock as `{topic:partition <= offset, topic:partition seq(sender) <= seq}`,
/// with topic ids and senders named by `topic` and `sender` (payload-free,
/// for logs and debug output).
pub(crate) fn describe_clock(
    clock: &VectorClock,
    topic: impl Fn(TopicId) -> String,
    sender: impl Fn(SenderId) -> String,
) -> String {
    let mut parts: Vec<String> = clock
        .offsets()
        .iter()
        .map(|o| {
            format!(
                "{}:{} <= {}",
                topic(o.channel.topic),
                o.channel.partition,
                o.offset
            )
        })
        .collect();
    parts.extend(clock.sequences().iter().map(|q| {
        format!(
            "{}:{} seq({}) <= {}",
            topic(q.channel.topic),
            q.channel.partition,
            sender(q.sender),
            q.seq
        )
    }));
    format!("{{{}}}", parts.join(", "))
}
