//! Fan-in: a fold joining two sources. A c2 record stamped as caused by a
//! c1 record is held until that record is delivered; unrelated records are
//! delivered in arrival order.

use parsley::{Codec, Input, Message, Parsley, Stage, Step, TestDriver, Topic};

type T = Topic<String, String>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (c1, c2, c4): (T, T, T) = (
        Topic::new("c1", Codec::utf8(), Codec::utf8()),
        Topic::new("c2", Codec::utf8(), Codec::utf8()),
        Topic::new("c4", Codec::utf8(), Codec::utf8()),
    );
    // ANCHOR: join
    let (left, right) = (c4.clone(), c4.clone());
    let p3 = Stage::named("p3")
        .state(Codec::utf8(), String::new)
        .fold(&c1, move |s: String, m: &Message<String, String>| {
            let next = format!("{s}L:{};", m.value().cloned().unwrap_or_default());
            Step::to(next.clone()).emit(left.send(m.key().cloned(), next))
        })
        .fold(&c2, move |s: String, m: &Message<String, String>| {
            let next = format!("{s}R:{};", m.value().cloned().unwrap_or_default());
            Step::to(next.clone()).emit(right.send(m.key().cloned(), next))
        })
        .sink(&c4)
        .build()?;
    // ANCHOR_END: join
    let mut d = TestDriver::new(&Parsley::named("join-app", [p3])?)?;

    // ANCHOR: held
    let cause = d.next_coordinate(&c1, "k")?;
    d.pipe_input(&c2, Input::new("k", "effect").after(&cause))?;
    println!("held: {}", d.held()[0]);
    d.pipe(&c1, "k", "cause")?;
    let joined: Option<String> = d.fold_state("p3", &Codec::utf8(), "k")?;
    println!("joined state: {joined:?}");
    assert_eq!(joined.as_deref(), Some("L:cause;R:effect;"));
    // ANCHOR_END: held
    Ok(())
}
