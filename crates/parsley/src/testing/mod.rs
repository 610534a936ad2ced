//! The broker-less test host ([`TestDriver`](crate::TestDriver)) and the
//! contract probes.

pub(crate) mod driver;
pub mod probes;
