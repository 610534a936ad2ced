//! What the logs say, and what they never say: a stage run at TRACE logs
//! its lifecycle, holds and deliveries by coordinate, and never a byte of
//! a key or a value.

use std::time::Duration;

use parsley::*;

mod capture;

const MARKER: &str = "PAYLOAD-MARKER-7f3a";

#[test]
fn no_level_logs_key_or_value_bytes() {
    let text = capture::logs(tracing::Level::TRACE, || {
        let (a, c, out): (
            Topic<String, String>,
            Topic<String, String>,
            Topic<String, String>,
        ) = (
            Topic::new("a", Codec::utf8(), Codec::utf8()),
            Topic::new("c", Codec::utf8(), Codec::utf8()),
            Topic::new("out", Codec::utf8(), Codec::utf8()),
        );
        let mut builder = Stage::named("s").state(Codec::utf8(), String::new);
        let sink = builder.add_sink(&out);
        let stage = builder
            .fold(&a, move |_, m| {
                let v = m.value().cloned().unwrap_or_default();
                Step::to(v.clone()).emit(sink.send(m.key().cloned(), v).with_header("h", MARKER))
            })
            .fold(&c, |s, _m| Step::to(s))
            .build()
            .unwrap();
        let app = Parsley::named("app", [stage]).unwrap();
        let mut d = TestDriver::new(&app).unwrap();
        let key = format!("key-{MARKER}");
        let value = format!("value-{MARKER}");
        let cause = d.next_coordinate(&c, &key).unwrap();
        d.pipe_input(&a, Input::new(key.clone(), value.clone()).after(&cause))
            .unwrap();
        d.advance_wall_clock(Duration::from_secs(40)).unwrap();
        d.pipe(&c, key.clone(), value.clone()).unwrap();
        d.restart().unwrap();
        d.pipe(&a, key, value).unwrap();
        assert_eq!(d.records(&out).unwrap().len(), 2);
    });
    assert!(text.len() > 1_000, "the run logged: {text}");
    assert!(!text.contains(MARKER), "payload bytes in the logs:\n{text}");
    // What it does say, by coordinate.
    assert!(text.contains("a:0@0"), "{text}");
    assert!(text.contains("task initialised"), "{text}");
    assert!(
        text.contains("vc-hold-not-fetched"),
        "the hold warning: {text}"
    );
    assert!(
        text.lines().any(|l| l.contains("DEBUG")
            && l.contains("record held")
            && l.contains("a:0@0")
            && l.contains("c:0 <= 0")),
        "a DEBUG line names the held record and its claim by topic name: {text}"
    );
    assert!(
        text.lines().any(|l| l.contains("DEBUG")
            && l.contains("delivering to logic")
            && l.contains("a:0@0")
            && l.contains("c:0 <= 0")),
        "a DEBUG line per delivery, with its claims: {text}"
    );
}
