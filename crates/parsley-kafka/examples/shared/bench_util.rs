//! Helpers the Kafka benchmarks (`throughput`, `holds`, `restart`) and the
//! memory broker test share: a send that waits for room in the producer's
//! queue, and readings of a process's memory from `/proc`.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord};

/// Sends `record`, serving the producer's delivery reports while its queue
/// is full.
pub fn send_when_room<K, V>(producer: &BaseProducer, mut record: BaseRecord<'_, K, V>)
where
    K: rdkafka::message::ToBytes + ?Sized,
    V: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, back)) => {
                producer.poll(Duration::from_millis(5));
                record = back;
            }
        }
    }
}

/// A memory field of `/proc/<process>/status` (`VmRSS`, `VmHWM`), in
/// bytes; `process` is a pid or `self`. `None` off Linux.
pub fn status_bytes(process: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).ok()?;
    let line = status.lines().find(|l| {
        l.strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// This process's resident set (`VmRSS`), in MiB; 0 off Linux.
pub fn resident_mib() -> f64 {
    status_bytes("self", "VmRSS").map_or(0.0, |b| b as f64 / f64::from(1 << 20))
}

/// The highest resident set seen while it runs: a thread that reads
/// `VmRSS` every 10 ms (the kernel's `VmHWM` never comes down, so it cannot
/// tell one phase of a run from the next).
pub struct PeakResident {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<f64>,
}

impl PeakResident {
    pub fn start() -> PeakResident {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak: f64 = 0.0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(resident_mib());
                std::thread::sleep(Duration::from_millis(10));
            }
            peak.max(resident_mib())
        });
        PeakResident { stop, thread }
    }

    /// Stops sampling; the peak in MiB (0 off Linux).
    pub fn stop(self) -> f64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or(0.0)
    }
}
