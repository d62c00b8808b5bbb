//! What the service tells about itself: statistics and where they go ([`sinks`]),
//! traces ([`traces`]), health ([`health`]), the debug server ([`debug`]) with its
//! dashboard ([`dashboard`]) and explanations of decisions ([`explain`]).

pub mod dashboard;
pub mod debug;
pub mod explain;
pub mod health;
pub mod sinks;
pub mod traces;
