//! The headers of a `ShouldRateLimit` call the sidecar reads: looked up cheaply, and
//! `grpc-timeout` read as grpc-go reads it.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The first value of the header `name`, as [`HeaderMap::get`] finds it. A call
/// carries a handful of headers: comparing a name with each of theirs first costs less
/// than hashing it to look it up, which is left for a header that is there.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if !headers.keys().any(|key| key == name) {
        return None;
    }
    headers.get(name)
}

/// The caller's deadline from gRPC's `grpc-timeout` header (`100m`, `2S`, ...), read as
/// grpc-go reads it: one to eight digits and a unit; anything else is malformed, with
/// grpc-go's words.
pub(crate) fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    // A name made once: looking a `&str` up parses and classifies it on every call.
    static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
    let Some(value) = header(headers, &GRPC_TIMEOUT) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    let malformed = |why: String| Err(format!("malformed grpc-timeout: {why}"));
    if text.len() < 2 {
        return malformed(format!("transport: timeout string is too short: {text:?}"));
    }
    if text.len() > 9 {
        return malformed(format!("transport: timeout string is too long: {text:?}"));
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    let unit: fn(u64) -> Duration = match unit {
        "H" => |n| Duration::from_secs(n * 3_600),
        "M" => |n| Duration::from_secs(n * 60),
        "S" => Duration::from_secs,
        "m" => Duration::from_millis,
        "u" => Duration::from_micros,
        "n" => Duration::from_nanos,
        _ => {
            return malformed(format!(
                "transport: timeout unit is not recognized: {text:?}"
            ));
        }
    };
    match digits.bytes().all(|b| b.is_ascii_digit()) {
        // At most eight digits: no unit overflows.
        true => Ok(Some(unit(digits.parse().unwrap_or(0)))),
        false => malformed(format!(
            "strconv.ParseUint: parsing {digits:?}: invalid syntax"
        )),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever the names, their order and repeats: the value `get` finds.
        #[test]
        fn a_header_is_the_value_get_finds(
            pairs in prop::collection::vec((0..6usize, "[a-z]{0,3}"), 0..12),
            wanted in 0..7usize,
        ) {
            const NAMES: [&str; 7] = [
                "grpc-timeout", "grpc-encoding", "content-type", "te", "x-request-id",
                "grpc-timeouts", "user-agent",
            ];
            let mut headers = HeaderMap::new();
            for (name, value) in &pairs {
                let name = HeaderName::from_static(NAMES[*name]);
                headers.append(name, HeaderValue::from_str(value).unwrap());
            }
            let name = HeaderName::from_static(NAMES[wanted]);
            prop_assert_eq!(header(&headers, &name), headers.get(&name));
        }
    }

    #[test]
    fn a_caller_deadline_reads_every_grpc_unit_and_refuses_what_grpc_go_refuses() {
        let deadline = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-other", HeaderValue::from_static("1S"));
            headers.insert("grpc-timeout", HeaderValue::from_static(value));
            grpc_timeout(&headers)
        };
        assert_eq!(deadline("2H"), Ok(Some(Duration::from_secs(7_200))));
        assert_eq!(deadline("3M"), Ok(Some(Duration::from_secs(180))));
        assert_eq!(deadline("4S"), Ok(Some(Duration::from_secs(4))));
        assert_eq!(deadline("250m"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(deadline("7u"), Ok(Some(Duration::from_micros(7))));
        assert_eq!(
            deadline("99999999n"),
            Ok(Some(Duration::from_nanos(99_999_999)))
        );
        assert_eq!(
            deadline("99999999H"),
            Ok(Some(Duration::from_secs(359_999_996_400)))
        );
        for (malformed, why) in [
            ("9x", "transport: timeout unit is not recognized: \"9x\""),
            ("S", "transport: timeout string is too short: \"S\""),
            (
                "123456789S",
                "transport: timeout string is too long: \"123456789S\"",
            ),
            ("-5S", "strconv.ParseUint: parsing \"-5\": invalid syntax"),
            ("1.5S", "strconv.ParseUint: parsing \"1.5\": invalid syntax"),
        ] {
            assert_eq!(
                deadline(malformed),
                Err(format!("malformed grpc-timeout: {why}"))
            );
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), Ok(None));
    }
}
