//! Fan-out: one stage, two sinks. The emissions of one delivery are claimed
//! in send order, so an observer of both sinks delivers the summary before
//! the audit that followed it, whichever it fetches first.

use parsley::{Codec, Message, Parsley, Stage, TestDriver, Topic};

type T = Topic<String, String>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (c1, c2, c3): (T, T, T) = (
        Topic::new("c1", Codec::utf8(), Codec::utf8()),
        Topic::new("c2", Codec::utf8(), Codec::utf8()),
        Topic::new("c3", Codec::utf8(), Codec::utf8()),
    );
    // ANCHOR: stage
    let (summary, audit) = (c2.clone(), c3.clone());
    let p1 = Stage::named("p1")
        .on(&c1, move |m: &Message<String, String>| {
            let v = m.value().cloned().unwrap_or_default();
            vec![
                summary.send(m.key().cloned(), format!("summary of {v}")),
                audit.send(m.key().cloned(), format!("audit of {v}")),
            ]
        })
        .sink(&c2)
        .sink(&c3)
        .build()?;
    // ANCHOR_END: stage
    let mut a = TestDriver::new(&Parsley::named("fan-out-app", [p1])?)?;
    a.pipe(&c1, "k", "m1")?;

    // ANCHOR: observer
    let observer = Stage::named("observer")
        .on(&c2, |m: &Message<String, String>| {
            println!("observer: {:?}", m.value());
            vec![]
        })
        .on(&c3, |m: &Message<String, String>| {
            println!("observer: {:?}", m.value());
            vec![]
        })
        .build()?;
    let mut b = TestDriver::new(&Parsley::named("observer-app", [observer])?)?;
    b.append_all_from(&a, "c3")?;
    b.run()?;
    assert_eq!(b.held().len(), 1, "the audit waits for the summary");
    b.append_all_from(&a, "c2")?;
    b.run()?;
    assert_eq!(
        b.delivered_to("observer")
            .iter()
            .map(|c| c.topic.as_str())
            .collect::<Vec<_>>(),
        vec!["c2", "c3"]
    );
    // ANCHOR_END: observer
    Ok(())
}
