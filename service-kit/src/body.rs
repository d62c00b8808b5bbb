//! A request body read whole within a byte bound, whether it came with a
//! `Content-Length` or chunked.

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

/// Why a body was not read.
#[derive(Debug)]
pub enum BodyError<E> {
    /// It is, or announced it is, longer than the bound.
    TooLarge,
    /// The stream failed.
    Read(E),
}

/// The whole of `body`, at most `max` bytes: refused before anything is read when
/// `announced` (its `Content-Length`) is over, and as soon as what arrived is.
pub async fn read_bounded<B: Buf, E>(
    announced: Option<u64>,
    body: impl Stream<Item = Result<B, E>>,
    max: u64,
) -> Result<Bytes, BodyError<E>> {
    if announced.is_some_and(|length| length > max) {
        return Err(BodyError::TooLarge);
    }
    let room = usize::try_from(announced.unwrap_or(0)).unwrap_or(0);
    let mut whole = BytesMut::with_capacity(room);
    let mut body = std::pin::pin!(body);
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(BodyError::Read)?;
        if (whole.len() + chunk.remaining()) as u64 > max {
            return Err(BodyError::TooLarge);
        }
        while chunk.has_remaining() {
            let piece = chunk.chunk();
            whole.extend_from_slice(piece);
            let read = piece.len();
            chunk.advance(read);
        }
    }
    Ok(whole.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static str]) -> impl Stream<Item = Result<Bytes, ()>> {
        let parts: Vec<_> = parts
            .iter()
            .map(|p| Ok(Bytes::from_static(p.as_bytes())))
            .collect();
        futures_util::stream::iter(parts)
    }

    #[tokio::test]
    async fn reads_up_to_the_bound_and_no_further() {
        let read = |announced, parts, max| read_bounded(announced, chunks(parts), max);
        assert_eq!(read(None, &["ab", "cd"], 4).await.unwrap(), "abcd");
        assert_eq!(read(Some(4), &["abcd"], 4).await.unwrap(), "abcd");
        assert!(matches!(
            read(None, &["ab", "cde"], 4).await,
            Err(BodyError::TooLarge)
        ));
        assert!(matches!(
            read(Some(5), &[], 4).await,
            Err(BodyError::TooLarge)
        ));
        let failing = futures_util::stream::iter([Ok(Bytes::new()), Err("reset")]);
        assert!(matches!(
            read_bounded(None, failing, 4).await,
            Err(BodyError::Read("reset"))
        ));
    }
}
