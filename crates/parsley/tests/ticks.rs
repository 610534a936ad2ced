//! Tick scheduling: a fixed grid, one tick per jump, and no tick lost to a
//! failed step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parsley::*;

type T = Topic<String, String>;

fn topic(name: &str) -> T {
    Topic::new(name, Codec::utf8(), Codec::utf8())
}

fn ticking(fail_once: Arc<AtomicBool>) -> (Parsley, T, T) {
    ticking_failing(fail_once, Arc::new(AtomicBool::new(false)))
}

// ANCHOR: ticking
fn ticking_failing(fail_once: Arc<AtomicBool>, fail_again: Arc<AtomicBool>) -> (Parsley, T, T) {
    let (input, beats) = (topic("input"), topic("beats"));
    let mut builder = Stage::named("s");
    let out = builder.add_sink(&beats);
    let stage = builder
        .on(&input, move |_m| -> Result<Vec<Emission>, String> {
            if fail_once.swap(false, Ordering::SeqCst) || fail_again.swap(false, Ordering::SeqCst) {
                Err("transient".into())
            } else {
                Ok(vec![])
            }
        })
        .ticks(Duration::from_secs(10), move |t| {
            vec![out.send(None, t.timestamp().to_string())]
        })
        .build()
        .unwrap();
    (Parsley::named("app", [stage]).unwrap(), input, beats)
}
// ANCHOR_END: ticking

// ANCHOR: grid
/// Ticks fall on a fixed grid of the interval (as Kafka's wall-clock
/// punctuation does), not `now + interval` from whenever the last one ran,
/// so late punctuations do not drift the schedule; a jump over several
/// intervals gives one tick.
#[test]
fn ticks_keep_a_fixed_grid_and_a_jump_gives_one_tick() {
    let (app, _input, beats) = ticking(Arc::new(AtomicBool::new(false)));
    let mut d = TestDriver::new(&app).unwrap();
    d.advance_wall_clock(Duration::from_millis(10_300)).unwrap(); // 10.3 s: tick
    d.advance_wall_clock(Duration::from_millis(9_800)).unwrap(); // 20.1 s: tick
    d.advance_wall_clock(Duration::from_millis(45_000)).unwrap(); // 65.1 s: one tick
    d.advance_wall_clock(Duration::from_millis(5_000)).unwrap(); // 70.1 s: tick
    assert_eq!(
        d.values(&beats).unwrap(),
        vec!["10300", "20100", "65100", "70100"]
    );
}
// ANCHOR_END: grid

/// A step that fails and is retried does not cost the tick that fell due
/// meanwhile.
#[test]
fn a_failed_step_does_not_lose_the_next_tick() {
    let fail = Arc::new(AtomicBool::new(true));
    let (app, input, beats) = ticking(fail.clone());
    let mut d = TestDriver::new(&app).unwrap();
    assert!(d.pipe(&input, "k", "x").is_err());
    d.advance_wall_clock(Duration::from_secs(10)).unwrap();
    assert!(!fail.load(Ordering::SeqCst), "the retry ran");
    assert_eq!(d.values(&beats).unwrap(), vec!["10000"], "the tick came");
}

// ANCHOR: aborted-tick
/// The tick due while a step keeps failing: the tick goes into the same
/// transaction as the retried step, that transaction aborts too, and the
/// tick must come again with the next successful one, not wait a whole
/// interval more.
#[test]
fn a_tick_in_an_aborted_transaction_comes_again() {
    let (once, again) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(true)),
    );
    let (app, input, beats) = ticking_failing(once, again.clone());
    let mut d = TestDriver::new(&app).unwrap();
    assert!(d.pipe(&input, "k", "x").is_err());
    // The tick falls due and the retry fails again.
    assert!(d.advance_wall_clock(Duration::from_secs(10)).is_err());
    assert!(!again.load(Ordering::SeqCst));
    d.run().unwrap();
    assert_eq!(
        d.values(&beats).unwrap(),
        vec!["10000"],
        "the tick of the aborted transaction came again"
    );
}
// ANCHOR_END: aborted-tick
