//! The sharpest diamond: the base-and-derived triangle. A derived record is
//! never delivered before the base record it was derived from, whatever the
//! deriving branch's lag. (In a full diamond the two branch outputs are
//! concurrent at the join, so either may come first; `tests/topologies.rs`
//! asserts both halves.)

use parsley::{Codec, Message, Parsley, Stage, TestDriver, Topic};

type T = Topic<String, String>;

fn t(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn enrich(from: &T, to: &T) -> Result<Stage, parsley::StageError> {
    let out = to.clone();
    Stage::named("enrich")
        .on(from, move |m: &Message<String, String>| {
            vec![out.send(
                m.key().cloned(),
                format!("{} (enriched)", m.value().cloned().unwrap_or_default()),
            )]
        })
        .sink(to)
        .build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (base, derived) = (t("base"), t("derived"));
    let mut a = TestDriver::new(&Parsley::named("enricher-app", [enrich(&base, &derived)?])?)?;
    a.pipe(&base, "k", "record")?;

    // ANCHOR: projection
    // The projection consumes both base and derived (its own application,
    // since a topic feeds one stage per application).
    let projection = Stage::named("projection")
        .on(&base, |m: &Message<String, String>| {
            println!("projection: base {:?}", m.value());
            vec![]
        })
        .on(&derived, |m: &Message<String, String>| {
            println!("projection: derived {:?}", m.value());
            vec![]
        })
        .build()?;
    let mut b = TestDriver::new(&Parsley::named("projection-app", [projection])?)?;
    b.append_all_from(&a, "derived")?;
    b.run()?;
    assert_eq!(b.held().len(), 1, "the derivation waits for its base");
    b.append_all_from(&a, "base")?;
    b.run()?;
    assert_eq!(
        b.delivered_to("projection")
            .iter()
            .map(|c| c.topic.as_str())
            .collect::<Vec<_>>(),
        vec!["base", "derived"]
    );
    // ANCHOR_END: projection
    Ok(())
}
