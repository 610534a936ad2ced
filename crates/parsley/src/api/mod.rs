//! What users write: typed topics and codecs, messages, handlers and folds,
//! stages, and the application that composes them. No I/O and no runtime
//! here: everything is a value a test can build and compare.

pub(crate) mod app;
pub mod codec;
pub mod describe;
pub mod fold;
pub(crate) mod key_filter;
pub(crate) mod logic;
pub(crate) mod message;
pub(crate) mod stage;
pub(crate) mod topic;
