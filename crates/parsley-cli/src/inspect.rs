//! `parsley inspect`: a live topic's records as a plain `read_committed`
//! consumer sees them, with each record's coordinate, sender tag and the
//! claims of its clock, topic ids resolved to names.

use crate::connect::Connection;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parsley::protocol::headers::CausalHeaders;
use parsley::protocol::{TopicId, VectorClock};
use parsley_kafka::KafkaCluster;
use parsley_kafka::clients::read_causal;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

/// Where reading starts in each partition.
#[derive(Clone, Copy, Debug)]
pub enum Start {
    /// The log start.
    Beginning,
    /// This offset (one partition).
    Offset(i64),
    /// The last `count` records before the end.
    Tail,
}

/// What to inspect.
#[derive(Clone, Debug)]
pub struct Inspect {
    /// The cluster.
    pub cluster: Connection,
    /// The topic.
    pub topic: String,
    /// One partition, or all.
    pub partition: Option<i32>,
    /// Where to start.
    pub start: Start,
    /// Records at most (per partition for a tail).
    pub count: usize,
    /// JSON lines instead of a table.
    pub json: bool,
}

#[derive(Serialize)]
struct Claim {
    topic: String,
    partition: i32,
    offset: Option<i64>,
    sender: Option<String>,
    seq: Option<i64>,
}

#[derive(Serialize)]
struct Line {
    topic: String,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    stamped: bool,
    sender: Option<String>,
    seq: Option<i64>,
    claims: Vec<Claim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    corrupt: Option<String>,
}

/// What the command found: the lines to print, and whether any record had
/// corrupt causal headers (the command then exits non-zero).
#[derive(Debug)]
pub struct Report {
    /// One printed line per record.
    pub lines: Vec<String>,
    /// Records with corrupt causal headers.
    pub corrupt: usize,
}

/// Topic names by id, for every topic the cluster lists.
fn names(
    cluster: &KafkaCluster,
    consumer: &BaseConsumer,
) -> Result<BTreeMap<TopicId, String>, String> {
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(20))
        .map_err(|e| format!("cannot list topics: {e}"))?;
    let all: Vec<&str> = metadata.topics().iter().map(|t| t.name()).collect();
    let described = cluster
        .describe_topics(&all)
        .map_err(|e| format!("cannot describe topics: {e}"))?;
    Ok(described
        .into_iter()
        .filter_map(|(name, d)| match d {
            parsley_kafka::topic_ids::Described::Present { id, .. } => Some((id, name)),
            parsley_kafka::topic_ids::Described::Absent => None,
        })
        .collect())
}

fn claims(clock: &VectorClock, names: &BTreeMap<TopicId, String>) -> Vec<Claim> {
    let name = |t: TopicId| names.get(&t).cloned().unwrap_or_else(|| t.to_string());
    let mut out: Vec<Claim> = clock
        .offsets()
        .iter()
        .map(|o| Claim {
            topic: name(o.channel.topic),
            partition: o.channel.partition,
            offset: Some(o.offset),
            sender: None,
            seq: None,
        })
        .collect();
    out.extend(clock.sequences().iter().map(|q| Claim {
        topic: name(q.channel.topic),
        partition: q.channel.partition,
        offset: None,
        sender: Some(q.sender.to_string()),
        seq: Some(q.seq),
    }));
    out
}

fn table(line: &Line) -> String {
    let at = format!("{}:{}@{}", line.topic, line.partition, line.offset);
    if let Some(e) = &line.corrupt {
        return format!("{at}  CORRUPT causal headers: {e}");
    }
    if !line.stamped {
        return format!("{at}  unstamped (claims nothing)");
    }
    let sender = match (&line.sender, line.seq) {
        (Some(s), Some(q)) => format!("sender {s} seq {q}"),
        _ => "no sender tag".to_owned(),
    };
    let claims: Vec<String> = line
        .claims
        .iter()
        .map(|c| match (c.offset, &c.sender, c.seq) {
            (Some(o), _, _) => format!("{}:{} <= {o}", c.topic, c.partition),
            (None, Some(s), Some(q)) => format!("{}:{} seq({s}) <= {q}", c.topic, c.partition),
            _ => format!("{}:{}", c.topic, c.partition),
        })
        .collect();
    let claims = if claims.is_empty() {
        "claims nothing".to_owned()
    } else {
        format!("claims {}", claims.join(", "))
    };
    format!("{at}  {sender}  {claims}")
}

/// Reads the records and describes each.
pub fn run(args: &Inspect) -> Result<Report, String> {
    let mut config = args.cluster.client_config();
    config
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("group.id", "parsley-inspect");
    let cluster = KafkaCluster::new(&config, Duration::from_secs(20))
        .map_err(|e| format!("cannot reach {}: {e}", args.cluster.bootstrap))?;
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    let names = names(&cluster, &consumer)?;
    let partitions = match names.values().any(|n| *n == args.topic) {
        false => return Err(format!("topic {:?} does not exist", args.topic)),
        true => {
            let metadata = consumer
                .fetch_metadata(Some(&args.topic), Duration::from_secs(20))
                .map_err(|e| format!("cannot describe {}: {e}", args.topic))?;
            let n = metadata
                .topics()
                .first()
                .map_or(0, |t| t.partitions().len() as i32);
            match args.partition {
                Some(p) if p < 0 || p >= n => {
                    return Err(format!(
                        "topic {:?} has {n} partition(s); there is no partition {p}",
                        args.topic
                    ));
                }
                Some(p) => vec![p],
                None => (0..n).collect(),
            }
        }
    };
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(&args.topic, p, Duration::from_secs(20))
            .map_err(|e| format!("cannot read the offsets of {}:{p}: {e}", args.topic))?;
        let start = match args.start {
            Start::Beginning => low,
            Start::Offset(o) => o.max(low),
            Start::Tail => (high - args.count as i64).max(low),
        };
        ends.insert(p, high);
        tpl.add_partition_offset(&args.topic, p, Offset::Offset(start))
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    let mut corrupt = 0;
    let mut done: BTreeMap<i32, bool> = partitions.iter().map(|p| (*p, false)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines.len() < args.count && done.values().any(|d| !d) && Instant::now() < deadline {
        // A partition is done once its position reaches the end it had
        // when the command started (markers never come as records).
        for (p, d) in &mut done {
            if let Ok(pos) = consumer.position()
                && let Some(e) = pos.find_partition(&args.topic, *p)
                && let Offset::Offset(o) = e.offset()
            {
                *d = o >= ends[p];
            }
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.map_err(|e| format!("read failed: {e}"))?;
        let (causal, error) = match read_causal(&m) {
            Ok(c) => (c, None),
            Err(e) => {
                corrupt += 1;
                (CausalHeaders::default(), Some(e.to_string()))
            }
        };
        let stamped = m
            .headers()
            .is_some_and(|h| rdkafka::message::Headers::iter(h).any(|h| h.key == "vc"));
        let line = Line {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            stamped,
            sender: causal.sender.map(|t| t.sender.to_string()),
            seq: causal.sender.map(|t| t.seq),
            claims: claims(&causal.clock, &names),
            corrupt: error,
        };
        lines.push(if args.json {
            serde_json::to_string(&line).map_err(|e| e.to_string())?
        } else {
            table(&line)
        });
    }
    Ok(Report { lines, corrupt })
}
