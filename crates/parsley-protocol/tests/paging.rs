//! Paging held records out of memory: past the resident window a hold
//! queue keeps only the offset and size of its committed records; when the
//! gate reaches them, the node asks for them back, the host reads them from
//! its committed store, and delivery goes on in the same order as if they
//! had never left.

mod common;

use common::*;
use parsley_protocol::store::{PAGE_BYTES, PageEntries, StateKey};
use parsley_protocol::*;

const ME: u128 = 0x9A6E;

/// Serves every page request; returns the deliveries they released and
/// how many requests there were.
fn serve(h: &mut Harness) -> (Vec<(Channel, i64)>, usize) {
    let mut out = Vec::new();
    let served = h.serve_pages(&mut out);
    (coords(&out), served)
}

fn held_on_b(h: &mut Harness, a: Channel, b: Channel, offsets: std::ops::Range<i64>) {
    for o in offsets {
        assert!(h.feed(rec(b, o, offsets_clock(a, o))).is_empty());
    }
}

/// b@o claims a@o.
fn offsets_clock(a: Channel, o: i64) -> VectorClock {
    offsets(&[(a, o)])
}

#[test]
fn records_beyond_the_window_leave_memory_at_commit_and_come_back_in_order() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    assert_eq!(h.node.set_resident_window(Some(2)), 0);
    held_on_b(&mut h, a, b, 0..10);
    let bytes = h.node.held_bytes();
    // Nothing leaves memory before it is committed.
    assert_eq!(h.node.paged_count(), 0);
    h.commit();
    assert_eq!(h.node.paged_count(), 8, "all but the window");
    assert_eq!(h.node.held_count(), 10);
    assert_eq!(h.node.held_bytes(), bytes, "paged records still count");
    assert_eq!(
        h.node.paged_bytes() * 10,
        bytes * 8,
        "eight of ten equal records"
    );
    assert_eq!(h.node.stats().paged_out_total, 8);
    // Records arriving now queue behind the paged ones.
    held_on_b(&mut h, a, b, 10..12);
    // a@0..=11 arrive: b@0 and b@1 go at once, then the gate waits for b@2.
    let mut delivered = Vec::new();
    for o in 0..12 {
        delivered.extend(h.feed(rec(a, o, VectorClock::new())));
        delivered.extend(serve(&mut h).0);
    }
    let mut want = Vec::new();
    for o in 0..12 {
        want.push((a, o));
        want.push((b, o));
    }
    assert_eq!(delivered, want);
    assert_eq!(h.node.held_count(), 0);
    assert_eq!(h.node.held_bytes(), 0);
    assert_eq!(h.node.stats().paged_in_total, 8);
}

#[test]
fn a_release_pages_in_a_window_at_a_time() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.node.set_resident_window(Some(3));
    // b@0..10 all wait for a@0.
    for o in 0..10 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 0)]))).is_empty());
    }
    h.commit();
    assert_eq!(h.node.paged_count(), 7);
    let first = h.feed(rec(a, 0, VectorClock::new()));
    assert_eq!(first, vec![(a, 0), (b, 0), (b, 1), (b, 2)]);
    assert_eq!(
        h.node.page_requests(),
        vec![PageRequest {
            channel: b,
            from: 3,
            count: 3,
            // One commit held all ten: one page, from index 0.
            stored: StateKey::QueuePage(b, 0),
        }]
    );
    let (rest, requests) = serve(&mut h);
    assert_eq!(rest, (3..10).map(|o| (b, o)).collect::<Vec<_>>());
    assert_eq!(requests, 3, "7 records in windows of 3");
    assert!(h.node.page_requests().is_empty());
}

#[test]
fn a_record_that_is_not_the_paged_one_is_refused_and_changes_nothing() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.node.set_resident_window(Some(1));
    for o in 0..3 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 0)]))).is_empty());
    }
    h.commit();
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())), vec![(a, 0), (b, 0)]);
    let mut out = Vec::new();
    let err = h
        .node
        .page_in(b, vec![rec(b, 2, VectorClock::new())], &mut out)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::PagedRecordMismatch {
                expected: 1,
                found: 2,
                ..
            }
        ),
        "{err}"
    );
    // More than the queue has paged is refused too.
    let too_many = (1..4).map(|o| rec(b, o, VectorClock::new())).collect();
    assert!(h.node.page_in(b, too_many, &mut out).is_err());
    assert!(out.is_empty());
    assert_eq!(h.node.paged_count(), 2);
    assert_eq!(serve(&mut h).0, vec![(b, 1), (b, 2)]);
}

#[test]
fn restored_holds_beyond_the_window_are_paged_at_once() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for o in 0..6 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 0)]))).is_empty());
    }
    h.restart();
    assert_eq!(h.node.held_count(), 6);
    assert_eq!(h.node.set_resident_window(Some(2)), 4);
    assert_eq!(h.node.paged_count(), 4);
    let mut delivered = h.feed(rec(a, 0, VectorClock::new()));
    delivered.extend(serve(&mut h).0);
    let mut want = vec![(a, 0)];
    want.extend((0..6).map(|o| (b, o)));
    assert_eq!(delivered, want);
}

#[test]
fn without_a_window_nothing_is_paged() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    held_on_b(&mut h, a, b, 0..50);
    h.commit();
    assert_eq!(h.node.paged_count(), 0);
    assert_eq!(h.node.resident_window(), None);
    assert!(h.node.page_requests().is_empty());
}

#[test]
fn a_window_set_while_records_are_uncommitted_waits_for_their_commit() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    held_on_b(&mut h, a, b, 0..5);
    // Not committed yet: nothing can leave memory.
    assert_eq!(h.node.set_resident_window(Some(1)), 0);
    let batch = h.commit();
    let page = batch
        .get(StateKey::QueuePage(b, 0))
        .flatten()
        .expect("the held records' page");
    assert_eq!(PageEntries::count(page), Ok(5), "every held record written");
    assert_eq!(h.node.paged_count(), 4);
    let mut delivered = Vec::new();
    for o in 0..5 {
        delivered.extend(h.feed(rec(a, o, VectorClock::new())));
        delivered.extend(serve(&mut h).0);
    }
    assert_eq!(delivered.len(), 10);
}

#[test]
fn paging_out_gives_back_the_room_the_paged_records_took() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    h.node.set_resident_window(Some(4));
    held_on_b(&mut h, a, b, 0..2_000);
    assert!(h.node.held_capacity() >= 2_000);
    h.commit();
    assert!(
        h.node.held_capacity() <= 2 * 64,
        "room for {} decoded records kept after paging",
        h.node.held_capacity()
    );
    // Records queued behind the paged run, then paged in turn.
    held_on_b(&mut h, a, b, 2_000..4_000);
    assert!(h.node.held_capacity() >= 2_000);
    h.commit();
    assert!(h.node.held_capacity() <= 2 * 64);
    assert_eq!(h.node.paged_count(), 3_996);
    assert!(h.node.paged_capacity() >= 3_996);
    // Released and read back: the paged run's room goes with it.
    let mut released = h.feed(rec(a, 0, VectorClock::new()));
    for o in 1..4_000 {
        released.extend(h.feed(rec(a, o, VectorClock::new())));
        released.extend(serve(&mut h).0);
    }
    assert_eq!(released.len(), 8_000);
    assert_eq!(h.node.held_count(), 0);
    assert!(
        h.node.paged_capacity() <= 64,
        "room for {} paged records kept",
        h.node.paged_capacity()
    );
}

#[test]
fn a_start_with_a_window_decodes_only_the_window() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for o in 0..6 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 0)]))).is_empty());
    }
    h.restart_windowed(Some(2));
    assert_eq!(h.node.held_count(), 6);
    assert_eq!(
        h.node.paged_count(),
        4,
        "held from the start as offset and size"
    );
    assert_eq!(h.node.stats().paged_out_total, 4);
    assert_eq!(h.node.resident_window(), Some(2));
    let mut delivered = h.feed(rec(a, 0, VectorClock::new()));
    delivered.extend(serve(&mut h).0);
    let mut want = vec![(a, 0)];
    want.extend((0..6).map(|o| (b, o)));
    assert_eq!(delivered, want);
}

#[test]
fn a_start_with_a_window_still_refuses_a_damaged_record_beyond_it() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for o in 0..6 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 0)]))).is_empty());
    }
    h.commit();
    // In a page: the last record's envelope cut to three bytes.
    let key = StateKey::QueuePage(b, 0).to_key();
    let page = h.store.get(&key).unwrap().to_vec();
    let mut damaged = 6i32.to_be_bytes().to_vec();
    for (i, e) in PageEntries::new(&page).unwrap().enumerate() {
        let e = if i == 5 { &e[..3] } else { e };
        damaged.extend_from_slice(&(e.len() as i32).to_be_bytes());
        damaged.extend_from_slice(e);
    }
    let mut store = h.store.clone();
    store.insert_raw(&key, damaged);
    let Err(err) = CausalNode::init_windowed(h.config.clone(), &store, &h.broker, Some(2)) else {
        panic!("a damaged held record beyond the window is refused");
    };
    assert!(matches!(err, ProtocolError::CorruptState(_)), "{err}");
    // The same in the one-entry-per-record layout, and a missing one.
    let mut store = entry_layout(&h.store);
    let key = StateKey::QueueEntry(b, 5).to_key();
    store.get_raw_mut(&key).unwrap().truncate(3);
    let Err(err) = CausalNode::init_windowed(h.config.clone(), &store, &h.broker, Some(2)) else {
        panic!("a damaged held record beyond the window is refused");
    };
    assert!(matches!(err, ProtocolError::CorruptState(_)), "{err}");
    store.remove_raw(&key);
    let Err(err) = CausalNode::init_windowed(h.config.clone(), &store, &h.broker, Some(2)) else {
        panic!("a missing held record beyond the window is refused");
    };
    assert!(
        matches!(err, ProtocolError::MissingHeldRecords { index: 5, .. }),
        "{err}"
    );
}

/// The held-record keys of `store`, as text.
fn held_keys(store: &MemStore) -> Vec<String> {
    let mut keys = Vec::new();
    store.for_each_state(&mut |key, _| {
        if let Ok(k) = key
            && k.is_held()
        {
            keys.push(k.to_string());
        }
    });
    keys
}

#[test]
fn a_commit_writes_its_held_records_as_pages_and_a_release_deletes_a_page_once_all_of_it_is_released()
 {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    // b@0 waits for a@0; b@1..=600 wait behind it, and b@601..=700 for a@1.
    assert!(h.feed(rec(b, 0, offsets(&[(a, 0)]))).is_empty());
    for o in 1..=600 {
        assert!(h.feed(rec(b, o, VectorClock::new())).is_empty());
    }
    let batch = h.commit();
    // 601 records in one commit: pages of at most 256, one key each.
    let pages = pages_put(&batch);
    assert_eq!(
        pages,
        vec![
            StateKey::QueuePage(b, 0),
            StateKey::QueuePage(b, 256),
            StateKey::QueuePage(b, 512)
        ]
    );
    for o in 601..=700 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 1)]))).is_empty());
    }
    h.commit();
    assert_eq!(held_keys(&h.store).len(), 4, "the second commit's page");
    // a@0 releases b@0..=600: the three pages go, one delete each, and
    // the fourth stays.
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())).len(), 602);
    let batch = h.commit();
    let deletes: Vec<StateKey> = batch
        .iter()
        .filter(|(k, v)| k.is_held() && v.is_none())
        .map(|(k, _)| k)
        .collect();
    assert_eq!(deletes.len(), 3, "{deletes:?}");
    assert_eq!(
        held_keys(&h.store),
        vec![StateKey::QueuePage(b, 601).to_string()]
    );
    // A restart reads the rest back from that page.
    h.restart();
    assert_eq!(h.report.restored_held, 100);
    assert_eq!(h.feed(rec(a, 1, VectorClock::new())).len(), 101);
    h.commit();
    assert!(held_keys(&h.store).is_empty());
}

#[test]
fn a_page_partly_released_stays_until_its_last_record_goes_and_restore_skips_what_was_released() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    // One page: b@0 waits for a@0, b@1 for a@1, b@2 for a@2.
    for o in 0..3 {
        assert!(h.feed(rec(b, o, offsets(&[(a, o)]))).is_empty());
    }
    h.commit();
    let page = StateKey::QueuePage(b, 0).to_string();
    assert_eq!(held_keys(&h.store), vec![page.clone()]);
    assert_eq!(h.feed(rec(a, 0, VectorClock::new())), vec![(a, 0), (b, 0)]);
    let batch = h.commit();
    assert!(batch.iter().all(|(k, _)| !k.is_held()), "{batch:?}");
    assert_eq!(held_keys(&h.store), vec![page.clone()]);
    // A restart restores b@1 and b@2 only: b@0 is below the head.
    h.restart();
    assert_eq!(h.report.restored_held, 2);
    assert_eq!(h.feed(rec(a, 1, VectorClock::new())), vec![(a, 1), (b, 1)]);
    assert_eq!(h.feed(rec(a, 2, VectorClock::new())), vec![(a, 2), (b, 2)]);
    h.commit();
    assert!(held_keys(&h.store).is_empty());
}

#[test]
fn a_page_stays_within_its_byte_bound_and_a_large_record_has_a_page_of_its_own() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    let big = |o: i64, kib: usize| {
        let mut r = rec(b, o, offsets(&[(a, 0)]));
        r.value = Some(vec![7; kib * 1024]);
        r
    };
    // 20 KiB each: three fit in 64 KiB, a fourth would pass it and starts
    // the next page; the 100 KiB record is alone in its page.
    for o in 0..6 {
        h.feed(big(o, 20));
    }
    h.feed(big(6, 100));
    h.feed(big(7, 1));
    let batch = h.commit();
    let pages = pages_put(&batch);
    assert_eq!(
        pages,
        vec![
            StateKey::QueuePage(b, 0),
            StateKey::QueuePage(b, 3),
            StateKey::QueuePage(b, 6),
            StateKey::QueuePage(b, 7)
        ]
    );
    // Paged out past a window of 2 and read back in order: a request
    // reads within one page, so the window's runs stop at page ends.
    h.restart_windowed(Some(2));
    let mut out = h.feed(rec(a, 0, VectorClock::new()));
    let mut paged = Vec::new();
    let requests = h.serve_pages(&mut paged);
    out.extend(coords(&paged));
    let mut want = vec![(a, 0)];
    want.extend((0..8).map(|o| (b, o)));
    assert_eq!(out, want);
    assert!(
        pages_of(&h.store)
            .iter()
            .all(|&(_, len)| len <= PAGE_BYTES || len > 100 * 1024),
        "{:?}",
        pages_of(&h.store)
    );
    assert_eq!(requests, 5, "2 | 3..5, 5 | 6 | 7");
    assert_eq!(h.node.held_count(), 0);
}

#[test]
fn state_in_the_one_entry_per_record_layout_restores_pages_in_and_is_deleted_as_it_is_released() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut h = Harness::start(config(sender(ME), &[a, b], &[]), FakeBroker::default());
    for o in 0..10 {
        assert!(h.feed(rec(b, o, offsets(&[(a, 0)]))).is_empty());
    }
    h.commit();
    // The Java library's layout (and this library's before pages).
    let legacy = entry_layout(&h.store);
    assert_eq!(held_keys(&legacy).len(), 10);
    assert!(held_keys(&legacy).iter().all(|k| k.contains("/e/")));
    let mut h = Harness::start_from(h.config.clone(), std::mem::take(&mut h.broker), legacy);
    h.node.set_resident_window(Some(3));
    // A later hold goes into a page beside the entries.
    assert!(h.feed(rec(b, 10, offsets(&[(a, 0)]))).is_empty());
    h.commit();
    assert_eq!(held_keys(&h.store).len(), 11);
    let mut out = h.feed(rec(a, 0, VectorClock::new()));
    let mut paged = Vec::new();
    assert!(h.serve_pages(&mut paged) > 0, "entries read back by key");
    out.extend(coords(&paged));
    let mut want = vec![(a, 0)];
    want.extend((0..=10).map(|o| (b, o)));
    assert_eq!(out, want);
    h.commit();
    assert!(held_keys(&h.store).is_empty(), "{:?}", held_keys(&h.store));
}

/// Each page's key and value size in `store`.
fn pages_of(store: &MemStore) -> Vec<(String, usize)> {
    let mut pages = Vec::new();
    store.for_each_state(&mut |key, value| {
        if let Ok(k @ StateKey::QueuePage(..)) = key {
            pages.push((k.to_string(), value.len()));
        }
    });
    pages
}

/// The held-record keys `batch` puts, in order.
fn pages_put(batch: &WriteBatch) -> Vec<StateKey> {
    batch
        .iter()
        .filter(|(k, v)| k.is_held() && v.is_some())
        .map(|(k, _)| k)
        .collect()
}
