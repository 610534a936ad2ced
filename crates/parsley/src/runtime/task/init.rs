//! Building a task: its node from the protocol store, its fold state, its
//! tick schedule and its source and sink tables.

use super::*;

impl Task {
    /// Starts task `partition` of `stage` from committed state: describes
    /// its topics, initialises the causal node (restore, rescope, own-output
    /// seed), loads the fold state, and processes whatever the node released
    /// during init. Those records' outputs belong to the first transaction.
    ///
    /// A task consumes partition `partition` of each source topic. All of a
    /// stage's sources, and its tick topic, must have the same partition
    /// count ([`TaskError::PartitionCounts`] otherwise).
    pub fn init(
        app: &Parsley,
        stage: &str,
        partition: i32,
        stores: TaskStores,
        metadata: &dyn TopicMetadata,
        broker: &dyn BrokerOffsets,
        now_ms: i64,
    ) -> Result<Task, TaskError> {
        let id = TaskId {
            stage: stage.to_owned(),
            partition,
        };
        let config_err = |message: String| TaskError::Config {
            task: id.clone(),
            message,
        };
        let Some(stage_def) = app.stage(stage).cloned() else {
            return Err(config_err(format!(
                "application {:?} has no stage {stage:?}",
                app.application_id()
            )));
        };
        let Routes {
            mut inputs,
            slots,
            names,
            sinks,
            tick_route,
            partitions,
        } = Routes::of(app, &stage_def, &id, metadata)?;
        inputs.sort_by_key(|i| i.channel);
        let config = NodeConfig {
            sender: app.sender_id(stage, partition),
            inputs: inputs.iter().map(|i| i.channel).collect(),
            sinks: sinks
                .values()
                .map(|s| s.id)
                .chain(tick_route.as_ref().map(|(_, c)| c.topic))
                .collect(),
        };
        // Held records that only the local store holds are read from it,
        // and those beyond the window are checked but never kept in memory.
        let view = stores.held.view(&stores.protocol);
        let init = CausalNode::init_windowed(config, &view, broker, stores.held.window());
        if let Some(cause) = view.failure() {
            return Err(TaskError::LocalStore {
                task: id.clone(),
                cause,
            });
        }
        drop(view);
        let init = init.map_err(|source| TaskError::Protocol {
            task: id.clone(),
            cause: source,
        })?;
        info!(
            task = %id,
            channels = ?inputs.iter().map(|i| format!("{} -> {}", i.topic, i.channel)).collect::<Vec<_>>(),
            restored_held = init.report.restored_held,
            released_at_init = init.deliveries.len(),
            "task initialised"
        );
        let ticks = ticks::TickSchedule::starting(now_ms, stage_def.tick_interval().map(ms));
        let mut task = Task {
            app: app.clone(),
            stage: stage_def,
            id,
            node: init.node,
            inputs,
            slots,
            names,
            sinks,
            tick_route,
            partitions,
            stores,
            in_flight: None,
            pending_fold: FoldWrites::new(),
            key_scratch: Vec::new(),
            outgoing: Vec::new(),
            stamps: StampWriter::new(),
            events: Vec::new(),
            record_events: true,
            acted: false,
            deliveries: Vec::new(),
            wall_clock: now_ms,
            ticks,
            holds: holds::Holds::default(),
            poisoned: false,
            stats: TaskStats::default(),
            dead_letters: BTreeMap::new(),
        };
        task.describe_dead_letters(metadata)?;
        task.set_release_cap(task.stores.release_cap);
        let mut deliveries = init.deliveries;
        task.release(&mut deliveries)?;
        task.refresh_holds();
        Ok(task)
    }

    /// Describes the dead-letter topics this task may step records past
    /// to: the stage's own, and any an operator recorded in the store.
    fn describe_dead_letters(&mut self, metadata: &dyn TopicMetadata) -> Result<(), TaskError> {
        let mut dead: Vec<String> = self
            .node
            .stepped()
            .map(|(_, _, s)| s.dead_letter.clone())
            .collect();
        dead.extend(self.stage.corrupt_headers_dead_letter().map(str::to_owned));
        for topic in dead {
            if !self.dead_letters.contains_key(&topic) {
                let d = metadata
                    .describe(&topic)
                    .map_err(|cause| TaskError::Metadata {
                        task: self.id.clone(),
                        cause,
                    })?;
                self.dead_letters.insert(topic, d.partitions);
            }
        }
        Ok(())
    }
}

/// Where a task's records come from and go: its input channels, which
/// source each input topic feeds, every topic's name by id, its sinks and
/// its tick route.
struct Routes {
    inputs: Vec<InputChannel>,
    slots: BTreeMap<TopicId, SourceSlot>,
    names: BTreeMap<TopicId, std::sync::Arc<str>>,
    sinks: BTreeMap<String, SinkInfo>,
    tick_route: Option<(std::sync::Arc<str>, Channel)>,
    /// The partition count the stage's sources share.
    partitions: i32,
}

impl Routes {
    /// Describes the stage's topics for task `id`. Every source and the
    /// tick topic must have the same partition count, and the task's
    /// partition must be one of them.
    fn of(
        app: &Parsley,
        stage_def: &Stage,
        id: &TaskId,
        metadata: &dyn TopicMetadata,
    ) -> Result<Routes, TaskError> {
        let partition = id.partition;
        let stage = id.stage.as_str();
        let config_err = |message: String| TaskError::Config {
            task: id.clone(),
            message,
        };
        let describe = |topic: &str| {
            metadata
                .describe(topic)
                .map_err(|source| TaskError::Metadata {
                    task: id.clone(),
                    cause: source,
                })
        };
        let mut inputs = Vec::new();
        let mut slots = BTreeMap::new();
        let mut names = BTreeMap::new();
        let mut counts: Vec<(String, i32)> = Vec::new();
        for (i, src) in stage_def.def.sources.iter().enumerate() {
            let name = src.topic.name();
            let d = describe(name)?;
            counts.push((name.to_owned(), d.partitions));
            slots.insert(d.id, SourceSlot::User(i));
            names.insert(d.id, name.into());
            inputs.push(InputChannel {
                topic: name.to_owned(),
                channel: Channel::new(d.id, partition),
                tick: false,
            });
        }
        let mut sinks = BTreeMap::new();
        for sink in &stage_def.def.sinks {
            let d = describe(sink.name())?;
            names.insert(d.id, sink.name().into());
            sinks.insert(
                sink.name().to_owned(),
                SinkInfo {
                    id: d.id,
                    partitions: d.partitions,
                    clock: if stage_def.writes_compact_clock(sink.name()) {
                        ClockVersion::Compact
                    } else {
                        ClockVersion::V1
                    },
                    topic: sink.clone(),
                },
            );
        }
        let mut tick_route = None;
        if let Some(tick_topic) = app.tick_topic(stage) {
            let d = describe(tick_topic)?;
            counts.push((tick_topic.to_owned(), d.partitions));
            let channel = Channel::new(d.id, partition);
            slots.insert(d.id, SourceSlot::Ticks);
            names.insert(d.id, tick_topic.into());
            inputs.push(InputChannel {
                topic: tick_topic.to_owned(),
                channel,
                tick: true,
            });
            tick_route = Some((tick_topic.into(), channel));
        }
        let tasks = counts.first().map_or(0, |(_, n)| *n);
        if counts.iter().any(|(_, n)| *n != tasks) {
            return Err(TaskError::PartitionCounts {
                task: id.clone(),
                counts,
            });
        }
        if partition < 0 || partition >= tasks {
            return Err(config_err(format!(
                "partition {partition} is out of range: the stage's topics have {tasks} partition(s)"
            )));
        }
        Ok(Routes {
            inputs,
            slots,
            names,
            sinks,
            tick_route,
            partitions: tasks,
        })
    }
}
