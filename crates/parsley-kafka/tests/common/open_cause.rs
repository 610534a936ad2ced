//! The memory suites' scenario: a cause in an upstream transaction left
//! open, and many effects claiming it. Included by the tests that use it
//! (with `bench_util` beside it).

use std::time::Duration;

use parsley::protocol::headers::CLOCK_HEADER;
use parsley::protocol::{Channel, VectorClock};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::bench_util::send_when_room;
use crate::common::{config, unique};

/// A transactional producer that wrote one cause to `topic`:0 and left its
/// transaction open (commit it to release what waits).
pub(crate) fn open_cause(topic: &str) -> BaseProducer {
    let mut c = config();
    c.set("transactional.id", unique("upstream"))
        .set("transaction.timeout.ms", "600000");
    let upstream: BaseProducer = c.create().unwrap();
    upstream.init_transactions(Duration::from_secs(20)).unwrap();
    upstream.begin_transaction().unwrap();
    send_when_room(
        &upstream,
        BaseRecord::to(topic).partition(0).key("k").payload("cause"),
    );
    upstream.flush(Duration::from_secs(20)).unwrap();
    upstream
}

/// A `vc` header claiming `claim` up to `offset`.
pub(crate) fn stamped(claim: Channel, offset: i64) -> OwnedHeaders {
    let mut clock = VectorClock::new();
    clock.claim_offset(claim, offset);
    OwnedHeaders::new().insert(Header {
        key: CLOCK_HEADER,
        value: Some(&clock.encode()),
    })
}

/// `n` effects to `topic`:0, keyed `k000000`, `k000001`, ..., with
/// 100-byte values, each claiming `cause`:0@0.
pub(crate) fn send_effects(topic: &str, n: usize, cause: Channel) {
    let producer: BaseProducer = config().set("linger.ms", "20").create().unwrap();
    let value = "v".repeat(100);
    for i in 0..n {
        let key = format!("k{i:06}");
        send_when_room(
            &producer,
            BaseRecord::to(topic)
                .partition(0)
                .key(key.as_str())
                .payload(value.as_str())
                .headers(stamped(cause, 0)),
        );
    }
    producer.flush(Duration::from_secs(120)).unwrap();
}
