//! A batch sent but not acknowledged, or about to be sent: where it may be on the topic,
//! as a note the idempotency store keeps for the batch's retry.

/// The generation of an attempt's note, written before its batch is given to a
/// producer: the generation that sends it is not known, so it settles by time, as a
/// note of another process's does.
pub const BEFORE_SENDING: u64 = u64::MAX;

/// A batch sent but not acknowledged: where it would be, and which producer sent it.
/// Once that producer is fenced, reading the partition from `from` tells whether it is
/// there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsettled {
    /// The partition it was sent to.
    pub partition: i32,
    /// No offset below this one can hold it.
    pub from: i64,
    /// The producer generation that sent it, in that process.
    pub generation: u64,
    /// When the attempt was given up, in milliseconds since the epoch.
    pub since_ms: u64,
    /// The process that sent it: its transactional id and a number of its own run.
    pub producer: String,
}

impl Unsettled {
    /// As text, for the idempotency store.
    pub fn note(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.partition, self.from, self.generation, self.since_ms, self.producer
        )
    }

    /// From [`Unsettled::note`]'s text.
    pub fn from_note(note: &str) -> Option<Unsettled> {
        let mut parts = note.splitn(5, ' ');
        Some(Unsettled {
            partition: parts.next()?.parse().ok()?,
            from: parts.next()?.parse().ok()?,
            generation: parts.next()?.parse().ok()?,
            since_ms: parts.next()?.parse().ok()?,
            producer: parts.next()?.to_owned(),
        })
    }
}
