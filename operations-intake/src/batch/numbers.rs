//! What a number in a batch may be: a unit cost within the bounds and its decimal
//! places, a whole quantity.

/// The decimal places of a unit cost's value, `raw` having passed [`check_unit_cost`]:
/// the digits after the point once the exponent is applied and trailing zeros dropped
/// (`10.10` has 1, `1.5e-3` has 4, `2.5E+3` and `0.000` have none).
pub(super) fn decimal_places(raw: &str) -> u64 {
    let (mantissa, exponent) = match raw.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, bounded_exponent(exponent).unwrap_or(0)),
        None => (raw, 0),
    };
    let mantissa = mantissa.trim_start_matches('-');
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = || integer.bytes().chain(fraction.bytes());
    if digits().all(|b| b == b'0') {
        return 0;
    }
    let trailing_zeros = digits().rev().take_while(|&b| b == b'0').count() as i64;
    let scale = fraction.len() as i64 - exponent - trailing_zeros;
    u64::try_from(scale).unwrap_or(0)
}

/// Most digits a unit cost may be written with, integer and fraction digits together.
pub(super) const MAX_COST_DIGITS: usize = 38;
/// Largest magnitude of a unit cost's exponent.
pub(super) const MAX_COST_EXPONENT: u32 = 38;
/// The powers of ten the first non-zero digit of a non-zero unit cost may stand for: the
/// value then lies from 1e-38 (10^`MIN_COST_MAGNITUDE`) to 38 nines (below
/// 10^(`MAX_COST_MAGNITUDE` + 1)).
pub(super) const MIN_COST_MAGNITUDE: i64 = -38;
pub(super) const MAX_COST_MAGNITUDE: i64 = 37;

/// A unit cost is a JSON number that is not below zero, written with at most
/// [`MAX_COST_DIGITS`] digits and an exponent, if any, within ±[`MAX_COST_EXPONENT`] (even
/// for zero: `0e-500` is refused), whose value is zero or from 1e-38 to
/// 99999999999999999999999999999999999999: the range openapi.yaml states, so that no
/// consumer's decimal parser is handed `1e400` or a 200 000-digit number. The value is
/// judged from the text alone (never through a float); the text is kept as sent.
pub(super) fn check_unit_cost(raw: &str) -> Result<(), &'static str> {
    if !is_number(raw) {
        return Err("must be a JSON number");
    }
    let (mantissa, exponent) = match raw.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, Some(exponent)),
        None => (raw, None),
    };
    if raw.starts_with('-') && mantissa.bytes().any(|b| matches!(b, b'1'..=b'9')) {
        return Err("must not be negative");
    }
    if mantissa.bytes().filter(u8::is_ascii_digit).count() > MAX_COST_DIGITS {
        return Err(
            "must be written with at most 38 digits (integer and fraction digits together)",
        );
    }
    let exponent = match exponent {
        None => 0,
        Some(text) => bounded_exponent(text).ok_or("must have an exponent between -38 and 38")?,
    };
    match magnitude(mantissa.trim_start_matches('-'), exponent) {
        Some(m) if m < MIN_COST_MAGNITUDE => Err("must be 0 or at least 1e-38"),
        // With at most 38 significant digits, a value below 10^38 is at most 38 nines.
        Some(m) if m > MAX_COST_MAGNITUDE => {
            Err("must be at most 99999999999999999999999999999999999999 (38 nines)")
        }
        _ => Ok(()),
    }
}

/// The exponent as written (`+38`, `-07`, `0000038`) when it is within
/// ±[`MAX_COST_EXPONENT`].
fn bounded_exponent(text: &str) -> Option<i64> {
    let negative = text.starts_with('-');
    let digits = text.trim_start_matches(['+', '-']).trim_start_matches('0');
    let magnitude = match digits {
        "" => 0,
        _ if digits.len() > 2 => return None,
        _ => digits
            .parse::<u32>()
            .ok()
            .filter(|&e| e <= MAX_COST_EXPONENT)?,
    };
    let magnitude = i64::from(magnitude);
    Some(if negative { -magnitude } else { magnitude })
}

/// The power of ten of the first non-zero digit of `mantissa` (digits with at most one
/// `.`, no sign) times 10^`exponent`: the value lies in [10^m, 10^(m+1)). `None` for zero.
fn magnitude(mantissa: &str, exponent: i64) -> Option<i64> {
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let power = match integer.bytes().position(|b| b != b'0') {
        Some(i) => (integer.len() - 1 - i) as i64,
        None => -1 - fraction.bytes().position(|b| b != b'0')? as i64,
    };
    Some(power + exponent)
}

/// A quantity is a whole number written without fraction or exponent, from 1 to 2^64-1.
pub(super) fn check_quantity(raw: &str) -> Result<u64, &'static str> {
    if !is_number(raw) {
        return Err("must be a JSON number");
    }
    if raw.starts_with('-') {
        return Err("must be greater than zero");
    }
    if raw.contains(['.', 'e', 'E']) {
        return Err("must be a whole number");
    }
    match raw.parse::<u64>() {
        Ok(0) => Err("must be greater than zero"),
        Ok(n) => Ok(n),
        Err(_) => Err("must fit in 64 bits (at most 18446744073709551615)"),
    }
}

/// Whether `raw`, a JSON value's text as the parser saw it, is a number.
pub(super) fn is_number(raw: &str) -> bool {
    matches!(raw.as_bytes().first(), Some(b'-' | b'0'..=b'9'))
}
