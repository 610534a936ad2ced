//! Causal delivery under arbitrary arrival interleavings.
//!
//! Records are produced in one order (each claiming some earlier records on
//! the other topic), then a second application fetches the two topics in a
//! random interleaving that keeps each partition's FIFO order. Whatever the
//! interleaving, the consuming stage must deliver every claimed record
//! before the record claiming it, and end with nothing held. Across all
//! cases some records must actually have been held, or the test proves
//! nothing.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

#[derive(Clone, Debug)]
struct Plan {
    /// Per record: its topic (0 or 1) and the earlier records it claims.
    records: Vec<(usize, Vec<usize>)>,
    /// The fetch interleaving: which topic advances by one record next.
    merge: Vec<bool>,
}

fn plan() -> impl Strategy<Value = Plan> {
    (2usize..12)
        .prop_flat_map(|n| {
            (
                proptest::collection::vec(
                    (
                        0usize..2,
                        proptest::collection::vec(any::<prop::sample::Index>(), 0..3),
                    ),
                    n,
                ),
                proptest::collection::vec(any::<bool>(), 2 * n),
            )
        })
        .prop_map(|(raw, merge)| {
            let mut records: Vec<(usize, Vec<usize>)> = Vec::new();
            for (i, (t, picks)) in raw.into_iter().enumerate() {
                // Claims name earlier records on the other topic only
                // (a claim on the record's own channel is FIFO's business).
                let candidates: Vec<usize> = (0..i).filter(|&j| records[j].0 != t).collect();
                let mut deps: Vec<usize> = if candidates.is_empty() {
                    vec![]
                } else {
                    picks
                        .iter()
                        .map(|p| candidates[p.index(candidates.len())])
                        .collect()
                };
                deps.sort_unstable();
                deps.dedup();
                records.push((t, deps));
            }
            Plan { records, merge }
        })
}

#[test]
fn every_interleaving_delivers_causes_first() {
    let topics = [topic("c1"), topic("c2")];
    let consumer = Stage::named("consumer")
        .on(&topics[0], |_m: &Message<String, String>| {
            Vec::<Emission>::new()
        })
        .on(&topics[1], |_m: &Message<String, String>| {
            Vec::<Emission>::new()
        })
        .build()
        .unwrap();
    let consumer_app = Parsley::named("consumer-app", [consumer]).unwrap();
    // The producing side: an application that only owns the topics.
    let sink_only = Stage::named("unused")
        .on(&topic("nothing"), |_m: &Message<String, String>| {
            Vec::<Emission>::new()
        })
        .sink(&topics[0])
        .sink(&topics[1])
        .build()
        .unwrap();
    let producer_app = Parsley::named("producer-app", [sink_only]).unwrap();

    let held_total = std::cell::Cell::new(0usize);
    let mut runner = TestRunner::new(Config {
        cases: 128,
        ..Config::default()
    });
    runner
        .run(&plan(), |plan| {
            let mut a = TestDriver::new(&producer_app).unwrap();
            let mut at: Vec<Coordinate> = Vec::new();
            for (i, (t, deps)) in plan.records.iter().enumerate() {
                let mut input = Input::new("k", format!("r{i}"));
                for &d in deps {
                    input = input.after(&at[d]);
                }
                at.push(a.append(&topics[*t], input).unwrap());
            }
            let mut b = TestDriver::new(&consumer_app).unwrap();
            let mut next = [0i64, 0i64];
            let ends = [
                a.end_offset("c1", 0).unwrap(),
                a.end_offset("c2", 0).unwrap(),
            ];
            for &second in &plan.merge {
                let t = usize::from(second);
                let t = if next[t] < ends[t] { t } else { 1 - t };
                if next[t] >= ends[t] {
                    break;
                }
                b.append_from(&a, topics[t].name(), 0, next[t]).unwrap();
                next[t] += 1;
                b.run().unwrap();
            }
            for t in &topics {
                b.append_all_from(&a, t.name()).unwrap();
            }
            b.run().unwrap();

            prop_assert!(b.held().is_empty());
            let delivered = b.delivered_to("consumer");
            prop_assert_eq!(delivered.len(), plan.records.len());
            let pos = |c: &Coordinate| delivered.iter().position(|d| d == c).unwrap();
            for (i, (_, deps)) in plan.records.iter().enumerate() {
                for &d in deps {
                    prop_assert!(
                        pos(&at[d]) < pos(&at[i]),
                        "{} before its cause {}",
                        at[i],
                        at[d]
                    );
                }
            }
            held_total.set(held_total.get() + b.deliveries().iter().filter(|x| x.was_held).count());
            Ok(())
        })
        .unwrap();
    assert!(held_total.get() > 0, "no interleaving ever held a record");
}
