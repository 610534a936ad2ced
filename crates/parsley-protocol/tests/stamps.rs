//! Stamps written as bytes: `prepare_send_into` and the host's
//! `StampWriter` give exactly the stamp `prepare_send` gives, in either
//! clock version, and a writer's stamps share buffers instead of taking one
//! allocation each.

mod common;

use common::*;
use parsley_protocol::clock::ClockVersion;
use parsley_protocol::host::StampWriter;
use parsley_protocol::*;

const ME: u128 = 0x57A4;

/// A node consuming `a` and `b` into sinks 9 (two partitions) and 8, after
/// deliveries whose clocks claim offsets elsewhere, a sequence it cannot
/// resolve, and a sequence it can.
fn busy_node() -> Harness {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let (far, other) = (ch(5, 0), ch(6, 3));
    let upstream = sender(0xF00);
    let broker = FakeBroker::default()
        .with_topic(topic(9), 2, 0)
        .with_topic(topic(8), 1, 0);
    let mut h = Harness::start(config(sender(ME), &[a, b], &[topic(9), topic(8)]), broker);
    h.feed(rec(a, 0, offsets(&[(far, 20), (other, 4)])));
    h.feed(tagged(
        rec(b, 0, seqs(&[(ch(7, 1), upstream, 3)])),
        upstream,
        1,
    ));
    h.feed(rec(a, 1, seqs(&[(b, upstream, 1)])));
    h
}

#[test]
fn a_written_stamp_is_the_stamp_prepare_send_gives_in_both_versions() {
    let (mut plain, mut written) = (busy_node(), busy_node());
    let mut writer = StampWriter::new();
    let x0 = ch(9, 0);
    let x1 = ch(9, 1);
    let y0 = ch(8, 0);
    // Destinations in an order where each one's own echo must be left out
    // after other channels' sends were claimed, with deliveries between.
    let plan = [x0, x1, x0, y0, x1, y0, x0];
    for (i, &to) in plan.iter().enumerate() {
        if i == 3 {
            let r = rec(ch(1, 0), 2, offsets(&[(ch(5, 0), 30)]));
            plain.feed(r.clone());
            written.feed(r);
        }
        let version = if i % 2 == 0 {
            ClockVersion::V1
        } else {
            ClockVersion::Compact
        };
        let expected = plain.node.prepare_send(to).unwrap();
        let stamp = writer.stamp(&mut written.node, to, version).unwrap();
        assert_eq!(
            &stamp.clock[..],
            &expected.clock.encode_as(version)[..],
            "send {i}"
        );
        assert_eq!(Some(stamp.sender), expected.sender, "send {i}");
        assert_eq!(stamp.decode().unwrap(), expected, "send {i}");
    }
    // The claims the plan was built to exercise are there.
    let last = written.node.prepare_send(x1).unwrap();
    // The upstream sequence claim on b was resolved into an offset claim.
    assert_eq!(last.clock.offset(ch(2, 0)), Some(0));
    assert_eq!(last.clock.sequence(ch(2, 0), sender(0xF00)), None);
    assert_eq!(last.clock.sequence(ch(7, 1), sender(0xF00)), Some(3));
    assert_eq!(last.clock.sequence(x0, sender(ME)), Some(3));
    assert_eq!(last.clock.sequence(x1, sender(ME)), None, "no own echo");
}

#[test]
fn a_writers_stamps_share_buffers() {
    let mut h = busy_node();
    let mut writer = StampWriter::new();
    let x0 = ch(9, 0);
    let expected = h.node.prepare_send(x0).unwrap().clock.encode();
    let stamps: Vec<_> = (0..500)
        .map(|_| writer.stamp(&mut h.node, x0, ClockVersion::V1).unwrap())
        .collect();
    // Each stamp starts where the one before ended, except where a buffer
    // filled and the writer took the next.
    let mut buffers = 1;
    for (i, pair) in stamps.windows(2).enumerate() {
        assert_eq!(&pair[1].clock[..], &expected[..], "stamp {}", i + 1);
        assert_eq!(pair[1].sender.seq, i as i64 + 3);
        if pair[0].clock.as_ptr_range().end != pair[1].clock.as_ptr() {
            buffers += 1;
        }
    }
    // 64 stamps of this width to a buffer: eight buffers for 500.
    assert_eq!(
        buffers,
        500_usize.div_ceil(64),
        "{} bytes a stamp",
        expected.len()
    );
    // Released, the writer starts the next stamp in a buffer of its own.
    writer.release();
    let after = writer.stamp(&mut h.node, x0, ClockVersion::V1).unwrap();
    assert_ne!(stamps[499].clock.as_ptr_range().end, after.clock.as_ptr());
    assert_eq!(&after.clock[..], &expected[..]);
    // A stamp outlives the writer and the stamps sharing its buffer.
    let kept = stamps[7].clone();
    drop(stamps);
    drop(writer);
    assert_eq!(&kept.clock[..], &expected[..]);
}

#[test]
fn a_stamp_to_an_undeclared_sink_is_refused_and_takes_no_sequence() {
    let mut h = busy_node();
    let mut writer = StampWriter::new();
    let err = writer
        .stamp(&mut h.node, ch(4, 0), ClockVersion::V1)
        .unwrap_err();
    assert!(matches!(err, ProtocolError::UndeclaredSink { .. }), "{err}");
    let first = writer
        .stamp(&mut h.node, ch(9, 0), ClockVersion::V1)
        .unwrap();
    assert_eq!(first.sender.seq, 1);
}

#[test]
fn a_stamped_record_writes_the_headers_it_lists_stamp_first_in_both_versions() {
    use parsley_protocol::host::OutgoingRecord;
    use std::sync::Arc;
    let mut h = busy_node();
    let mut writer = StampWriter::new();
    for version in [ClockVersion::V1, ClockVersion::Compact] {
        let stamp = writer.stamp(&mut h.node, ch(9, 1), version).unwrap();
        let expected = stamp.decode().unwrap();
        let record = OutgoingRecord {
            topic: Arc::from("out"),
            partition: 1,
            key: None,
            value: Some(b"v".to_vec().into()),
            timestamp: 5,
            stamp: Some(stamp),
            headers: vec![Header::new("trace", b"t-1".to_vec())],
            origin: None,
        };
        let mut written = Vec::new();
        record.write_headers(|name, value| {
            written.push(Header {
                name: name.to_owned().into(),
                value: value.map(<[u8]>::to_vec),
            })
        });
        let listed = record.header_list();
        assert_eq!(written, listed, "{version:?}");
        assert_eq!(record.header_count(), 4);
        let names: Vec<&str> = listed.iter().map(|h| h.name()).collect();
        assert_eq!(names, ["vc", "vc-sender", "vc-seq", "trace"]);
        let decoded =
            CausalHeaders::decode(listed.iter().map(|h| (h.name(), h.value.as_deref()))).unwrap();
        assert_eq!(decoded, expected, "{version:?}");
        assert_eq!(
            ClockVersion::of(listed[0].value.as_deref().unwrap()),
            Some(version)
        );
    }
}
