#![allow(missing_docs)]
//! Protocol benchmarks.
//!
//! Run with `cargo bench -p parsley-protocol --bench protocol`.
//!
//! * `clock/{decode,encode,dominates}/W`: a clock of W offset claims.
//! * `node/deliver_empty_queues`: one record in, delivered at once, clock
//!   width 16.
//! * `node/release_on_trigger/K`: K records held on one channel, released by
//!   one record on another.
//! * `node/cascade_depth/R`: a chain held across R channels, released by one
//!   record at its end.
//! * `node/restore/N`: init from a store holding N held records, each with a
//!   100-byte value and a 9-entry clock (divide by N for the per-record
//!   cost; dropping the node afterwards is not timed).
//! * `stamp/{send,encode,encode_compact,decode,decode_compact,gate}/P`: a
//!   stage writing one sink of P partitions (its own-output seed claims
//!   every one, so its stamps are P wide): stamping one output, encoding
//!   its `vc` in version 1 and in the compact version 2, decoding each, and
//!   a downstream stage that consumes one partition of that sink gating
//!   the output. The `vc` sizes per P are printed once, before the timings.
//! * `release/{decoded,paged}/N`: N held records (100-byte values),
//!   committed to a store, released by their cause: all kept decoded, or
//!   paged out past a window of 256 and read back from the store as the
//!   host would (divide by N for the per-record release cost).

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use parsley_protocol::*;

fn channel(i: u64) -> Channel {
    // Spread ids over the signed range like random UUIDs would.
    let t = TopicId::from_halves(
        (i as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64),
        i as i64,
    );
    Channel::new(t, (i % 3) as i32)
}

fn clock(width: u64, base: i64) -> VectorClock {
    VectorClock::from_claims(
        (0..width).map(|i| OffsetClaim {
            channel: channel(i),
            offset: base + i as i64,
        }),
        [],
    )
}

fn bench_clock(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    for width in [1u64, 4, 16, 64] {
        let clk = clock(width, 1_000);
        let bytes = clk.encode();
        let lower = clock(width, 999);
        g.bench_with_input(BenchmarkId::new("decode", width), &bytes, |b, bytes| {
            b.iter(|| VectorClock::decode(black_box(bytes)))
        });
        let mut buf = Vec::with_capacity(clk.encoded_len());
        g.bench_with_input(BenchmarkId::new("encode", width), &clk, |b, clk| {
            b.iter(|| {
                buf.clear();
                black_box(clk).encode_into(&mut buf);
                black_box(buf.len())
            })
        });
        g.bench_with_input(BenchmarkId::new("encode_alloc", width), &clk, |b, clk| {
            b.iter(|| black_box(clk).encode())
        });
        g.bench_with_input(
            BenchmarkId::new("dominates", width),
            &(clk.clone(), lower),
            |b, (hi, lo)| b.iter(|| black_box(hi).dominates(black_box(lo))),
        );
    }
    g.finish();
}

struct NoBroker;

impl BrokerOffsets for NoBroker {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(topics
            .iter()
            .map(|&t| (t, TopicOffsets::Present(BTreeMap::from([(0, 100)]))))
            .collect())
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        self.end_offsets(topics)
    }
}

fn node(inputs: impl IntoIterator<Item = Channel>) -> CausalNode {
    let config = NodeConfig {
        sender: SenderId::from_u128(7),
        inputs: inputs.into_iter().collect(),
        sinks: BTreeSet::new(),
    };
    match CausalNode::init(config, &MemStore::new(), &NoBroker) {
        Ok(i) => i.node,
        Err(e) => panic!("init: {e}"),
    }
}

fn record(channel: Channel, offset: i64, clock: VectorClock) -> InboundRecord {
    InboundRecord {
        channel,
        offset,
        timestamp: 0,
        key: Some(b"order-1234".to_vec()),
        value: Some(vec![0u8; 100]),
        headers: vec![],
        causal: CausalHeaders {
            clock,
            sender: None,
        },
    }
}

fn bench_node(c: &mut Criterion) {
    let mut g = c.benchmark_group("node");

    // One record in and out: four consumed channels, clock width 16 whose
    // claims on the consumed channels are all met.
    {
        let inputs: Vec<Channel> = (0..4).map(channel).collect();
        let mut n = node(inputs.clone());
        for (i, &ch) in inputs.iter().enumerate() {
            let _ = n.on_record(record(ch, 5_000 + i as i64, VectorClock::new()));
        }
        let mut next = 10_000i64;
        let claims = clock(16, 0);
        g.bench_function("deliver_empty_queues", |b| {
            b.iter_batched(
                || {
                    next += 1;
                    record(inputs[0], next, claims.clone())
                },
                |r| {
                    let out = n.on_record(r);
                    black_box(out)
                },
                BatchSize::SmallInput,
            )
        });
    }

    // K held records released by one trigger.
    for k in [1usize, 16, 256] {
        let (a, b) = (channel(0), channel(1));
        g.throughput(Throughput::Elements(k as u64));
        g.bench_with_input(
            BenchmarkId::new("release_on_trigger", k),
            &k,
            |bench, &k| {
                bench.iter_batched(
                    || {
                        let mut n = node([a, b]);
                        let wait = VectorClock::from_claims(
                            [OffsetClaim {
                                channel: b,
                                offset: 0,
                            }],
                            [],
                        );
                        for i in 0..k {
                            let _ = n.on_record(record(a, i as i64, wait.clone()));
                        }
                        (n, record(b, 0, VectorClock::new()))
                    },
                    |(mut n, trigger)| {
                        let out = n.on_record(trigger);
                        black_box(out)
                    },
                    BatchSize::SmallInput,
                )
            },
        );
    }

    // A chain across R channels, each head waiting on the next channel.
    for r in [4u64, 16, 64] {
        let chans: Vec<Channel> = (0..r).map(channel).collect();
        g.throughput(Throughput::Elements(r));
        g.bench_with_input(BenchmarkId::new("cascade_depth", r), &r, |bench, _| {
            bench.iter_batched(
                || {
                    let mut n = node(chans.iter().copied());
                    for w in chans.windows(2) {
                        let wait = VectorClock::from_claims(
                            [OffsetClaim {
                                channel: w[1],
                                offset: 0,
                            }],
                            [],
                        );
                        let _ = n.on_record(record(w[0], 0, wait));
                    }
                    (n, record(chans[chans.len() - 1], 0, VectorClock::new()))
                },
                |(mut n, trigger)| black_box(n.on_record(trigger)),
                BatchSize::SmallInput,
            )
        });
    }

    // Restoring N held records.
    for count in [100usize, 1_000, 10_000] {
        let (a, b) = (channel(0), channel(1));
        let mut n = node([a, b]);
        let wait = {
            let mut c = clock(8, 0);
            c.claim_offset(b, 1_000_000);
            c
        };
        for i in 0..count {
            let _ = n.on_record(record(a, i as i64, wait.clone()));
        }
        let mut store = MemStore::new();
        store.apply(&n.take_writes());
        let config = NodeConfig {
            sender: SenderId::from_u128(7),
            inputs: BTreeSet::from([a, b]),
            sinks: BTreeSet::new(),
        };
        g.throughput(Throughput::Elements(count as u64));
        g.bench_with_input(BenchmarkId::new("restore", count), &count, |bench, _| {
            // Restore only: tearing the node down again is not part of it.
            bench.iter_with_large_drop(|| CausalNode::init(config.clone(), &store, &NoBroker))
        });
    }
    g.finish();
}

/// A broker whose every topic has `partitions` partitions, all ending at
/// offset 100.
struct Wide(i32);

impl BrokerOffsets for Wide {
    fn end_offsets(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(topics
            .iter()
            .map(|&t| {
                (
                    t,
                    // A sink some 12M records deep, its partitions tens of
                    // thousands of records apart (what the compact clock's
                    // differences see in a real sink).
                    TopicOffsets::Present(
                        (0..self.0)
                            .map(|p| (p, 12_000_000 + (i64::from(p) * 7_919) % 50_000))
                            .collect(),
                    ),
                )
            })
            .collect())
    }

    fn log_starts(
        &self,
        topics: &BTreeSet<TopicId>,
    ) -> Result<BTreeMap<TopicId, TopicOffsets>, BrokerOffsetsError> {
        Ok(topics
            .iter()
            .map(|&t| {
                (
                    t,
                    TopicOffsets::Present((0..self.0).map(|p| (p, 0)).collect()),
                )
            })
            .collect())
    }
}

fn bench_stamp(c: &mut Criterion) {
    let mut g = c.benchmark_group("stamp");
    let input = channel(0);
    let sink = TopicId::from_halves(0x5151, 0x5252);
    for partitions in [1i32, 12, 48, 100] {
        let broker = Wide(partitions);
        let config = NodeConfig {
            sender: SenderId::from_u128(9),
            inputs: BTreeSet::from([input]),
            sinks: BTreeSet::from([sink]),
        };
        let mut upstream = match CausalNode::init(config, &MemStore::new(), &broker) {
            Ok(i) => i.node,
            Err(e) => panic!("init: {e}"),
        };
        let _ = upstream.on_record(record(input, 0, VectorClock::new()));
        let out = Channel::new(sink, 0);
        let headers = match upstream.prepare_send(out) {
            Ok(h) => h,
            Err(e) => panic!("stamp: {e}"),
        };
        let vc = headers.clock.encode();
        let compact = headers.clock.encode_compact();
        eprintln!(
            "stamp: a sink of {partitions} partition(s): vc {} bytes (version 1), {} bytes (compact), {} offset claims",
            vc.len(),
            compact.len(),
            headers.clock.offsets().len()
        );
        g.bench_with_input(BenchmarkId::new("send", partitions), &out, |b, &out| {
            b.iter(|| black_box(upstream.prepare_send(black_box(out))))
        });
        let mut buf = Vec::with_capacity(vc.len());
        g.bench_with_input(
            BenchmarkId::new("encode", partitions),
            &headers.clock,
            |b, clock| {
                b.iter(|| {
                    buf.clear();
                    black_box(clock).encode_into(&mut buf);
                    black_box(buf.len())
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("encode_compact", partitions),
            &headers.clock,
            |b, clock| {
                b.iter(|| {
                    buf.clear();
                    black_box(clock).encode_compact_into(&mut buf);
                    black_box(buf.len())
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("decode", partitions), &vc, |b, vc| {
            b.iter(|| black_box(VectorClock::decode(black_box(vc))))
        });
        g.bench_with_input(
            BenchmarkId::new("decode_compact", partitions),
            &compact,
            |b, compact| b.iter(|| black_box(VectorClock::decode(black_box(compact)))),
        );
        // Downstream: consumes partition 0 of the sink; the claims on the
        // other partitions are carried, not gated.
        let mut downstream = node([out]);
        let mut next = 1_000i64;
        g.bench_with_input(
            BenchmarkId::new("gate", partitions),
            &headers.clock,
            |b, clock| {
                b.iter_batched(
                    || {
                        next += 1;
                        record(out, next, clock.clone())
                    },
                    |r| black_box(downstream.on_record(r)),
                    BatchSize::SmallInput,
                )
            },
        );
    }
    g.finish();
}

fn bench_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("release");
    g.sample_size(20);
    let (cause, held) = (channel(0), channel(1));
    let n = 100_000i64;
    for (name, window) in [("decoded", None), ("paged", Some(256))] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new(name, n), |b| {
            b.iter_batched(
                || {
                    let mut store = MemStore::new();
                    let mut node = node([cause, held]);
                    node.set_resident_window(window);
                    let mut claim = VectorClock::new();
                    claim.claim_offset(cause, 0);
                    for o in 0..n {
                        let _ = node.on_record(record(held, o, claim.clone()));
                    }
                    store.apply_owned(node.take_writes());
                    (node, store)
                },
                |(mut node, store)| {
                    let mut out = match node.on_record(record(cause, 0, VectorClock::new())) {
                        Ok(out) => out,
                        Err(e) => panic!("release: {e}"),
                    };
                    loop {
                        let requests = node.page_requests();
                        if requests.is_empty() {
                            break;
                        }
                        for r in requests {
                            let mut records = Vec::with_capacity(r.count);
                            for key in r.keys() {
                                if let Some(bytes) = store.get_state(key) {
                                    let _ = r.decode(key, bytes, &mut records);
                                }
                            }
                            if let Err(e) = node.page_in(r.channel, records, &mut out) {
                                panic!("page in: {e}");
                            }
                        }
                    }
                    assert_eq!(out.len() as i64, n + 1);
                    black_box(out.len())
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench_clock, bench_node, bench_stamp, bench_release);
criterion_main!(benches);
