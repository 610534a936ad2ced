//! Event flows: data, then a notification about it, from one stamping site.
//! A consumer of both never sees a dangling notification. An unstamped
//! producer's events claim nothing and are delivered at once.

use parsley::{Codec, Message, Parsley, Stage, Step, TestDriver, Topic};

type T = Topic<String, String>;

fn t(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (input, data, events) = (t("input"), t("data"), t("events"));
    // ANCHOR: writer
    let (d, e) = (data.clone(), events.clone());
    let writer = Stage::named("writer")
        .on(&input, move |m: &Message<String, String>| {
            vec![
                d.send(m.key().cloned(), m.value().cloned()),
                e.send(m.key().cloned(), "updated"),
            ]
        })
        .sink(&data)
        .sink(&events)
        .build()?;
    // ANCHOR_END: writer
    let mut a = TestDriver::new(&Parsley::named("writer-app", [writer])?)?;
    a.pipe(&input, "doc-1", "v1")?;

    // ANCHOR: reader
    let reader = Stage::named("reader")
        .state(Codec::utf8(), String::new)
        .fold(&data, |_s: String, m: &Message<String, String>| {
            Step::to(m.value().cloned().unwrap_or_default())
        })
        .fold(&events, |s: String, m: &Message<String, String>| {
            println!("notified about {:?}; it reads {s:?}", m.key());
            Step::keep()
        })
        .build()?;
    let mut b = TestDriver::new(&Parsley::named("reader-app", [reader])?)?;
    b.append_all_from(&a, "events")?;
    b.run()?;
    assert_eq!(b.held().len(), 1, "the notification waits for the data");
    b.append_all_from(&a, "data")?;
    b.run()?;
    assert!(b.held().is_empty());
    // ANCHOR_END: reader
    Ok(())
}
