//! An application's topology as it runs on Kafka: the core's description
//! ([`Parsley::describe`]) with the topics this runtime adds for the
//! application as a whole.

use parsley::Parsley;
use parsley::describe::{HostTopic, Topology};

/// The topology of `app` on Kafka: its stages' topics, and the control
/// and diagnostics topics the runtime creates for it.
///
/// ```
/// use parsley::{Codec, Message, Parsley, Stage, Topic};
/// let t: Topic<String, String> = Topic::new("in", Codec::utf8(), Codec::utf8());
/// let s = Stage::named("s").on(&t, |_m: &Message<String, String>| vec![]).build()?;
/// let app = Parsley::named("app", [s])?;
/// let topology = parsley_kafka::topology(&app);
/// assert_eq!(
///     topology.internal_topics(),
///     ["app-control", "app-diagnostics", "app-s-state-changelog"]
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn topology(app: &Parsley) -> Topology {
    let mut t = app.describe();
    let id = app.application_id();
    t.host_topics = vec![
        HostTopic {
            topic: crate::policy::control_topic(id),
            purpose: "application-wide shutdown requests (ErrorResponse::ShutdownApplication)"
                .to_owned(),
        },
        HostTopic {
            topic: crate::diagnostics::diagnostics_topic(id),
            purpose: "each stream thread's reports of what it holds (parsley holds)".to_owned(),
        },
    ];
    t
}
