//! Resetting a node's committed state so that its application reprocesses
//! its inputs (what `parsley reset` writes while the application is
//! stopped).
//!
//! A reset cannot simply delete the state, as a Kafka Streams reset deletes
//! its changelogs, because the node's history does not end at a reset: it
//! goes on sending under the same sender id, and everything it sent before
//! stays in its causal past. So three things outlive a reset:
//!
//! - **Send sequences** (`sq/<channel>`). Receivers remember the highest
//!   sequence they delivered from this sender, and the id is stable across
//!   a reset. Sequences restarted at 1 would be taken for records those
//!   receivers already delivered, so a claim on a new record would count
//!   as met before that record arrived: a causal violation downstream, not
//!   only duplicates.
//! - **The past it delivered**, as carried ancestry (`ca`). What the node
//!   sends after the reset comes after what it sent before, which came
//!   after what it had delivered. Its stamps must go on claiming that past
//!   (each input's frontier and advertised clock fold into carried
//!   ancestry, as when an input leaves the scope), or a receiver that
//!   lags on one of those inputs could deliver a new emission before a
//!   cause of an old one. The claims name records that exist and that
//!   receivers have usually delivered long ago: an over-claim, never a
//!   wait on something that will not come.
//! - **The recorded scope**, so the next start is not mistaken for a
//!   redeploy that adds inputs (which would seed them past their history).
//!
//! Everything else goes: frontiers, advertised clocks, held records,
//! delivered marks, skip marks and steps past. The inputs are read again
//! from their reset positions, and the gate rebuilds all of it.
//!
//! **History below a reset position.** A position above the log start
//! leaves records that are never delivered again. Offset claims on them
//! are met by the frontier the starting position sets. Sequence claims are
//! not: they name a sender's sequence, and nothing here tells which
//! sequences lie below the position. The operator's tool reads them (the
//! highest committed sequence of each sender below the position,
//! [`ResetPoint::below`], from a `read_committed` scan that stops at the
//! last stable offset) and the reset turns them into skip marks bounded by
//! the position, so a claim on one of those records is met while a record
//! at or above the position is still delivered.

use std::collections::BTreeMap;

use crate::store::{ScopeRecord, StateKey, StoreRead, WriteBatch, decode_i64, encode_pair};
use crate::{Channel, SenderId, SenderTag, VectorClock};

/// Where one input is read again from after a reset, and what lies below.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResetPoint {
    /// The offset the consumer starts at.
    pub position: i64,
    /// For each sender with committed records between the log start and
    /// `position`: the highest send sequence among them.
    pub below: BTreeMap<SenderId, i64>,
}

impl ResetPoint {
    /// The point at `position` of a channel whose committed records below
    /// it are `records` (offset and sender tag, in any order; records at or
    /// above `position` are ignored).
    pub fn scan(
        position: i64,
        records: impl IntoIterator<Item = (i64, Option<SenderTag>)>,
    ) -> ResetPoint {
        let mut below = BTreeMap::new();
        for (offset, tag) in records {
            if let Some(tag) = tag.filter(|_| offset < position) {
                let seq = below.entry(tag.sender).or_insert(tag.seq);
                *seq = (*seq).max(tag.seq);
            }
        }
        ResetPoint { position, below }
    }
}

/// A store a reset cannot rewrite.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResetError {
    /// An entry no node writes: the reset does not know whether it may go.
    #[error("the state holds a key no node writes ({key:?}); refusing to reset it")]
    UnknownKey {
        /// The key's text.
        key: String,
    },
    /// An entry that does not decode.
    #[error("the state's entry {key:?} does not decode: {reason}")]
    Corrupt {
        /// The key's text.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A reset point for a channel the state's recorded scope does not
    /// consume (an application description from a build that added an
    /// input). Its skip marks would make the restore refuse the state, so
    /// nothing is written.
    #[error(
        "the reset names {channel}, which the state's recorded inputs do not include ({inputs}): run the application once with the build that adds it, or reset with the description the state was written by"
    )]
    NotAnInput {
        /// The channel named.
        channel: Channel,
        /// The recorded inputs.
        inputs: String,
    },
}

/// Whether a reset keeps the entry as it is (carried ancestry is kept
/// and grows).
pub fn survives_reset(key: &StateKey) -> bool {
    matches!(
        key,
        StateKey::Scope | StateKey::SendSeq(_) | StateKey::CarriedAncestry
    )
}

/// The writes that turn `store` into the reset state: each input's
/// frontier and advertised clock folded into carried ancestry, deletes for
/// every entry a reset drops, and a skip mark for each sender with records
/// below a reset position. Writes only what differs, so a second reset of
/// the same state with the same points writes nothing.
///
/// A state with no recorded scope belongs to a node that never committed
/// (typically one that failed on its first records, the usual reason for
/// a reset): it gets no skip marks. Its next start is its first, and the
/// first record it reads on each channel seeds that channel's frontier, so
/// what lies below the position needs no marks; marks without a scope
/// would only make the restore refuse the state. Points on channels
/// outside a recorded scope are refused ([`ResetError::NotAnInput`]) for
/// the same reason, before anything is written.
pub fn reset_writes(
    store: &dyn StoreRead,
    points: &BTreeMap<Channel, ResetPoint>,
) -> Result<WriteBatch, ResetError> {
    let scope = recorded_scope(store)?;
    let mut wanted: BTreeMap<StateKey, Vec<u8>> = BTreeMap::new();
    if let Some(scope) = &scope {
        for (&channel, point) in points {
            if !scope.inputs.contains(&channel) {
                return Err(ResetError::NotAnInput {
                    channel,
                    inputs: scope.inputs_text(),
                });
            }
            for (&sender, &seq) in &point.below {
                wanted.insert(
                    StateKey::SkipMark(channel, sender),
                    encode_pair(seq, point.position),
                );
            }
        }
    }
    let mut batch = WriteBatch::new();
    let mut failure = None;
    let mut carried_before: Option<Vec<u8>> = None;
    let mut past = VectorClock::default();
    store.for_each_state(&mut |key, value| {
        let key = match key {
            Err(text) => {
                failure.get_or_insert(ResetError::UnknownKey {
                    key: text.to_owned(),
                });
                return;
            }
            Ok(key) => key,
        };
        let corrupt = |reason: String| ResetError::Corrupt {
            key: key.to_key(),
            reason,
        };
        let folded = match key {
            StateKey::CarriedAncestry => {
                carried_before = Some(value.to_vec());
                VectorClock::decode(value)
                    .map(|c| past.merge(&c))
                    .map_err(|e| corrupt(e.to_string()))
            }
            StateKey::Frontier(c) => decode_i64(value)
                .map(|f| past.claim_offset(c, f))
                .map_err(corrupt),
            StateKey::ChannelClock(_) => VectorClock::decode(value)
                .map(|c| past.merge(&c))
                .map_err(|e| corrupt(e.to_string())),
            _ => Ok(false),
        };
        if let Err(e) = folded {
            failure.get_or_insert(e);
        }
        if survives_reset(&key) {
            return;
        }
        match wanted.get(&key) {
            Some(v) if v.as_slice() == value => {
                wanted.remove(&key);
            }
            Some(_) => {}
            None => batch.delete(key),
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let carried = past.encode();
    if carried_before.as_deref() != Some(carried.as_slice())
        && !(carried_before.is_none() && past.is_empty())
    {
        batch.put(StateKey::CarriedAncestry, carried);
    }
    for (key, value) in wanted {
        batch.put(key, value);
    }
    Ok(batch)
}

/// The state's recorded scope, if it has one.
fn recorded_scope(store: &dyn StoreRead) -> Result<Option<ScopeRecord>, ResetError> {
    let mut scope = None;
    store.for_each_state(&mut |key, value| {
        if key == Ok(StateKey::Scope) {
            scope = Some(
                ScopeRecord::decode(value).map_err(|reason| ResetError::Corrupt {
                    key: StateKey::Scope.to_key(),
                    reason,
                }),
            );
        }
    });
    scope.transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::encode_i64;
    use crate::{MemStore, TopicId};

    fn ch(t: u128, p: i32) -> Channel {
        Channel::new(TopicId::from_u128(t), p)
    }

    fn sender(n: u128) -> SenderId {
        SenderId::from_u128(n)
    }

    fn full_store() -> MemStore {
        let mut s = MemStore::new();
        let mut b = WriteBatch::new();
        b.put(
            StateKey::Scope,
            ScopeRecord {
                inputs: vec![ch(1, 0)],
                sinks: vec![TopicId::from_u128(2)],
            }
            .encode(),
        );
        b.put_i64(StateKey::Frontier(ch(1, 0)), 41);
        let mut advertised = VectorClock::default();
        advertised.claim_offset(ch(5, 0), 7);
        b.put(StateKey::ChannelClock(ch(1, 0)), advertised.encode());
        let mut carried = VectorClock::default();
        carried.claim_offset(ch(6, 1), 3);
        b.put(StateKey::CarriedAncestry, carried.encode());
        b.put_pair(StateKey::QueueMeta(ch(1, 0)), 3, 5);
        b.put(StateKey::QueuePage(ch(1, 0), 3), vec![9; 4]);
        b.put_i64(StateKey::SendSeq(ch(2, 0)), 17);
        b.put_pair(StateKey::DeliveredSeq(ch(1, 0), sender(7)), 12, 40);
        b.put_pair(StateKey::SkipMark(ch(1, 0), sender(8)), 2, 3);
        b.put(StateKey::Stepped(ch(1, 0), 39), vec![1]);
        s.apply(&b);
        s
    }

    fn after(store: &MemStore, batch: &WriteBatch) -> MemStore {
        let mut s = store.clone();
        s.apply(batch);
        s
    }

    #[test]
    fn a_reset_keeps_send_sequences_ancestry_and_scope_and_drops_the_rest() {
        let store = full_store();
        let reset = after(&store, &reset_writes(&store, &BTreeMap::new()).unwrap());
        let mut kept = Vec::new();
        reset.for_each_state(&mut |k, _| kept.push(k.unwrap()));
        assert_eq!(
            kept,
            vec![
                StateKey::Scope,
                StateKey::CarriedAncestry,
                StateKey::SendSeq(ch(2, 0)),
            ]
        );
        assert_eq!(
            reset.get_state(StateKey::SendSeq(ch(2, 0))),
            Some(&encode_i64(17)[..])
        );
        // The delivered past (frontier and advertised clock) joins what was
        // carried, so the stamps after the reset still claim it.
        let carried =
            VectorClock::decode(reset.get_state(StateKey::CarriedAncestry).unwrap()).unwrap();
        assert_eq!(carried.offset(ch(6, 1)), Some(3));
        assert_eq!(carried.offset(ch(1, 0)), Some(41));
        assert_eq!(carried.offset(ch(5, 0)), Some(7));
    }

    #[test]
    fn a_scan_keeps_the_highest_sequence_of_each_sender_below_the_position() {
        let tag = |s, seq| {
            Some(SenderTag {
                sender: sender(s),
                seq,
            })
        };
        let point = ResetPoint::scan(
            10,
            vec![
                (3, tag(1, 4)),
                (4, None),
                (5, tag(1, 6)),
                (6, tag(2, 1)),
                (10, tag(2, 9)),
            ],
        );
        assert_eq!(point.position, 10);
        assert_eq!(
            point.below,
            BTreeMap::from([(sender(1), 6), (sender(2), 1)])
        );
    }

    #[test]
    fn records_below_a_reset_position_become_skip_marks_bounded_by_it() {
        let store = full_store();
        let points = BTreeMap::from([(
            ch(1, 0),
            ResetPoint {
                position: 30,
                below: BTreeMap::from([(sender(7), 9), (sender(8), 4)]),
            },
        )]);
        let reset = after(&store, &reset_writes(&store, &points).unwrap());
        assert_eq!(
            reset.get_state(StateKey::SkipMark(ch(1, 0), sender(7))),
            Some(&encode_pair(9, 30)[..])
        );
        assert_eq!(
            reset.get_state(StateKey::SkipMark(ch(1, 0), sender(8))),
            Some(&encode_pair(4, 30)[..])
        );
        assert_eq!(
            reset.get_state(StateKey::DeliveredSeq(ch(1, 0), sender(7))),
            None
        );
    }

    #[test]
    fn a_second_reset_writes_nothing() {
        let store = full_store();
        let points = BTreeMap::from([(
            ch(1, 0),
            ResetPoint {
                position: 30,
                below: BTreeMap::from([(sender(8), 4)]),
            },
        )]);
        let first = reset_writes(&store, &points).unwrap();
        assert!(!first.is_empty());
        let reset = after(&store, &first);
        assert!(reset_writes(&reset, &points).unwrap().is_empty());
    }

    #[test]
    fn a_key_no_node_writes_is_refused() {
        let mut store = BTreeMap::new();
        store.insert("not-a-key".to_owned(), vec![0]);
        assert_eq!(
            reset_writes(&store, &BTreeMap::new()),
            Err(ResetError::UnknownKey {
                key: "not-a-key".to_owned()
            })
        );
    }

    #[test]
    fn an_entry_that_does_not_decode_is_refused() {
        let mut store = full_store();
        let mut b = WriteBatch::new();
        b.put(StateKey::Frontier(ch(1, 0)), vec![1, 2, 3]);
        store.apply(&b);
        assert!(matches!(
            reset_writes(&store, &BTreeMap::new()),
            Err(ResetError::Corrupt { .. })
        ));
    }
}
