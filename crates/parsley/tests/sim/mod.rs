//! Shared pieces of the application-world suites.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod bridge;
pub mod disk;
