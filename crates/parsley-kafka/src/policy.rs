//! What a stream thread's failure does to the application: the uncaught
//! error handler and its three responses, and the control topic that
//! carries an application-wide shutdown to every instance.
//!
//! The transaction decides what a failure does to the data (nothing: it
//! aborts, and the committed state is what the last good step left). The
//! handler decides what it does to the application.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, error, info};

use crate::error::StreamsError;
pub use parsley::runtime::worker::RefusedRecord;

/// What to do after a stream thread fails.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ErrorResponse {
    /// Start the thread again: a new consumer and producer join the group,
    /// and the failed thread's tasks restart from their committed state. A
    /// deterministic failure recurs, so this suits transient ones.
    ReplaceThread,
    /// Stop every stream thread of this instance (each commits or aborts
    /// its open work and leaves the group); the state becomes `Failed`.
    /// The default.
    ShutdownClient,
    /// Stop every instance of the application: this one, and every other
    /// running one, through the application's control topic.
    ShutdownApplication,
}

/// The uncaught error handler: given a thread's failure, the response.
pub type ErrorHandler = Arc<dyn Fn(&StreamsError) -> ErrorResponse + Send + Sync>;

/// What to do with an emission the broker or the client refused (larger
/// than the sink's `max.message.bytes`, say). The transaction it was in
/// has aborted either way; nothing of it was committed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ProductionResponse {
    /// Fail the task that made it: the uncaught error handler decides what
    /// follows. The default.
    Fail,
    /// Send the emission to this dead-letter topic instead of its sink,
    /// and go on. It goes there unstamped, with its own headers and the
    /// `parsley.dlq.*` headers naming the delivery that made it, the sink
    /// (`parsley.dlq.sink`) and the reason; the delivery commits with it,
    /// once. A record that is not an emission (a changelog record, a tick)
    /// cannot go elsewhere and fails its task; so does an emission the
    /// dead-letter topic refuses in turn.
    DeadLetter(String),
}

/// The production error handler: given a refused record, the response.
pub type ProductionHandler = Arc<dyn Fn(&RefusedRecord) -> ProductionResponse + Send + Sync>;

/// The production handler's response to `refused`; a handler that panics
/// resolves to [`ProductionResponse::Fail`], logged.
pub(crate) fn decide_production(
    handler: Option<&ProductionHandler>,
    refused: &RefusedRecord,
) -> ProductionResponse {
    let Some(handler) = handler else {
        return ProductionResponse::Fail;
    };
    match catch_unwind(AssertUnwindSafe(|| handler(refused))) {
        Ok(response) => response,
        Err(_) => {
            error!(topic = %refused.topic, partition = refused.partition, "the production error handler panicked; the task fails");
            ProductionResponse::Fail
        }
    }
}

/// The handler's response to `error`. A handler that panics resolves to
/// [`ErrorResponse::ShutdownClient`], with both the failure and the
/// handler's panic logged, so a bug in the handler stops the instance
/// loudly instead of losing the thread in silence.
///
/// Without a handler: a task's [transient](StreamsError::is_transient)
/// failure (its codec could not reach a schema registry) restarts the task
/// in place after its backoff, as often as it recurs, since the record is
/// not at fault and stopping the instance would only move the wait
/// elsewhere; anything else shuts the client down.
pub(crate) fn decide(
    handler: Option<&ErrorHandler>,
    thread: usize,
    e: &StreamsError,
) -> ErrorResponse {
    let Some(handler) = handler else {
        return if e.is_transient() {
            ErrorResponse::ReplaceThread
        } else {
            ErrorResponse::ShutdownClient
        };
    };
    match catch_unwind(AssertUnwindSafe(|| handler(e))) {
        Ok(response) => response,
        Err(payload) => {
            let panic = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic".to_owned());
            error!(thread, error = %e, handler_panic = %panic, "the uncaught error handler panicked; shutting the client down");
            ErrorResponse::ShutdownClient
        }
    }
}

/// The control topic of an application: `<application id>-control`.
pub(crate) fn control_topic(application_id: &str) -> String {
    format!("{application_id}-control")
}

/// The key of a shutdown request on the control topic.
const SHUTDOWN: &str = "shutdown-application";

/// Writes a shutdown request for the whole application.
pub(crate) fn request_shutdown(
    config: &ClientConfig,
    topic: &str,
    reason: &str,
    timeout: Duration,
) -> Result<(), StreamsError> {
    let producer: BaseProducer<crate::ClientLogs> =
        crate::settings::for_producer(config).create_with_context(crate::ClientLogs)?;
    producer
        .send(
            BaseRecord::to(topic)
                .partition(0)
                .key(SHUTDOWN)
                .payload(reason),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(timeout)?;
    Ok(())
}

/// Watches the control topic from its end (requests made before this
/// instance started are not for it) until `stop` is set. On a shutdown
/// request it calls `on_shutdown` with the reason and returns.
pub(crate) fn watch(
    config: &ClientConfig,
    topic: &str,
    stop: Arc<AtomicBool>,
    on_shutdown: impl FnOnce(String),
) -> Result<(), StreamsError> {
    let mut c = crate::settings::for_consumer(config);
    c.set("enable.auto.commit", "false")
        .set("group.id", format!("{topic}-watch"));
    let consumer: BaseConsumer<crate::ClientLogs> = c.create_with_context(crate::ClientLogs)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::End)?;
    consumer.assign(&tpl)?;
    while !stop.load(Ordering::SeqCst) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) if m.key() == Some(SHUTDOWN.as_bytes()) => {
                let reason = m
                    .payload()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .unwrap_or_default();
                info!(%reason, "the application was asked to shut down");
                on_shutdown(reason);
                return Ok(());
            }
            Some(Ok(_)) | None => {}
            // The client's own error events say what went wrong (and a
            // broker it cannot reach is retried): a read that failed is
            // read again.
            Some(Err(e)) => debug!(error = %e, "control topic read failed; reading again"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_failure(transient: bool) -> StreamsError {
        StreamsError::Task {
            task: parsley::TaskId {
                stage: "s".into(),
                partition: 0,
            },
            error: "the registry did not answer".into(),
            earlier_in_a_row: 0,
            transient,
        }
    }

    #[test]
    fn without_a_handler_only_a_transient_task_failure_restarts() {
        assert!(task_failure(true).is_transient());
        assert_eq!(
            decide(None, 0, &task_failure(true)),
            ErrorResponse::ReplaceThread
        );
        assert_eq!(
            decide(None, 0, &task_failure(false)),
            ErrorResponse::ShutdownClient
        );
        let thread = StreamsError::Thread {
            thread: 0,
            message: "fatal".into(),
        };
        assert!(!thread.is_transient());
        assert_eq!(decide(None, 0, &thread), ErrorResponse::ShutdownClient);
        // A handler of the user's decides, transient or not.
        let stop: ErrorHandler = Arc::new(|_| ErrorResponse::ShutdownApplication);
        assert_eq!(
            decide(Some(&stop), 0, &task_failure(true)),
            ErrorResponse::ShutdownApplication
        );
    }
}
