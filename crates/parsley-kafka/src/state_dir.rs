//! The state directory: each task's local store, one embedded `redb`
//! database file per task, under `<state dir>/<application id>/<instance
//! id>/`.
//!
//! That directory is locked by one instance at a time (a `.lock` file held
//! with an exclusive OS file lock for the instance's life); a second
//! instance on it is refused at start with an error naming it. Instances
//! of one application on one machine therefore need distinct instance ids,
//! which they need anyway: the instance id names the transactional ids,
//! and two instances with one id fence each other. A restarted instance
//! (same id) finds its stores again. The worker decides what is written and when (see
//! `parsley::runtime::local`); this module only keeps the bytes:
//!
//! * `meta`: the store's identity (application, stage, partition, and the
//!   topic id of each changelog) and its checkpoint (the next changelog
//!   offset it does not reflect, per changelog topic);
//! * `protocol` and `fold`: the two stores' entries.
//!
//! Each write is one redb transaction: entries and checkpoint land together
//! or not at all. Writes after commits skip the disk flush, and one in
//! [`DURABLE_EVERY`] (and every rebuild, and a task's close) is flushed: a
//! crash loses at most the unflushed ones, and redb then opens at the last
//! flushed write, whose checkpoint is older; the restart replays more of the
//! changelog, never less.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parsley::protocol::TopicId;
use parsley::protocol::store::StateKey;
use parsley::runtime::local::{
    LeaveOnDisk, LocalReader, LocalSnapshot, LocalStore, LocalStoreError, LocalWrite, LocalWriter,
    StoreIdentity, StoreKind, is_held_entry,
};
use parsley::task::TaskId;

mod files;
mod reader;

use reader::FileReader;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const PROTOCOL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("protocol");
const FOLD: TableDefinition<&[u8], &[u8]> = TableDefinition::new("fold");

/// How often a task's writes after commits are flushed to disk, at most.
pub const DURABLE_EVERY: Duration = Duration::from_secs(5);

/// A state directory that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// Another instance holds the directory.
    #[error(
        "the state directory {path} is in use by another instance of the application with the same instance id (its lock is held); give each instance its own instance id (StreamsOptions::instance_id) or state directory (StreamsOptions::state_dir)"
    )]
    Locked {
        /// The application's directory.
        path: PathBuf,
    },
    /// The directory could not be created or locked.
    #[error("the state directory {path} cannot be used: {message}")]
    Io {
        /// The application's directory.
        path: PathBuf,
        /// What the file system said.
        message: String,
    },
}

/// An application's state directory, locked for this instance.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    /// The most memory one task file's engine may cache, in bytes.
    cache: usize,
    /// Held for the instance's life: the lock is released when it closes.
    _lock: File,
}

/// What one task file's engine caches by default, in bytes (see
/// [`StateDir::with_cache`]).
pub const DEFAULT_FILE_CACHE: usize = 8 << 20;

impl StateDir {
    /// Creates (if needed) and locks `<root>/<application>/<instance>`,
    /// each task file caching at most [`DEFAULT_FILE_CACHE`] bytes.
    pub fn lock(
        root: &Path,
        application: &str,
        instance: &str,
    ) -> Result<Arc<StateDir>, StateDirError> {
        Self::with_cache(root, application, instance, DEFAULT_FILE_CACHE)
    }

    /// [`lock`](Self::lock), each task file's engine caching at most
    /// `cache` bytes of its pages (read pages and the pages of commits not
    /// yet flushed together). redb's own default is 1 GiB per file, which,
    /// with one file per task, lets an instance's resident set grow with
    /// everything it ever wrote.
    pub fn with_cache(
        root: &Path,
        application: &str,
        instance: &str,
        cache: usize,
    ) -> Result<Arc<StateDir>, StateDirError> {
        let path = application_dir(root, application).join(sanitize(instance));
        let io = |e: std::io::Error| StateDirError::Io {
            path: path.clone(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(&path).map_err(io)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join(".lock"))
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StateDirError::Locked { path });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        Ok(Arc::new(StateDir {
            path,
            cache,
            _lock: lock,
        }))
    }

    /// The application's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file of a task's store.
    pub fn task_file(&self, task: &TaskId) -> PathBuf {
        self.path
            .join(format!("{}-{}.redb", sanitize(&task.stage), task.partition))
    }

    /// A handle for one stream thread's worker: the files are read and
    /// written on a writer thread of its own (see [`TaskFiles`]).
    pub fn stores(self: &Arc<Self>) -> TaskFiles {
        TaskFiles::new(Files {
            dir: self.clone(),
            open: BTreeMap::new(),
            #[cfg(test)]
            fail_writes: Arc::default(),
        })
    }
}

/// The directory under `root` that holds `application`'s local state, one
/// sub-directory per instance (what `parsley reset --wipe-state-dir`
/// removes).
pub fn application_dir(root: &Path, application: &str) -> PathBuf {
    root.join(sanitize(application))
}

/// Keeps a file name to characters every file system takes.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

struct Open {
    db: Arc<Database>,
    last_durable: Instant,
    /// The reader handed out last, told of each write once it is in.
    applied: Option<Arc<AtomicU64>>,
}

/// The task files one writer thread has open.
struct Files {
    dir: Arc<StateDir>,
    open: BTreeMap<TaskId, Open>,
    /// Fails every write from now on (tests of what a failed write leaves).
    #[cfg(test)]
    fail_writes: Arc<std::sync::atomic::AtomicBool>,
}

/// A task whose write failed: the file was deleted, and no later write of
/// the task lands until the task's store is opened (or wiped) again, in
/// the writer's order. Writes queued behind the failed one would otherwise
/// re-create the file from a later commit's entries alone, which a start
/// would then trust. `reported` once the stream thread has heard of it.
#[derive(Clone, Debug)]
struct Mark {
    error: LocalStoreError,
    reported: bool,
}

type Marks = Arc<Mutex<BTreeMap<TaskId, Mark>>>;

/// What the writer thread is asked to do, in order.
enum Job {
    /// Read the store, leaving out what the flags name.
    Open(
        TaskId,
        LeaveOnDisk,
        SyncSender<Result<Option<LocalSnapshot>, LocalStoreError>>,
    ),
    Reader(
        TaskId,
        SyncSender<Result<Option<Arc<dyn LocalReader>>, LocalStoreError>>,
    ),
    /// The task starts over with no file: a failed write's mark goes, in
    /// order after every write queued before.
    Forget(TaskId),
    /// A write; with a reply, the writer answers once it is done (or
    /// failed).
    Write(
        TaskId,
        LocalWrite,
        Option<SyncSender<Result<(), LocalStoreError>>>,
    ),
    /// A restore's write, dropped if its restore was cancelled by the time
    /// the writer comes to it (the flag is set before the task's close is
    /// queued, so a write the writer takes after the close is dropped);
    /// the answer says whether it was applied.
    WriteUnless(
        TaskId,
        LocalWrite,
        Arc<std::sync::atomic::AtomicBool>,
        SyncSender<Result<bool, LocalStoreError>>,
    ),
    Wipe(TaskId, SyncSender<Result<(), LocalStoreError>>),
    Close(TaskId, SyncSender<Result<(), LocalStoreError>>),
}

/// How many jobs may wait for the writer before the worker waits too.
const QUEUE: usize = 64;

/// One stream thread's task stores in the state directory: the
/// [`LocalStore`] its worker writes through. Each task is owned by one
/// thread at a time, so threads never share a file.
///
/// Writes go to a writer thread and the call returns at once, so a commit's
/// store write (or a rebuild's, 1.6 s for a million keys) never holds up
/// the stream thread; reads, wipes and closes wait for every write queued
/// before them. A queued write that a crash loses is one the store never
/// got, which leaves its checkpoint behind, never ahead. A write that
/// fails deletes the task's file, the writer skips that task's later
/// writes, and the next call for the task returns the error (the worker
/// then runs the task without its file until it starts again).
pub struct TaskFiles {
    dir: Arc<StateDir>,
    jobs: Option<SyncSender<Job>>,
    /// The queue as restore threads' writers reach it: emptied when the
    /// files close, so a restore still running cannot keep the writer
    /// thread (and the close) waiting past its current write.
    shared_jobs: Arc<Mutex<Option<SyncSender<Job>>>>,
    failed: Marks,
    writer: Option<std::thread::JoinHandle<()>>,
    #[cfg(test)]
    fail_writes: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for TaskFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskFiles").finish_non_exhaustive()
    }
}

fn gone(task: &TaskId) -> LocalStoreError {
    io(task, "the state directory's writer thread is gone")
}

impl TaskFiles {
    fn new(mut files: Files) -> TaskFiles {
        let dir = files.dir.clone();
        #[cfg(test)]
        let fail_writes = files.fail_writes.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
        let failed: Marks = Arc::default();
        let marks = failed.clone();
        let writer = std::thread::Builder::new()
            .name("parsley-state".to_owned())
            .spawn(move || {
                let forget = |task: &TaskId| {
                    marks.lock().unwrap_or_else(|p| p.into_inner()).remove(task);
                };
                // A write, unless an earlier one of the task failed; a write
                // that fails deletes the task's file and marks the task.
                let apply = |files: &mut Files, task: TaskId, write: LocalWrite| {
                    let earlier = marks
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&task)
                        .map(|m| m.error.clone());
                    match earlier {
                        Some(e) => Err(e),
                        None => files.write(&task, write).inspect_err(|e| {
                            let _ = files.wipe(&task);
                            marks.lock().unwrap_or_else(|p| p.into_inner()).insert(
                                task,
                                Mark {
                                    error: e.clone(),
                                    reported: false,
                                },
                            );
                        }),
                    }
                };
                for job in rx {
                    match job {
                        Job::Open(task, leave, reply) => {
                            forget(&task);
                            let _ = reply.send(files.read(&task, leave));
                        }
                        Job::Forget(task) => forget(&task),
                        Job::Reader(task, reply) => {
                            let _ = reply.send(files.reader(&task));
                        }
                        Job::Write(task, write, reply) => {
                            let result = apply(&mut files, task, write);
                            if let Some(reply) = reply {
                                let _ = reply.send(result);
                            }
                        }
                        Job::WriteUnless(task, write, cancelled, reply) => {
                            if cancelled.load(std::sync::atomic::Ordering::Acquire) {
                                let _ = reply.send(Ok(false));
                                continue;
                            }
                            let result = apply(&mut files, task, write);
                            let _ = reply.send(result.map(|()| true));
                        }
                        Job::Wipe(task, reply) => {
                            forget(&task);
                            let _ = reply.send(files.wipe(&task));
                        }
                        Job::Close(task, reply) => {
                            let _ = reply.send(files.close(&task));
                        }
                    }
                }
                files.close_all();
            })
            .ok();
        let jobs = writer.is_some().then_some(tx);
        TaskFiles {
            dir,
            shared_jobs: Arc::new(Mutex::new(jobs.clone())),
            jobs,
            failed,
            writer,
            #[cfg(test)]
            fail_writes,
        }
    }

    fn ask<T>(
        &self,
        task: &TaskId,
        job: impl FnOnce(SyncSender<Result<T, LocalStoreError>>) -> Job,
    ) -> Result<T, LocalStoreError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let jobs = self.jobs.as_ref().ok_or_else(|| gone(task))?;
        jobs.send(job(reply)).map_err(|_| gone(task))?;
        answer.recv().map_err(|_| gone(task))?
    }

    /// A failed write of `task` not reported yet, reported now. The mark
    /// stays (and keeps refusing the task's writes) until the writer
    /// thread takes the task's next open or wipe.
    fn take_failure(&self, task: &TaskId) -> Option<LocalStoreError> {
        let mut marks = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        let mark = marks.get_mut(task)?;
        (!mark.reported).then(|| {
            mark.reported = true;
            mark.error.clone()
        })
    }

    /// Clears `task`'s mark in the writer's order (no reply awaited).
    fn forget(&self, task: &TaskId) {
        if let Some(jobs) = self.jobs.as_ref() {
            let _ = jobs.send(Job::Forget(task.clone()));
        }
    }
}

impl LocalStore for TaskFiles {
    fn open(&mut self, task: &TaskId) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        self.open_leaving(task, LeaveOnDisk::default())
    }

    fn open_leaving(
        &mut self,
        task: &TaskId,
        leave: LeaveOnDisk,
    ) -> Result<Option<LocalSnapshot>, LocalStoreError> {
        // No file (a failed write deleted it, say): nothing to wait for. A
        // failed write's mark is cleared behind the writes queued before,
        // which it refuses. (A write of an earlier run of the task still
        // queued, with no failure behind it, would create a file; reading
        // none then only costs a full replay, which rewrites the file after
        // that write.)
        if !self.dir.task_file(task).exists() {
            self.forget(task);
            return Ok(None);
        }
        self.ask(task, |r| Job::Open(task.clone(), leave, r))
    }

    fn reader(&mut self, task: &TaskId) -> Result<Option<Arc<dyn LocalReader>>, LocalStoreError> {
        // Queued behind every write so far: the reader sees them all.
        let r = self.ask(task, |r| Job::Reader(task.clone(), r));
        match self.take_failure(task) {
            Some(e) => Err(e),
            None => r,
        }
    }

    fn reads_while_running(&self) -> bool {
        true
    }

    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        if let Some(e) = self.take_failure(task) {
            return Err(e);
        }
        let jobs = self.jobs.as_ref().ok_or_else(|| gone(task))?;
        jobs.send(Job::Write(task.clone(), write, None))
            .map_err(|_| gone(task))
    }

    fn writer(&mut self) -> Option<Box<dyn LocalWriter>> {
        Some(Box::new(FilesWriter {
            jobs: self.shared_jobs.clone(),
        }))
    }

    fn wipe(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        self.ask(task, |r| Job::Wipe(task.clone(), r))
    }

    fn close(&mut self, task: &TaskId) -> Result<(), LocalStoreError> {
        let r = self.ask(task, |r| Job::Close(task.clone(), r));
        match self.take_failure(task) {
            Some(e) => Err(e),
            None => r,
        }
    }
}

/// Writes from a restore thread, through the writer thread's queue (so
/// they land in order with the stream thread's), each waited for: a
/// replay faster than the disk would otherwise fill the queue with parts
/// and hold in memory what it was meant to write out. A failed write is
/// also left for the stream thread's next call for the task, as
/// [`TaskFiles`] reports every failure.
struct FilesWriter {
    jobs: Arc<Mutex<Option<SyncSender<Job>>>>,
}

impl FilesWriter {
    /// The writer thread's queue, while the files are open.
    fn queue(&self, task: &TaskId) -> Result<SyncSender<Job>, LocalStoreError> {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| gone(task))
    }
}

impl LocalWriter for FilesWriter {
    fn write(&mut self, task: &TaskId, write: LocalWrite) -> Result<(), LocalStoreError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let jobs = self.queue(task)?;
        jobs.send(Job::Write(task.clone(), write, Some(reply)))
            .map_err(|_| gone(task))?;
        drop(jobs);
        answer.recv().map_err(|_| gone(task))?
    }

    fn write_unless_cancelled(
        &mut self,
        task: &TaskId,
        write: LocalWrite,
        cancelled: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<bool, LocalStoreError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let jobs = self.queue(task)?;
        jobs.send(Job::WriteUnless(
            task.clone(),
            write,
            cancelled.clone(),
            reply,
        ))
        .map_err(|_| gone(task))?;
        drop(jobs);
        answer.recv().map_err(|_| gone(task))?
    }
}

impl Drop for TaskFiles {
    fn drop(&mut self) {
        // The writer finishes what is queued, closes every file, and ends
        // (a restore's writer that still runs gets an error from now on).
        drop(
            self.shared_jobs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        drop(self.jobs.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn corrupt(task: &TaskId, e: impl std::fmt::Display) -> LocalStoreError {
    LocalStoreError::Corrupt {
        task: task.clone(),
        reason: e.to_string(),
    }
}

fn io(task: &TaskId, e: impl std::fmt::Display) -> LocalStoreError {
    LocalStoreError::Io {
        task: task.clone(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::files::held_delete_run;
    use super::*;
    use parsley::runtime::local::RecordBytes;

    fn identity() -> StoreIdentity {
        StoreIdentity {
            application: "app".into(),
            task: TaskId {
                stage: "s".into(),
                partition: 2,
            },
            changelogs: BTreeMap::from([(
                "app-s-fold-changelog".to_owned(),
                TopicId::from_bytes([7; 16]),
            )]),
        }
    }

    fn task() -> TaskId {
        identity().task
    }

    fn temp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "parsley-state-dir-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn a_write_reads_back_after_the_process_lets_go() {
        let root = temp("roundtrip");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        let mut files = dir.stores();
        assert_eq!(files.open(&task()).unwrap(), None);
        files
            .write(
                &task(),
                LocalWrite {
                    identity: Some(identity()),
                    checkpoint: BTreeMap::from([("app-s-fold-changelog".to_owned(), 12)]),
                    replace: true,
                    written_at: 5,
                    seq: 0,
                    entries: vec![
                        (StoreKind::Fold, b"k1".into(), Some(b"v1".into())),
                        (StoreKind::Fold, b"k2".into(), Some(b"v2".into())),
                        (StoreKind::Protocol, b"scope".into(), Some(b"s".into())),
                    ],
                },
            )
            .unwrap();
        files
            .write(
                &task(),
                LocalWrite {
                    identity: Some(identity()),
                    checkpoint: BTreeMap::from([("app-s-fold-changelog".to_owned(), 15)]),
                    replace: false,
                    written_at: 9,
                    seq: 0,
                    entries: vec![(StoreKind::Fold, b"k1".into(), None)],
                },
            )
            .unwrap();
        drop(files);
        let mut again = dir.stores();
        let s = again.open(&task()).unwrap().unwrap();
        assert_eq!(s.identity, Some(identity()));
        assert_eq!(s.checkpoint["app-s-fold-changelog"], 15);
        assert_eq!(s.written_at, Some(9));
        assert_eq!(s.fold, vec![(b"k2".to_vec(), b"v2".to_vec())]);
        assert_eq!(s.protocol, vec![(b"scope".to_vec(), b"s".to_vec())]);
        again.wipe(&task()).unwrap();
        assert_eq!(again.open(&task()).unwrap(), None);
        drop(again);
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A restore's part is judged where it is applied: one handed over
    /// while its restore ran, but applied after the worker cancelled the
    /// restore and closed the task's store, is dropped there, and the store
    /// holds nothing of it. The writer thread is held on a job of its own
    /// while the part waits behind it and the flag is set, which is the
    /// interleaving a check before the hand-over misses.
    #[test]
    fn a_restore_part_applied_after_its_cancellation_is_dropped_by_the_writer() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let root = temp("cancelled");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        let mut files = dir.stores();
        let part = |k: &[u8]| LocalWrite {
            identity: None,
            checkpoint: BTreeMap::new(),
            replace: false,
            written_at: 1,
            entries: vec![(StoreKind::Fold, k.into(), Some(b"v".into()))],
            seq: 0,
        };
        let mut writer = files.writer().expect("the files give writers");
        let cancelled = Arc::new(AtomicBool::new(false));
        assert!(
            writer
                .write_unless_cancelled(&task(), part(b"before"), &cancelled)
                .unwrap()
        );
        // Hold the writer thread: its answer to this job waits until it is
        // taken.
        let (held, release) = std::sync::mpsc::sync_channel(0);
        files
            .jobs
            .as_ref()
            .unwrap()
            .send(Job::Reader(task(), held))
            .unwrap();
        // The part is handed over while the restore still runs...
        let flag = cancelled.clone();
        let late = std::thread::spawn(move || {
            writer
                .write_unless_cancelled(&task(), part(b"after"), &flag)
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(200));
        // ... and the worker cancels the restore meanwhile.
        cancelled.store(true, Ordering::Release);
        let _ = release.recv().unwrap();
        assert!(
            !late.join().unwrap(),
            "the part was applied after the cancellation"
        );
        files.close(&task()).unwrap();
        let keys: Vec<Vec<u8>> = files
            .open(&task())
            .unwrap()
            .unwrap()
            .fold
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, [b"before".to_vec()]);
        drop(files);
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_reader_sees_what_the_writer_thread_applied() {
        let root = temp("reader");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        let mut files = dir.stores();
        assert!(files.reads_while_running());
        let write = |replace: bool, seq: u64, entries: Vec<parsley::runtime::local::LocalEntry>| {
            LocalWrite {
                identity: Some(identity()),
                checkpoint: BTreeMap::new(),
                replace,
                written_at: 1,
                entries,
                seq,
            }
        };
        let fold =
            |k: &[u8], v: Option<&[u8]>| (StoreKind::Fold, k.into(), v.map(RecordBytes::from));
        files
            .write(
                &task(),
                write(
                    true,
                    0,
                    vec![fold(b"a", Some(b"1")), fold(b"b", Some(b"2"))],
                ),
            )
            .unwrap();
        let reader = files
            .reader(&task())
            .unwrap()
            .expect("files read while running");
        assert_eq!(reader.applied(), 0);
        assert_eq!(reader.fold_get(b"a").unwrap(), Some(b"1".to_vec()));
        files
            .write(
                &task(),
                write(false, 1, vec![fold(b"a", None), fold(b"c", Some(b"3"))]),
            )
            .unwrap();
        // Any later job on the writer thread runs after the write.
        let leave = LeaveOnDisk {
            fold: true,
            held: false,
        };
        let snapshot = files.open_leaving(&task(), leave).unwrap().unwrap();
        assert!(snapshot.fold.is_empty(), "left out on request");
        assert_eq!(reader.applied(), 1);
        assert_eq!(reader.fold_get(b"a").unwrap(), None);
        assert_eq!(
            reader.fold_scan().unwrap(),
            vec![
                (b"b".to_vec(), b"2".to_vec()),
                (b"c".to_vec(), b"3".to_vec())
            ]
        );
        assert_eq!(files.open(&task()).unwrap().unwrap().fold.len(), 2);
        // The key walk a fold store's filter is filled by: in steps, each
        // from the key after the last, in key order, none read twice.
        assert_eq!(reader.fold_len_hint(), Some(2));
        let step = |after: Option<&[u8]>| {
            let mut seen = Vec::new();
            let last = reader
                .fold_keys_after(after, 1, &mut |k| seen.push(k.to_vec()))
                .unwrap();
            (seen, last)
        };
        assert_eq!(step(None), (vec![b"b".to_vec()], Some(b"b".to_vec())));
        assert_eq!(step(Some(b"b")), (vec![b"c".to_vec()], Some(b"c".to_vec())));
        assert_eq!(step(Some(b"c")), (vec![], None));
        drop(reader);
        drop(files);
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Held records stay in the file at a start that leaves them there,
    /// and a reader hands back one queue's range of them in index order.
    #[test]
    fn held_records_are_left_in_the_file_and_read_by_range() {
        use parsley::protocol::store::StateKey;
        use parsley::protocol::{Channel, TopicId};
        let root = temp("held");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        let mut files = dir.stores();
        let (c, other) = (
            Channel::new(TopicId::from_u128(7), 3),
            Channel::new(TopicId::from_u128(7), 30),
        );
        let key = |k: StateKey| RecordBytes::from(k.to_key().into_bytes());
        let mut entries = vec![(
            StoreKind::Protocol,
            key(StateKey::QueueMeta(c)),
            Some(b"meta".into()),
        )];
        for (ch, index) in [(c, 1), (c, 2), (c, 17), (other, 2)] {
            entries.push((
                StoreKind::Protocol,
                key(StateKey::QueueEntry(ch, index)),
                Some(format!("{ch}#{index}").into_bytes().into()),
            ));
        }
        files
            .write(
                &task(),
                LocalWrite {
                    identity: Some(identity()),
                    checkpoint: BTreeMap::new(),
                    replace: true,
                    written_at: 1,
                    entries,
                    seq: 0,
                },
            )
            .unwrap();
        // Queued behind the write: the file exists once it is back.
        let reader = files.reader(&task()).unwrap().unwrap();
        let leave = LeaveOnDisk {
            fold: false,
            held: true,
        };
        let snapshot = files.open_leaving(&task(), leave).unwrap().unwrap();
        assert_eq!(
            snapshot.protocol,
            vec![(key(StateKey::QueueMeta(c)).into_vec(), b"meta".to_vec())],
            "only the queue's metadata is loaded"
        );
        assert_eq!(files.open(&task()).unwrap().unwrap().protocol.len(), 5);
        let mut got = Vec::new();
        reader
            .protocol_range(
                &key(StateKey::QueueEntry(c, 2)),
                &key(StateKey::QueueEntry(c, 18)),
                &mut |_, v| got.push(String::from_utf8(v.to_vec()).unwrap()),
            )
            .unwrap();
        assert_eq!(got, vec![format!("{c}#2"), format!("{c}#17")]);

        // A release's deletes of consecutive held records go as one range
        // and remove exactly those records: not the queue's others, not
        // another queue's (channel 30's keys sort right after 3's as text).
        let mut puts = Vec::new();
        for index in 100..160 {
            for ch in [c, other] {
                puts.push((
                    StoreKind::Protocol,
                    key(StateKey::QueueEntry(ch, index)),
                    Some(vec![1].into()),
                ));
            }
        }
        let write = |entries, seq| LocalWrite {
            identity: Some(identity()),
            checkpoint: BTreeMap::new(),
            replace: false,
            written_at: 1,
            entries,
            seq,
        };
        files.write(&task(), write(puts, 1)).unwrap();
        let deletes: Vec<_> = (110..150)
            .map(|index| {
                (
                    StoreKind::Protocol,
                    key(StateKey::QueueEntry(c, index)),
                    None,
                )
            })
            .collect();
        assert!(held_delete_run(&deletes).is_some(), "a range");
        files.write(&task(), write(deletes, 2)).unwrap();
        let left = files.open(&task()).unwrap().unwrap().protocol;
        let held_of = |ch: Channel| {
            left.iter()
                .filter_map(
                    |(k, _)| match std::str::from_utf8(k).unwrap().parse().unwrap() {
                        StateKey::QueueEntry(x, i) if x == ch && i >= 100 => Some(i),
                        _ => None,
                    },
                )
                .collect::<Vec<i64>>()
        };
        let mut want: Vec<i64> = (100..110).collect();
        want.extend(150..160);
        assert_eq!(held_of(c), want);
        assert_eq!(held_of(other), (100..160).collect::<Vec<_>>());
        // A run with a gap, or of another store's keys, is no range.
        let gap = vec![
            (StoreKind::Protocol, key(StateKey::QueueEntry(c, 1)), None),
            (StoreKind::Protocol, key(StateKey::QueueEntry(c, 3)), None),
        ];
        assert!(held_delete_run(&gap).is_none());
        drop(reader);
        drop(files);
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_restore_writer_lands_in_order_and_never_holds_the_close() {
        let root = temp("writer");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        let mut files = dir.stores();
        let mut writer = files.writer().expect("the files give writers");
        let part = |replace: bool, key: &[u8]| LocalWrite {
            identity: None,
            checkpoint: BTreeMap::new(),
            replace,
            written_at: 1,
            entries: vec![(StoreKind::Fold, key.into(), Some(b"v".into()))],
            seq: 0,
        };
        writer.write(&task(), part(true, b"a")).unwrap();
        writer.write(&task(), part(false, b"b")).unwrap();
        // A part carries no identity: no start trusts the file yet.
        let snapshot = files.open(&task()).unwrap().unwrap();
        assert_eq!(snapshot.identity, None);
        assert_eq!(snapshot.fold.len(), 2);
        // Closing the files does not wait for the writer to be dropped,
        // and the writer fails from then on.
        let (closed, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(files);
            let _ = closed.send(());
        });
        assert!(
            done.recv_timeout(std::time::Duration::from_secs(10))
                .is_ok(),
            "closing the files waited for a restore's writer"
        );
        let err = writer.write(&task(), part(false, b"c")).unwrap_err();
        assert!(err.to_string().contains("writer thread is gone"), "{err}");
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_task_file_caches_no_more_than_its_bound() {
        let root = temp("cache");
        let cache = 1 << 20;
        let dir = StateDir::with_cache(&root, "app", "i1", cache).unwrap();
        let mut files = Files {
            dir: dir.clone(),
            open: BTreeMap::new(),
            fail_writes: Arc::default(),
        };
        let write = |replace: bool, round: u32| LocalWrite {
            identity: Some(identity()),
            checkpoint: BTreeMap::from([("app-s-fold-changelog".to_owned(), i64::from(round))]),
            replace,
            written_at: 5,
            seq: 0,
            entries: (0..2_000u32)
                .map(|i| {
                    let key = format!("{round:04}-{i:06}").into_bytes();
                    (StoreKind::Fold, key.into(), Some(vec![b'v'; 1_000].into()))
                })
                .collect(),
        };
        // A rebuild (flushed), then 40 MB in commits written without a
        // flush, whose pages the engine keeps until the next flushed one.
        files.write(&task(), write(true, 0)).unwrap();
        for round in 1..=20 {
            files.write(&task(), write(false, round)).unwrap();
        }
        let used = files.open[&task()].db.cache_stats().used_bytes();
        assert!(
            used <= cache + (256 << 10),
            "the file caches {used} bytes against a bound of {cache}"
        );
        files.close_all();
        // Everything written reads back.
        let snapshot = files.open(&task()).unwrap().unwrap();
        assert_eq!(snapshot.fold.len(), 21 * 2_000);
        files.close_all();
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Once a write failed (and deleted the file), no later write of the
    /// task lands until the task's store is opened again in the writer's
    /// order, even after the stream thread heard of the failure: a write
    /// queued behind the failed one would otherwise re-create the file from
    /// a later commit's entries alone, with a checkpoint a start would
    /// trust (finding 6 of the broker-failure review).
    #[test]
    fn a_failed_write_keeps_later_writes_out_until_the_task_opens_again() {
        let root = temp("failed-write");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        let mut files = dir.stores();
        let write = |checkpoint: i64, key: &[u8]| LocalWrite {
            identity: Some(identity()),
            checkpoint: BTreeMap::from([("app-s-fold-changelog".to_owned(), checkpoint)]),
            replace: false,
            written_at: 1,
            seq: 0,
            entries: vec![(StoreKind::Fold, key.into(), Some(b"v".into()))],
        };
        files.write(&task(), write(10, b"k1")).unwrap();
        files.fail_writes.store(true, Ordering::SeqCst);
        files.write(&task(), write(20, b"k2")).unwrap();
        // The failure reaches the stream thread (here as it closes the
        // task's store).
        assert!(
            files.close(&task()).is_err(),
            "the failed write is reported"
        );
        files.fail_writes.store(false, Ordering::SeqCst);
        // A write that was queued behind the failed one lands nowhere.
        files.write(&task(), write(30, b"k3")).unwrap();
        assert_eq!(
            files.open(&task()).unwrap(),
            None,
            "no file re-created from the later write alone"
        );
        // Opened again, the task writes as usual.
        files.write(&task(), write(40, b"k4")).unwrap();
        files.close(&task()).unwrap();
        let s = files.open(&task()).unwrap().unwrap();
        assert_eq!(s.fold, vec![(b"k4".to_vec(), b"v".to_vec())]);
        drop(files);
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_damaged_file_reads_as_corrupt() {
        let root = temp("corrupt");
        let dir = StateDir::lock(&root, "app", "i1").unwrap();
        std::fs::write(dir.task_file(&task()), vec![0xAB; 8192]).unwrap();
        let err = dir.stores().open(&task()).unwrap_err();
        assert!(matches!(err, LocalStoreError::Corrupt { .. }), "{err}");
        drop(dir);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_second_instance_on_the_directory_is_refused_naming_it() {
        let root = temp("lock");
        let first = StateDir::lock(&root, "app", "i1").unwrap();
        let err = StateDir::lock(&root, "app", "i1").unwrap_err();
        assert!(matches!(err, StateDirError::Locked { .. }));
        assert!(
            err.to_string()
                .contains(&root.join("app").join("i1").display().to_string()),
            "{err}"
        );
        // Another instance id is another directory.
        assert!(StateDir::lock(&root, "app", "i2").is_ok());
        drop(first);
        // Released with the instance.
        assert!(StateDir::lock(&root, "app", "i1").is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }
}
