//! Stage logic for simulated nodes: what a node emits for each delivery.
//!
//! A record's payload is an entity key (8 bytes, big-endian) and a hop
//! budget (4 bytes, big-endian) that damped feedback counts down.

/// Where an output goes within its topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Partition = entity key modulo the partition count.
    ByKey,
    /// Partitions in turn (a per-incarnation counter).
    RoundRobin,
    /// Always this partition.
    Partition(i32),
}

/// One output of a behaviour: a sink topic (by name) and a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// The sink topic's name.
    pub topic: String,
    /// How the partition is chosen.
    pub route: Route,
}

impl Output {
    /// An output routed by key.
    pub fn by_key(topic: &str) -> Output {
        Output {
            topic: topic.to_owned(),
            route: Route::ByKey,
        }
    }

    /// An output to a fixed partition.
    pub fn to(topic: &str, partition: i32) -> Output {
        Output {
            topic: topic.to_owned(),
            route: Route::Partition(partition),
        }
    }

    /// An output spreading over partitions in turn.
    pub fn round_robin(topic: &str) -> Output {
        Output {
            topic: topic.to_owned(),
            route: Route::RoundRobin,
        }
    }
}

/// What a node does with each delivered record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Consumes and emits nothing (a checking consumer).
    Sink,
    /// Emits one record to each output, in order (more than one output is
    /// fan-out: the later emissions claim the earlier ones).
    Forward(Vec<Output>),
    /// Like `Forward`, but only for records whose key is a multiple of
    /// `keep_one_in`; every other delivery emits nothing, so the sinks go
    /// quiet and their last transaction markers trail.
    Filter {
        /// Keep one key in this many.
        keep_one_in: u64,
        /// Where kept records go.
        outputs: Vec<Output>,
    },
    /// Forwards while the record's hop budget lasts, one hop less each time:
    /// a cycle built from these converges.
    Feedback(Vec<Output>),
    /// Emits one record, to the output the key picks (key modulo the number
    /// of outputs): one node's sends spread over several sinks.
    Choose(Vec<Output>),
}

/// A simulated record's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Payload {
    /// The entity key.
    pub key: u64,
    /// Hops left for damped feedback.
    pub hops: u32,
}

impl Payload {
    /// Key bytes.
    pub fn key_bytes(&self) -> Vec<u8> {
        self.key.to_be_bytes().to_vec()
    }

    /// Value bytes.
    pub fn value_bytes(&self) -> Vec<u8> {
        self.hops.to_be_bytes().to_vec()
    }

    /// Reads a payload back (missing or short fields read as zero).
    pub fn decode(key: Option<&[u8]>, value: Option<&[u8]>) -> Payload {
        let key = key
            .and_then(|k| <[u8; 8]>::try_from(k).ok())
            .map_or(0, u64::from_be_bytes);
        let hops = value
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map_or(0, u32::from_be_bytes);
        Payload { key, hops }
    }
}

impl Behavior {
    /// The emissions for one delivered payload: (output, payload) in order.
    pub fn react(&self, p: Payload) -> Vec<(&Output, Payload)> {
        match self {
            Behavior::Sink => Vec::new(),
            Behavior::Forward(outs) => outs.iter().map(|o| (o, p)).collect(),
            Behavior::Filter {
                keep_one_in,
                outputs,
            } => {
                if p.key.is_multiple_of((*keep_one_in).max(1)) {
                    outputs.iter().map(|o| (o, p)).collect()
                } else {
                    Vec::new()
                }
            }
            Behavior::Choose(outs) => match outs.len() {
                0 => Vec::new(),
                n => vec![(&outs[(p.key % n as u64) as usize], p)],
            },
            Behavior::Feedback(outs) => {
                if p.hops == 0 {
                    Vec::new()
                } else {
                    let next = Payload {
                        key: p.key,
                        hops: p.hops - 1,
                    };
                    outs.iter().map(|o| (o, next)).collect()
                }
            }
        }
    }
}
