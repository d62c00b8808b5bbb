//! How envoyproxy/ratelimit's YAML decoder (yaml.v2, YAML 1.1) reads a scalar written
//! without quotes where this parser (YAML 1.2) reads a string: `yes` and `off` are
//! booleans, `010` is octal and `1_000` is a thousand.

/// A YAML 1.1 boolean.
pub(super) fn boolean(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            Some(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            Some(false)
        }
        _ => None,
    }
}

/// A YAML 1.1 integer: a sign, then digits in base 10, 16 (`0x`), 8 (`0o`, or a leading
/// `0`) or 2 (`0b`), any `_` among them ignored.
pub(super) fn integer(text: &str) -> Option<i64> {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, digits) = match digits.as_bytes().first() {
        Some(b'-') => (true, &digits[1..]),
        Some(b'+') => (false, &digits[1..]),
        _ => (false, &digits[..]),
    };
    let (radix, digits) = match digits.get(..2) {
        Some("0x" | "0X") => (16, &digits[2..]),
        Some("0o" | "0O") => (8, &digits[2..]),
        Some("0b" | "0B") => (2, &digits[2..]),
        _ if digits.len() > 1 && digits.starts_with('0') => (8, &digits[1..]),
        _ => (10, digits),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_yaml_1_1s() {
        for text in ["y", "Yes", "ON", "true"] {
            assert_eq!(boolean(text), Some(true), "{text}");
        }
        for text in ["n", "NO", "off", "False"] {
            assert_eq!(boolean(text), Some(false), "{text}");
        }
        for text in ["yES", "1", "", "oN"] {
            assert_eq!(boolean(text), None, "{text}");
        }
    }

    #[test]
    fn integers_are_yaml_1_1s() {
        let cases = [
            ("010", Some(8)),
            ("1_000", Some(1000)),
            ("0x1F", Some(31)),
            ("0b101", Some(5)),
            ("0o17", Some(15)),
            ("+5", Some(5)),
            ("-0x10", Some(-16)),
            ("0", Some(0)),
            ("09", None),
            ("0x", None),
            ("1.5", None),
            ("+", None),
            ("9223372036854775808", None),
        ];
        for (text, expected) in cases {
            assert_eq!(integer(text), expected, "{text}");
        }
    }
}
