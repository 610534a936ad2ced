//! `parsley clock decode` and `parsley clock encode`.
//!
//! The JSON form:
//!
//! ```json
//! {"version":1,
//!  "offsets":[{"topic":"<uuid>","partition":0,"offset":41}],
//!  "sequences":[{"topic":"<uuid>","partition":1,"sender":"<uuid>","seq":7}]}
//! ```
//!
//! Decoding prints entries in canonical order with lower-case hyphenated
//! UUIDs. Encoding accepts entries in any order; two entries for the same
//! channel (or channel and sender) merge by maximum, exactly as the decoder
//! treats duplicates in the binary form.

use std::io::Read;

use parsley_protocol::{Channel, OffsetClaim, SenderId, SequenceClaim, TopicId, VectorClock};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClockJson {
    version: u8,
    offsets: Vec<OffsetJson>,
    sequences: Vec<SequenceJson>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OffsetJson {
    topic: String,
    partition: i32,
    offset: i64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SequenceJson {
    topic: String,
    partition: i32,
    sender: String,
    seq: i64,
}

fn read_stdin() -> Result<String, String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    Ok(s)
}

/// Decodes hex (argument or stdin) into the JSON line.
pub(crate) fn decode(arg: Option<String>) -> Result<String, String> {
    let text = match arg {
        Some(t) => t,
        None => read_stdin()?,
    };
    let text: String = text.split_whitespace().collect();
    if text.is_empty() {
        return Err("no hex given: pass the vc header value as hex, or pipe it on stdin".into());
    }
    let bytes = hex::decode(&text).map_err(|e| format!("invalid hex: {e}"))?;
    let clock = VectorClock::decode(&bytes).map_err(|e| e.to_string())?;
    let json = ClockJson {
        // The version the bytes were written in (1, or the compact 2).
        version: bytes[0],
        offsets: clock
            .offsets()
            .iter()
            .map(|c| OffsetJson {
                topic: c.channel.topic.to_string(),
                partition: c.channel.partition,
                offset: c.offset,
            })
            .collect(),
        sequences: clock
            .sequences()
            .iter()
            .map(|c| SequenceJson {
                topic: c.channel.topic.to_string(),
                partition: c.channel.partition,
                sender: c.sender.to_string(),
                seq: c.seq,
            })
            .collect(),
    };
    serde_json::to_string(&json).map_err(|e| format!("cannot render JSON: {e}"))
}

/// Reads the JSON form on stdin and returns the canonical hex.
pub(crate) fn encode() -> Result<String, String> {
    encode_json(&read_stdin()?)
}

fn encode_json(text: &str) -> Result<String, String> {
    let json: ClockJson =
        serde_json::from_str(text).map_err(|e| format!("malformed clock JSON: {e}"))?;
    use parsley_protocol::clock::{CLOCK_VERSION, CLOCK_VERSION_COMPACT, ClockVersion};
    let Some(version) = ClockVersion::from_byte(json.version) else {
        return Err(format!(
            "unsupported clock version {}, this build writes versions {CLOCK_VERSION} and {CLOCK_VERSION_COMPACT}",
            json.version,
        ));
    };
    let mut offsets = Vec::with_capacity(json.offsets.len());
    for (i, o) in json.offsets.iter().enumerate() {
        let topic: TopicId = o
            .topic
            .parse()
            .map_err(|e| format!("offsets[{i}].topic: {e}"))?;
        non_negative(o.partition.into(), &format!("offsets[{i}].partition"))?;
        non_negative(o.offset, &format!("offsets[{i}].offset"))?;
        offsets.push(OffsetClaim {
            channel: Channel::new(topic, o.partition),
            offset: o.offset,
        });
    }
    let mut sequences = Vec::with_capacity(json.sequences.len());
    for (i, s) in json.sequences.iter().enumerate() {
        let topic: TopicId = s
            .topic
            .parse()
            .map_err(|e| format!("sequences[{i}].topic: {e}"))?;
        let sender: SenderId = s
            .sender
            .parse()
            .map_err(|e| format!("sequences[{i}].sender: {e}"))?;
        non_negative(s.partition.into(), &format!("sequences[{i}].partition"))?;
        non_negative(s.seq, &format!("sequences[{i}].seq"))?;
        sequences.push(SequenceClaim {
            channel: Channel::new(topic, s.partition),
            sender,
            seq: s.seq,
        });
    }
    Ok(hex::encode(
        VectorClock::from_claims(offsets, sequences).encode_as(version),
    ))
}

fn non_negative(v: i64, what: &str) -> Result<(), String> {
    if v < 0 {
        Err(format!("{what} is negative ({v})"))
    } else {
        Ok(())
    }
}
