//! What the benchmark reads of its loop processes from `/proc` (Linux;
//! every reading is `None` elsewhere).

use std::time::Duration;

/// Linux reports CPU times in clock ticks of 10 ms.
const TICK: Duration = Duration::from_millis(10);

/// User plus system CPU time of the process `pid`, all its threads.
pub(crate) fn process_cpu(pid: u32) -> Option<Duration> {
    ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// User plus system CPU time of the threads of `pid` whose name starts
/// with `prefix` (the loop's own threads: librdkafka's and the JVM's are
/// left out).
pub(crate) fn thread_cpu(pid: u32, prefix: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut found = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        if let Some(t) = std::fs::read_to_string(path.join("stat"))
            .ok()
            .and_then(|s| ticks(&s))
        {
            total += t;
            found = true;
        }
    }
    found.then_some(total)
}

/// The peak resident set size of `pid` (`VmHWM`), in bytes.
pub(crate) fn peak_rss(pid: u32) -> Option<u64> {
    crate::bench_util::status_bytes(&pid.to_string(), "VmHWM")
}

/// utime plus stime of one `stat` line: the 12th and 13th fields after
/// the parenthesised command name.
fn ticks(stat: &str) -> Option<Duration> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split(' ').collect();
    let t = fields.get(11)?.parse::<u32>().ok()? + fields.get(12)?.parse::<u32>().ok()?;
    Some(TICK * t)
}
