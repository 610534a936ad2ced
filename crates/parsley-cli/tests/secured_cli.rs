//! Every command that reaches a cluster, against a listener that demands
//! SASL/PLAIN: `PARSLEY_SASL_BOOTSTRAP` (the test broker's second listener,
//! `scripts/kafka/broker sasl`), with the user and password in
//! `PARSLEY_SASL_USERNAME` and `PARSLEY_SASL_PASSWORD` (the test broker's
//! by default). Each command is given the credentials by
//! `--command-config`, or by `-X`, and must answer as it does on an open
//! listener; without them it must fail, not answer.

mod common;

use std::time::{Duration, Instant};

use common::{config, create, parsley, unique};
use parsley_kafka::KafkaCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn sasl() -> String {
    std::env::var("PARSLEY_SASL_BOOTSTRAP").expect(
        "set PARSLEY_SASL_BOOTSTRAP to a SASL/PLAIN listener (scripts/kafka/broker sasl prints the test broker's)",
    )
}

fn credentials() -> [(String, String); 4] {
    let var = |n: &str, d: &str| std::env::var(n).unwrap_or_else(|_| d.to_owned());
    [
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanisms".into(), "PLAIN".into()),
        (
            "sasl.username".into(),
            var("PARSLEY_SASL_USERNAME", "parsley"),
        ),
        (
            "sasl.password".into(),
            var("PARSLEY_SASL_PASSWORD", "parsley-secret"),
        ),
    ]
}

/// The credentials as a properties file, with a comment and spacing as
/// such files have.
fn command_config() -> std::path::PathBuf {
    let file = std::env::temp_dir().join(format!("{}.properties", unique("client")));
    let mut text = String::from("# the test broker's SASL listener\n\n");
    for (k, v) in credentials() {
        text.push_str(&format!("{k} = {v}\n"));
    }
    std::fs::write(&file, text).unwrap();
    file
}

/// `args` with the credentials as `-X` settings.
fn with_x(args: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    for (k, v) in credentials() {
        out.push("-X".into());
        out.push(format!("{k}={v}"));
    }
    out
}

fn run(args: &[String]) -> (bool, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    parsley(&args)
}

#[test]
#[ignore = "needs a broker with a SASL/PLAIN listener: set PARSLEY_BOOTSTRAP and PARSLEY_SASL_BOOTSTRAP"]
fn every_command_reaches_a_secured_cluster_with_its_client_properties() {
    let cluster = KafkaCluster::new(&config(), Duration::from_secs(20)).unwrap();
    let (orders, out, app) = (unique("orders"), unique("out"), unique("app"));
    create(&cluster, &[(&orders, 1), (&out, 1)]);
    let producer: BaseProducer = config().create().unwrap();
    producer
        .send(BaseRecord::to(&orders).key("k").payload("v"))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(20)).unwrap();
    let app_file = std::env::temp_dir().join(format!("{app}.json"));
    std::fs::write(
        &app_file,
        format!(
            r#"{{"application_id": "{app}", "stages": [
                {{"name": "copy", "sources": ["{orders}"], "sinks": ["{out}"]}}]}}"#
        ),
    )
    .unwrap();
    let (file, sasl) = (command_config(), sasl());
    let (file, app_path) = (
        file.to_string_lossy().into_owned(),
        app_file.to_string_lossy().into_owned(),
    );

    // Each command, and what it answers when it reached the cluster.
    let record = format!("{orders}:0@0");
    let commands: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["inspect", "--bootstrap", &sasl, "--topic", &orders],
            &record,
        ),
        (
            vec!["probe", "--bootstrap", &sasl, "--app", &app_path],
            "0 finding(s)",
        ),
        (
            vec!["reset", "--bootstrap", &sasl, "--app", &app_path],
            "Nothing was changed",
        ),
        (
            vec!["holds", "--bootstrap", &sasl, "--app", &app],
            "has no diagnostics topic",
        ),
        (
            vec![
                "skip",
                "--bootstrap",
                &sasl,
                "--app",
                &app,
                "--stage",
                "copy",
                "--topic",
                &orders,
                "--partition",
                "0",
                "--offset",
                "0",
                "--dead-letter",
                &out,
            ],
            "has no state changelog",
        ),
    ];
    for (args, answer) in &commands {
        let mut by_file: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        by_file.extend(["--command-config".to_owned(), file.clone()]);
        for (how, args) in [("--command-config", by_file), ("-X", with_x(args))] {
            let (_, text) = run(&args);
            assert!(
                text.contains(answer) && !text.contains("cannot reach"),
                "{} with {how}: {text}",
                args[0]
            );
        }
    }
    // Without the credentials the listener answers nothing: the command
    // fails (within its request timeout), it does not make up an answer.
    let started = Instant::now();
    let (ok, text) = parsley(&["inspect", "--bootstrap", &sasl, "--topic", &orders]);
    assert!(!ok && !text.contains(&record), "{text}");
    assert!(started.elapsed() < Duration::from_secs(90));
    // A wrong password is refused too.
    let mut wrong = with_x(&["probe", "--bootstrap", &sasl, "--app", &app_path]);
    wrong.extend(["-X".to_owned(), "sasl.password=wrong".to_owned()]);
    let (ok, text) = run(&wrong);
    assert!(!ok && !text.contains("0 finding(s)"), "{text}");

    // The demo on the cluster, through the runtime, with the credentials.
    let (ok, text) = run(&with_x(&["demo", "--bootstrap", &sasl, "--records", "40"]));
    assert!(ok && text.contains(" 0 causal violations"), "{text}");
}
