//! V11: one construction per guard that refuses rather than guesses.

mod common;

use common::*;
use parsley_protocol::store::{PageBuilder, PageEntries, decode_envelope};
use parsley_protocol::*;

const ME: u128 = 0xA11CE;

#[test]
fn record_on_an_unconsumed_channel() {
    let a = ch(1, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    let err = h
        .node
        .on_record(rec(ch(1, 1), 0, VectorClock::new()))
        .unwrap_err();
    assert!(
        matches!(err, ProtocolError::UnconsumedChannel { channel, operation: "record" } if channel == ch(1, 1)),
        "{err}"
    );
    assert_eq!(h.node.stats().delivered_total, 0);
}

#[test]
fn position_advance_on_an_unconsumed_channel() {
    let a = ch(1, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    let err = h.node.position_advance(ch(2, 0), 5).unwrap_err();
    assert!(matches!(
        err,
        ProtocolError::UnconsumedChannel {
            operation: "position advance",
            ..
        }
    ));
}

#[test]
fn send_to_an_undeclared_sink() {
    let a = ch(1, 0);
    let x = ch(9, 0);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 0);
    let mut h = Harness::start(config(sender(ME), &[a], &[x.topic]), broker);
    let err = h.node.prepare_send(ch(8, 0)).unwrap_err();
    assert!(matches!(err, ProtocolError::UndeclaredSink { channel } if channel == ch(8, 0)));
    assert!(matches!(
        h.node.prepare_send(Channel::new(x.topic, -1)),
        Err(ProtocolError::UndeclaredSink { .. })
    ));
    // The refused sends consumed no sequence.
    assert_eq!(h.node.prepare_send(x).unwrap().sender.unwrap().seq, 1);
}

#[test]
fn held_record_on_an_input_leaving_scope() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    assert!(h.feed(rec(b, 0, offsets(&[(a, 3)]))).is_empty());
    let err = h.restart_with(config(sender(ME), &[a], &[])).unwrap_err();
    assert!(
        matches!(err, ProtocolError::HeldRecordsOnDepartingInput { channel, held: 1 } if channel == b),
        "{err}"
    );
    // Nothing was lost: the held record is still in the committed store, and
    // redeclaring the input restores it.
    h.restart_with(config(sender(ME), &[a, b], &[])).unwrap();
    assert_eq!(h.report.restored_held, 1);
}

#[test]
fn hold_queue_restoring_fewer_entries_than_its_indices_claim() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.feed(rec(a, 0, offsets(&[(b, 3)])));
    h.commit();
    h.feed(rec(a, 1, VectorClock::new()));
    h.commit();
    // Two commits, two pages: losing the second loses index 1.
    let lost = StateKey::QueuePage(a, 1).to_string();
    let mut store = h.store.clone();
    assert!(store.remove_raw(&lost).is_some());
    let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
    assert!(
        matches!(err, ProtocolError::MissingHeldRecords { channel, index: 1, head: 0, tail: 2 } if channel == a),
        "{err}"
    );
    // The same in the one-entry-per-record layout.
    let mut store = entry_layout(&h.store);
    assert!(
        store
            .remove_raw(&StateKey::QueueEntry(a, 1).to_string())
            .is_some()
    );
    let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
    assert!(
        matches!(err, ProtocolError::MissingHeldRecords { channel, index: 1, head: 0, tail: 2 } if channel == a),
        "{err}"
    );
}

#[test]
fn a_page_that_holds_fewer_records_than_the_queue_claims_is_missing_records() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.feed(rec(a, 0, offsets(&[(b, 3)])));
    h.feed(rec(a, 1, VectorClock::new()));
    h.commit();
    let key = StateKey::QueuePage(a, 0).to_string();
    let page = h.store.get(&key).unwrap().to_vec();
    let first = PageEntries::new(&page).unwrap().next().unwrap().to_vec();
    let mut one = PageBuilder::new();
    one.push(&decode_envelope(a, &first).unwrap());
    let mut store = h.store.clone();
    store.insert_raw(&key, one.finish());
    let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
    assert!(
        matches!(err, ProtocolError::MissingHeldRecords { channel, index: 1, head: 0, tail: 2 } if channel == a),
        "{err}"
    );
}

#[test]
fn corrupt_pages_are_refused() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.feed(rec(a, 0, offsets(&[(b, 3)])));
    h.feed(rec(a, 1, VectorClock::new()));
    h.commit();
    h.feed(rec(a, 2, VectorClock::new()));
    h.commit();
    let key = StateKey::QueuePage(a, 0).to_string();
    let page = h.store.get(&key).unwrap().to_vec();
    let mut trailing = page.clone();
    trailing.push(0);
    let mut truncated = page.clone();
    truncated.pop();
    let mut zero = page.clone();
    zero[..4].copy_from_slice(&0i32.to_be_bytes());
    let mut negative = page.clone();
    negative[4..8].copy_from_slice(&(-1i32).to_be_bytes());
    let mut damaged = page.clone();
    // The first record's sender tag flag (after the count, its length,
    // its offset and its timestamp).
    damaged[4 + 4 + 16] = 7;
    for (what, bytes) in [
        ("a byte after the last record", trailing),
        ("a truncated record", truncated),
        ("a count of zero", zero),
        ("a negative length", negative),
        ("a record that does not decode", damaged),
    ] {
        let mut store = h.store.clone();
        store.insert_raw(&key, bytes);
        let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
        assert!(
            matches!(err, ProtocolError::CorruptState(ref c) if c.key == key),
            "{what}: {err}"
        );
    }
    // A page overlapping another: index 2 stored twice.
    let mut store = h.store.clone();
    let mut overlap = PageBuilder::new();
    for e in PageEntries::new(&page).unwrap() {
        overlap.push(&decode_envelope(a, e).unwrap());
    }
    overlap.push(&rec(a, 2, VectorClock::new()));
    store.insert_raw(&key, overlap.finish());
    let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
    assert!(
        matches!(err, ProtocolError::CorruptState(ref c) if c.reason.contains("stored twice")),
        "{err}"
    );
    // A page every record of which the head has passed (it should have
    // been deleted with the last of them).
    let mut store = h.store.clone();
    store.insert_raw(
        &StateKey::QueueMeta(a).to_string(),
        [2i64.to_be_bytes(), 3i64.to_be_bytes()].concat(),
    );
    let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
    assert!(
        matches!(err, ProtocolError::CorruptState(ref c) if c.key == key),
        "{err}"
    );
    // The head inside the page: its records below the head are released
    // already, and the rest restore (and, their cause gone with the old
    // head, are delivered at once).
    let mut store = h.store.clone();
    store.insert_raw(
        &StateKey::QueueMeta(a).to_string(),
        [1i64.to_be_bytes(), 3i64.to_be_bytes()].concat(),
    );
    let started = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap();
    assert_eq!(coords(&started.deliveries), vec![(a, 1), (a, 2)]);
    // A page with a record past the tail.
    let mut store = h.store.clone();
    store.insert_raw(
        &StateKey::QueueMeta(a).to_string(),
        [0i64.to_be_bytes(), 1i64.to_be_bytes()].concat(),
    );
    assert!(matches!(
        CausalNode::init(h.config.clone(), &store, &h.broker),
        Err(ProtocolError::CorruptState(_))
    ));
    assert!(CausalNode::init(h.config.clone(), &h.store, &h.broker).is_ok());
}

#[test]
fn corrupt_persisted_values() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let x = ch(9, 0);
    let s = sender(0x5E);
    let broker = FakeBroker::default().with_topic(x.topic, 1, 0);
    let c = ch(3, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b, c], &[x.topic]), broker);
    h.feed(tagged(rec(b, 0, offsets(&[(ch(7, 0), 1)])), s, 1));
    h.feed(rec(a, 0, offsets(&[(b, 3)])));
    h.feed(rec(c, 2, VectorClock::new()));
    h.node.prepare_send(x).unwrap();
    // Dropping C as an input writes carried ancestry.
    h.restart_with(config(sender(ME), &[a, b], &[x.topic]))
        .unwrap();
    h.commit();
    let good = h.store.clone();
    let keys: Vec<String> = good.iter().map(|(k, _)| k.to_owned()).collect();
    for prefix in ["scope", "ca", "f/", "cc/", "q/", "sq/", "ds/"] {
        assert!(
            keys.iter().any(|k| k.starts_with(prefix)),
            "fixture lacks {prefix}"
        );
    }
    for key in &keys {
        // Truncate every value by one byte, and append one byte: both corrupt.
        for mutate in [
            |v: &mut Vec<u8>| {
                v.pop();
            },
            |v: &mut Vec<u8>| v.push(0),
        ] {
            let mut store = good.clone();
            mutate(store.get_raw_mut(key).unwrap());
            let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
            assert!(
                matches!(err, ProtocolError::CorruptState(ref c) if &c.key == key),
                "{key}: {err}"
            );
        }
    }
    // A key nobody writes, a negative frontier, state without a scope.
    let mut store = good.clone();
    store.insert_raw("zz/unknown", vec![]);
    assert!(matches!(
        CausalNode::init(h.config.clone(), &store, &h.broker),
        Err(ProtocolError::CorruptState(_))
    ));
    let mut store = good.clone();
    store.insert_raw(
        &StateKey::Frontier(a).to_string(),
        (-2i64).to_be_bytes().to_vec(),
    );
    assert!(matches!(
        CausalNode::init(h.config.clone(), &store, &h.broker),
        Err(ProtocolError::CorruptState(_))
    ));
    let mut store = good.clone();
    store.remove_raw("scope");
    assert!(matches!(
        CausalNode::init(h.config.clone(), &store, &h.broker),
        Err(ProtocolError::CorruptState(_))
    ));
    // Any one kind of state without a scope is refused on its own (each
    // kind is enough, not only all of them together).
    for key in keys.iter().filter(|k| *k != "scope") {
        let mut store = MemStore::new();
        store.insert_raw(key, good.get(key).unwrap().to_vec());
        let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
        assert!(
            matches!(err, ProtocolError::CorruptState(ref c) if c.key == "scope"),
            "{key} alone: {err}"
        );
    }
    // A frontier for a channel outside the recorded scope.
    let mut store = good.clone();
    store.insert_raw(
        &StateKey::Frontier(ch(3, 3)).to_string(),
        1i64.to_be_bytes().to_vec(),
    );
    assert!(matches!(
        CausalNode::init(h.config.clone(), &store, &h.broker),
        Err(ProtocolError::CorruptState(_))
    ));
    // A held page, or entry, outside its queue's window.
    let page = good
        .get(&StateKey::QueuePage(a, 0).to_string())
        .unwrap()
        .to_vec();
    let entry = PageEntries::new(&page).unwrap().next().unwrap().to_vec();
    for (stray, value) in [
        (StateKey::QueuePage(a, 7), page),
        (StateKey::QueueEntry(a, 7), entry),
    ] {
        let mut store = good.clone();
        store.insert_raw(&stray.to_string(), value);
        assert!(
            matches!(
                CausalNode::init(h.config.clone(), &store, &h.broker),
                Err(ProtocolError::CorruptState(ref c)) if c.key == stray.to_string()
            ),
            "{stray}"
        );
    }
    // The untouched store still starts.
    assert!(CausalNode::init(h.config.clone(), &good, &h.broker).is_ok());
}

/// Two spellings of one key would name one entry twice, and restore could
/// only keep whichever it read last. Only the canonical spelling parses, so
/// an alias fails init instead of silently replacing the real entry.
#[test]
fn non_canonical_state_keys_are_corrupt() {
    let a = Channel::new(TopicId::from_u128(0xAB), 3);
    let mut h = Harness::start(config(sender(ME), &[a], &[]), FakeBroker::default());
    h.feed(rec(a, 5, VectorClock::new()));
    h.commit();
    let good = h.store.clone();
    let canonical = StateKey::Frontier(a).to_string();
    assert!(good.get(&canonical).is_some());
    for alias in [
        canonical.to_uppercase().replacen("F/", "f/", 1),
        canonical.replace(":3", ":03"),
    ] {
        assert_ne!(alias, canonical);
        let mut store = good.clone();
        store.insert_raw(&alias, 9i64.to_be_bytes().to_vec());
        let err = CausalNode::init(h.config.clone(), &store, &h.broker).unwrap_err();
        assert!(
            matches!(err, ProtocolError::CorruptState(ref c) if c.key == alias),
            "{alias}: {err}"
        );
    }
    // A skip mark for a channel outside the recorded scope is corrupt too.
    let mut store = good.clone();
    store.insert_raw(
        &StateKey::SkipMark(ch(7, 0), sender(1)).to_string(),
        [1i64.to_be_bytes(), 9i64.to_be_bytes()].concat(),
    );
    assert!(matches!(
        CausalNode::init(h.config.clone(), &store, &h.broker),
        Err(ProtocolError::CorruptState(_))
    ));
    assert!(CausalNode::init(h.config.clone(), &good, &h.broker).is_ok());
}

#[test]
fn missing_sink_at_init() {
    let a = ch(1, 0);
    let err = CausalNode::init(
        config(sender(ME), &[a], &[topic(9)]),
        &MemStore::new(),
        &FakeBroker::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ProtocolError::MissingSink { topic: t } if t == topic(9)));
}

#[test]
fn broker_failure_at_init() {
    let broker = FakeBroker::default().with_topic(topic(9), 1, 0);
    broker.fail.set(true);
    let err = CausalNode::init(
        config(sender(ME), &[ch(1, 0)], &[topic(9)]),
        &MemStore::new(),
        &broker,
    )
    .unwrap_err();
    assert!(matches!(err, ProtocolError::BrokerOffsets(_)));
}

#[test]
fn records_out_of_offset_order() {
    let a = ch(1, 0);
    let b = ch(2, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.feed(rec(a, 0, offsets(&[(b, 0)])));
    h.feed(rec(a, 5, VectorClock::new()));
    // Above the frontier but not above the last received record.
    let err = h.node.on_record(rec(a, 3, VectorClock::new())).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::OutOfOrder {
                offset: 3,
                known: 5,
                ..
            }
        ),
        "{err}"
    );
    // Below a position the host already reported (it promised every record
    // below it had been handed over). B's head is held, so the position is
    // remembered but not folded into the frontier yet.
    let c = ch(3, 0);
    let mut h = Harness::start(config(sender(ME), &[b, c], &[]), FakeBroker::default());
    h.feed(rec(b, 0, offsets(&[(c, 0)])));
    assert!(h.advance(b, 10).is_empty());
    let err = h.node.on_record(rec(b, 7, VectorClock::new())).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::OutOfOrder {
                offset: 7,
                known: 9,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(h.feed(rec(c, 0, VectorClock::new())), vec![(c, 0), (b, 0)]);
    assert_eq!(h.node.frontier(b), Some(9));
}

#[test]
fn negative_input_partition_is_invalid_config() {
    let err = CausalNode::init(
        config(sender(ME), &[ch(1, -1)], &[]),
        &MemStore::new(),
        &FakeBroker::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ProtocolError::InvalidConfig(_)));
}
