//! Library code behind the `parsley` command, so that the command stays a
//! thin `main` and everything it does is tested.
//!
//! * [`demo`]: the guarantee at work, with and without Parsley.
//! * [`inspect`]: a live topic's records with their causal headers.
//! * [`holds`]: what a running application holds and why.
//! * [`probe`]: the cluster contract probes for a described application.
//! * [`skip`]: steps a stopped application's task past one named record.
//! * [`reset`]: resets a stopped application so that it reprocesses its
//!   inputs.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod connect;
pub mod demo;
pub mod holds;
pub mod inspect;
pub mod probe;
pub mod reset;
pub mod skip;
mod stopped;
