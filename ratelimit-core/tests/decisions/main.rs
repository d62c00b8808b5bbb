//! Matching and decisions, end to end through the public API: which rule a descriptor
//! meets ([`matching`]), the modes that change what is counted and answered ([`modes`]),
//! and what an answer reports: headers, resets and statistics ([`reports`]).

#[path = "../support/mod.rs"]
mod support;

mod matching;
mod modes;
mod reports;
