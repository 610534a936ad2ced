//! How a command reaches the cluster: the bootstrap servers, and the
//! client properties a secured cluster needs (SASL, TLS), from a file
//! (`--command-config`, as Kafka's own tools take one) and from `-X
//! key=value` on the command line, which win over the file.
//!
//! The properties are librdkafka's (`security.protocol`,
//! `sasl.mechanisms`, `sasl.username`, `ssl.ca.location`...), since every
//! command talks to the cluster through librdkafka. Every client a command
//! makes starts from them; the few settings a command needs for its own
//! work (its group id, `read_committed`) are set after them.

use std::fmt;
use std::path::Path;

use rdkafka::ClientConfig;

/// The bootstrap servers and the client properties of one command.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// The bootstrap servers.
    pub bootstrap: String,
    /// Client properties, in the order they are applied (a later one wins).
    pub properties: Vec<(String, String)>,
}

impl fmt::Debug for Connection {
    /// Names the properties but shows no value: passwords and keys travel
    /// in them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("bootstrap", &self.bootstrap)
            .field(
                "properties",
                &self.properties.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Connection {
    /// The bootstrap servers alone: a cluster with no security settings.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Connection {
            bootstrap: bootstrap.into(),
            properties: Vec::new(),
        }
    }

    /// The connection a command line describes: `bootstrap`, then the
    /// properties of `command_config` (a file of `key=value` lines), then
    /// each of `overrides` (`key=value`).
    pub fn from_args(
        bootstrap: &str,
        command_config: Option<&Path>,
        overrides: &[String],
    ) -> Result<Self, String> {
        let mut properties = Vec::new();
        if let Some(path) = command_config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read --command-config {}: {e}", path.display()))?;
            properties = parse_properties(&text)
                .map_err(|e| format!("--command-config {}: {e}", path.display()))?;
        }
        for o in overrides {
            let (k, v) = o
                .split_once('=')
                .ok_or_else(|| format!("-X {o:?}: expected key=value"))?;
            let k = k.trim();
            if k.is_empty() {
                return Err(format!("-X {o:?}: the key is empty"));
            }
            properties.push((k.to_owned(), v.trim().to_owned()));
        }
        if properties.iter().any(|(k, _)| k == "bootstrap.servers") {
            return Err(
                "bootstrap.servers is given with --bootstrap, not as a client property".into(),
            );
        }
        Ok(Connection {
            bootstrap: bootstrap.to_owned(),
            properties,
        })
    }

    /// A client configuration with the bootstrap servers and every
    /// property: what each client of a command starts from.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
    }
}

/// Reads `key=value` (or `key: value`) lines; blank lines and lines that
/// begin with `#` or `!` are comments.
fn parse_properties(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let at = line
            .find(['=', ':'])
            .ok_or_else(|| format!("line {}: expected key=value", i + 1))?;
        let (k, v) = (line[..at].trim(), line[at + 1..].trim());
        if k.is_empty() {
            return Err(format!("line {}: the key is empty", i + 1));
        }
        out.push((k.to_owned(), v.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_then_the_overrides_in_order_and_no_value_in_debug() {
        let dir = std::env::temp_dir().join(format!("parsley-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("client.properties");
        std::fs::write(
            &file,
            "# a comment\n! another\n\nsecurity.protocol=SASL_SSL\nsasl.mechanisms : PLAIN\nsasl.password=s3cret=with=equals\n",
        )
        .unwrap();
        let c = Connection::from_args(
            "b:9092",
            Some(&file),
            &["security.protocol=SASL_PLAINTEXT".into()],
        )
        .unwrap();
        assert_eq!(
            c.properties,
            vec![
                ("security.protocol".into(), "SASL_SSL".into()),
                ("sasl.mechanisms".into(), "PLAIN".into()),
                ("sasl.password".into(), "s3cret=with=equals".into()),
                ("security.protocol".into(), "SASL_PLAINTEXT".into()),
            ]
        );
        let config = c.client_config();
        assert_eq!(config.get("security.protocol"), Some("SASL_PLAINTEXT"));
        assert_eq!(config.get("bootstrap.servers"), Some("b:9092"));
        let shown = format!("{c:?}");
        assert!(
            shown.contains("sasl.password") && !shown.contains("s3cret"),
            "{shown}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn malformed_settings_are_refused_with_where() {
        assert!(
            Connection::from_args("b", None, &["novalue".into()])
                .unwrap_err()
                .contains("key=value")
        );
        assert!(
            Connection::from_args("b", None, &["=v".into()])
                .unwrap_err()
                .contains("empty")
        );
        assert!(
            Connection::from_args("b", None, &["bootstrap.servers=x".into()])
                .unwrap_err()
                .contains("--bootstrap")
        );
        assert!(
            parse_properties("a=1\nbroken line\n")
                .unwrap_err()
                .contains("line 2")
        );
        let missing = Connection::from_args("b", Some(Path::new("/nonexistent/x")), &[]);
        assert!(missing.unwrap_err().contains("cannot read"));
    }
}
