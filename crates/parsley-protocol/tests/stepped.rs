//! Stepping past a record: the `st/<channel>/<offset>` entry, its one
//! spelling, its value, and what the gate does with a record it never
//! receives (as with a transaction marker: a claim on that offset is met
//! once a later record or position passes it, and never before).

mod common;

use common::*;
use parsley_protocol::store::StateKey;
use parsley_protocol::*;

fn stepped(topic: &str) -> SteppedPast {
    SteppedPast {
        dead_letter: topic.to_owned(),
        reason: "corrupt vc".to_owned(),
    }
}

#[test]
fn the_key_has_one_spelling_and_the_value_round_trips() {
    let c = ch(0xA, 3);
    let key = StateKey::Stepped(c, 0x2a);
    let text = key.to_key();
    assert_eq!(text, format!("st/{c}/000000000000002a"));
    assert_eq!(key.text().as_str(), text);
    assert_eq!(text.parse::<StateKey>().unwrap(), key);
    for bad in [
        format!("st/{c}/000000000000002A"),
        format!("st/{c}/2a"),
        format!("st/{c}/0000000000000002a"),
        format!("st/{c}"),
        format!("st/{c}/ffffffffffffffff"),
    ] {
        assert!(bad.parse::<StateKey>().is_err(), "{bad}");
    }
    let v = stepped("dlq");
    assert_eq!(SteppedPast::decode(&v.encode()).unwrap(), v);
    let mut long = v.encode();
    long.push(0);
    assert!(SteppedPast::decode(&long).is_err(), "trailing bytes");
    assert!(
        SteppedPast::decode(&stepped("").encode()).is_err(),
        "no topic"
    );
    assert!(SteppedPast::decode(&v.encode()[..5]).is_err(), "truncated");
}

#[test]
fn a_record_stepped_past_is_to_the_gate_an_offset_it_never_saw() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let broker = FakeBroker::default()
        .with_topic(topic(1), 1, 0)
        .with_topic(topic(2), 1, 0);
    let mut h = Harness::start(config(sender(9), &[a, b], &[]), broker);
    h.advance(a, 0);
    h.advance(b, 0);
    // b@0 claims a up to 1; a@1 is stepped past (never fed).
    assert!(h.feed(rec(b, 0, offsets(&[(a, 1)]))).is_empty(), "held");
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())), vec![(a, 0)]);
    h.node.step_past(a, 1, stepped("dlq")).unwrap();
    assert_eq!(h.node.stepped_past(a, 1), Some(&stepped("dlq")));
    // Not met until something passes offset 1.
    assert!(h.advance(a, 1).is_empty());
    assert_eq!(h.advance(a, 2), vec![(b, 0)]);
    // A channel this node does not consume is refused.
    assert!(h.node.step_past(ch(3, 0), 0, stepped("dlq")).is_err());
    // Persisted: a restart knows it.
    h.restart();
    assert_eq!(h.node.stepped_past(a, 1), Some(&stepped("dlq")));
    assert_eq!(h.node.stepped().count(), 1);
}

#[test]
fn a_stepped_entry_outside_the_scope_is_corrupt_and_a_departing_input_drops_its_own() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let broker = FakeBroker::default()
        .with_topic(topic(1), 1, 0)
        .with_topic(topic(2), 1, 0);
    let mut h = Harness::start(config(sender(9), &[a, b], &[]), broker);
    h.node.step_past(b, 4, stepped("dlq")).unwrap();
    // b departs: its entry is deleted with its other state.
    h.restart_with(config(sender(9), &[a], &[])).unwrap();
    h.commit();
    assert!(h.node.stepped().next().is_none());
    assert!(h.store.get(&StateKey::Stepped(b, 4).to_key()).is_none());
    // An entry written for a channel outside the recorded scope (by hand)
    // fails the restore.
    h.store
        .insert_raw(&StateKey::Stepped(b, 5).to_key(), stepped("dlq").encode());
    let c = h.config.clone();
    let err = h.restart_with(c).unwrap_err();
    assert!(
        err.to_string().contains("outside the recorded scope"),
        "{err}"
    );
}
