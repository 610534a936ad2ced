//! Request and reply with effect-before-reply: the responder writes its
//! effect, then its reply, from one delivery. The requester consumes both,
//! and sees the effect before the acknowledgement, always.

use parsley::{Codec, Message, Parsley, Stage, Step, TestDriver, Topic};

type T = Topic<String, String>;

fn t(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (commands, requests, replies, effects) =
        (t("commands"), t("requests"), t("replies"), t("effects"));
    // ANCHOR: responder
    let (fx, rp) = (effects.clone(), replies.clone());
    let responder = Stage::named("responder")
        .on(&requests, move |m: &Message<String, String>| {
            let v = m.value().cloned().unwrap_or_default();
            vec![
                fx.send(m.key().cloned(), format!("did {v}")),
                rp.send(m.key().cloned(), format!("ack {v}")),
            ]
        })
        .sink(&effects)
        .sink(&replies)
        .build()?;
    // ANCHOR_END: responder
    // ANCHOR: requester
    let rq = requests.clone();
    let requester = Stage::named("requester")
        .state(Codec::utf8(), String::new)
        .fold(&commands, move |s: String, m: &Message<String, String>| {
            Step::to(s).emit(rq.send(m.key().cloned(), m.value().cloned()))
        })
        .fold(&effects, |s: String, m: &Message<String, String>| {
            Step::to(format!("{s}{};", m.value().cloned().unwrap_or_default()))
        })
        .fold(&replies, |s: String, m: &Message<String, String>| {
            println!("requester: {:?} after seeing [{s}]", m.value());
            Step::to(format!("{s}acked;"))
        })
        .sink(&requests)
        .build()?;
    // ANCHOR_END: requester

    // ANCHOR: run
    let mut req = TestDriver::new(&Parsley::named("requester-app", [requester])?)?;
    let mut resp = TestDriver::new(&Parsley::named("responder-app", [responder])?)?;
    req.pipe(&commands, "k", "transfer")?;
    resp.append_all_from(&req, "requests")?;
    resp.run()?;
    // Deliver the reply first: it is held on the effect.
    req.append_all_from(&resp, "replies")?;
    req.run()?;
    println!("held: {}", req.held()[0]);
    req.append_all_from(&resp, "effects")?;
    req.run()?;
    let state: Option<String> = req.fold_state("requester", &Codec::utf8(), "k")?;
    assert_eq!(state.as_deref(), Some("did transfer;acked;"));
    // ANCHOR_END: run
    Ok(())
}
