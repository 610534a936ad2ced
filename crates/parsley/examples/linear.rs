//! Linear pipeline `c1 -> p1 -> c2 -> p2 -> c3`, and a reconciler in a
//! second application consuming c1 and c3. Claims carry across hops, so the
//! reconciler delivers each c1 record before the c3 record derived from it,
//! even when it fetches c3 first.

use parsley::{Codec, Message, Parsley, Stage, TestDriver, Topic};

type T = Topic<String, String>;

// ANCHOR: hop
fn hop(name: &str, from: &T, to: &T) -> Result<Stage, parsley::StageError> {
    let out = to.clone();
    let tag = name.to_owned();
    Stage::named(name)
        .on(from, move |m: &Message<String, String>| {
            let v = m.value().cloned().unwrap_or_default();
            vec![out.send(m.key().cloned(), format!("{v} via {tag}"))]
        })
        .sink(to)
        .build()
}
// ANCHOR_END: hop

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (c1, c2, c3): (T, T, T) = (
        Topic::new("c1", Codec::utf8(), Codec::utf8()),
        Topic::new("c2", Codec::utf8(), Codec::utf8()),
        Topic::new("c3", Codec::utf8(), Codec::utf8()),
    );
    // ANCHOR: pipeline
    let pipeline = Parsley::named("pipeline-app", [hop("p1", &c1, &c2)?, hop("p2", &c2, &c3)?])?;
    let mut a = TestDriver::new(&pipeline)?;
    a.pipe(&c1, "k", "m1")?;
    println!("c3: {:?}", a.values(&c3)?);
    // ANCHOR_END: pipeline

    // ANCHOR: reconcile
    let recon = Stage::named("reconcile")
        .on(&c1, |m: &Message<String, String>| {
            println!("reconcile: input {}", m.coordinate());
            vec![]
        })
        .on(&c3, |m: &Message<String, String>| {
            println!("reconcile: output {}", m.coordinate());
            vec![]
        })
        .build()?;
    let mut b = TestDriver::new(&Parsley::named("recon-app", [recon])?)?;
    b.append_all_from(&a, "c3")?;
    b.run()?;
    println!(
        "fetched c3 first; held: {:?}",
        b.held().iter().map(|h| h.summary()).collect::<Vec<_>>()
    );
    assert_eq!(b.held().len(), 1);
    b.append_all_from(&a, "c1")?;
    b.run()?;
    assert_eq!(
        b.delivered_to("reconcile")
            .iter()
            .map(|c| c.topic.as_str())
            .collect::<Vec<_>>(),
        vec!["c1", "c3"]
    );
    // ANCHOR_END: reconcile
    Ok(())
}
