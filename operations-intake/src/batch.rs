//! The body of `POST /operations`: a JSON array of buy/sell operations, validated without
//! ever turning a number into a float, so the text that reaches Kafka is the text received.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The kind of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A purchase.
    Buy,
    /// A sale.
    Sell,
}

impl Kind {
    /// The value as written in the JSON body and in rate-limit descriptors.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Buy => "buy",
            Kind::Sell => "sell",
        }
    }
}

/// A batch that passed validation: its operation count per kind. The operations
/// themselves travel as the request body, byte for byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Number of operations.
    pub count: u64,
    /// Number of `buy` operations.
    pub buys: u64,
    /// Number of `sell` operations.
    pub sells: u64,
}

impl Batch {
    /// The kinds present in the batch with their counts, buys first.
    pub fn kinds(&self) -> impl Iterator<Item = (Kind, u64)> + use<> {
        [(Kind::Buy, self.buys), (Kind::Sell, self.sells)]
            .into_iter()
            .filter(|&(_, n)| n > 0)
    }
}

/// One thing wrong with a body; `index` is the operation's position, absent for problems
/// with the body as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Position of the operation in the array.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// The field at fault, absent when the operation itself is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong, in words.
    pub message: String,
}

impl Problem {
    /// A problem with the body as a whole.
    pub fn body(message: impl Into<String>) -> Problem {
        Problem {
            index: None,
            field: None,
            message: message.into(),
        }
    }

    /// A problem with a request header.
    pub fn header(name: &str, message: impl Into<String>) -> Problem {
        Problem {
            index: None,
            field: Some(name.to_owned()),
            message: message.into(),
        }
    }

    fn at(index: usize, field: Option<&str>, message: impl Into<String>) -> Problem {
        Problem {
            index: Some(index),
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }
}

/// Why a body was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The body breaks the schema: 400 with every problem found.
    Invalid(Vec<Problem>),
    /// More operations than `MAX_OPERATIONS`: 413.
    TooMany {
        /// Operations in the body.
        count: usize,
        /// The configured maximum.
        max: usize,
    },
}

const FIELDS: [&str; 3] = ["operation", "unit-cost", "quantity"];

/// Validates `body` as a batch of at most `max_operations` operations.
pub fn parse(body: &[u8], max_operations: usize) -> Result<Batch, Rejection> {
    let items: Vec<Item<'_>> = match serde_json::from_slice::<Items<'_>>(body) {
        Ok(Items(items)) => items,
        Err(error) => return Err(Rejection::Invalid(vec![syntax_problem(&error)])),
    };
    if items.is_empty() {
        return Err(Rejection::Invalid(vec![Problem::body(
            "the body must be a non-empty array of operations",
        )]));
    }
    if items.len() > max_operations {
        return Err(Rejection::TooMany {
            count: items.len(),
            max: max_operations,
        });
    }
    let mut problems = Vec::new();
    let mut batch = Batch::default();
    for (index, item) in items.iter().enumerate() {
        match item {
            Item::Object(fields) => {
                if let Some(kind) = check_operation(index, fields, &mut problems) {
                    batch.count += 1;
                    match kind {
                        Kind::Buy => batch.buys += 1,
                        Kind::Sell => batch.sells += 1,
                    }
                }
            }
            Item::Other => problems.push(Problem::at(
                index,
                None,
                "each operation must be a JSON object",
            )),
        }
    }
    if problems.is_empty() {
        Ok(batch)
    } else {
        Err(Rejection::Invalid(problems))
    }
}

/// Checks one operation object, recording its problems; its kind when it is valid.
fn check_operation(
    index: usize,
    fields: &[(String, &RawValue)],
    problems: &mut Vec<Problem>,
) -> Option<Kind> {
    let before = problems.len();
    for (i, (name, _)) in fields.iter().enumerate() {
        if !FIELDS.contains(&name.as_str()) {
            problems.push(Problem::at(
                index,
                Some(name),
                "unknown field; the fields are operation, unit-cost and quantity",
            ));
        } else if fields[..i].iter().any(|(earlier, _)| earlier == name) {
            problems.push(Problem::at(index, Some(name), "duplicate field"));
        }
    }
    let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.get());
    let mut kind = None;
    match field("operation") {
        None => problems.push(Problem::at(index, Some("operation"), "missing field")),
        Some(raw) => match serde_json::from_str::<String>(raw).as_deref() {
            Ok("buy") => kind = Some(Kind::Buy),
            Ok("sell") => kind = Some(Kind::Sell),
            _ => problems.push(Problem::at(
                index,
                Some("operation"),
                "must be \"buy\" or \"sell\"",
            )),
        },
    }
    match field("unit-cost") {
        None => problems.push(Problem::at(index, Some("unit-cost"), "missing field")),
        Some(raw) => {
            if let Err(message) = check_unit_cost(raw) {
                problems.push(Problem::at(index, Some("unit-cost"), message));
            }
        }
    }
    match field("quantity") {
        None => problems.push(Problem::at(index, Some("quantity"), "missing field")),
        Some(raw) => {
            if let Err(message) = check_quantity(raw) {
                problems.push(Problem::at(index, Some("quantity"), message));
            }
        }
    }
    if problems.len() == before { kind } else { None }
}

/// Most digits a unit cost may be written with, integer and fraction digits together.
const MAX_COST_DIGITS: usize = 38;
/// Largest magnitude of a unit cost's exponent.
const MAX_COST_EXPONENT: u32 = 38;
/// The powers of ten the first non-zero digit of a non-zero unit cost may stand for: the
/// value then lies from 1e-38 (10^`MIN_COST_MAGNITUDE`) to 38 nines (below
/// 10^(`MAX_COST_MAGNITUDE` + 1)).
const MIN_COST_MAGNITUDE: i64 = -38;
const MAX_COST_MAGNITUDE: i64 = 37;

/// A unit cost is a JSON number that is not below zero, written with at most
/// [`MAX_COST_DIGITS`] digits and an exponent, if any, within ±[`MAX_COST_EXPONENT`] (even
/// for zero: `0e-500` is refused), whose value is zero or from 1e-38 to
/// 99999999999999999999999999999999999999: the range openapi.yaml states, so that no
/// consumer's decimal parser is handed `1e400` or a 200 000-digit number. The value is
/// judged from the text alone (never through a float); the text is kept as sent.
fn check_unit_cost(raw: &str) -> Result<(), &'static str> {
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
fn check_quantity(raw: &str) -> Result<(), &'static str> {
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
        Ok(_) => Ok(()),
        Err(_) => Err("must fit in 64 bits (at most 18446744073709551615)"),
    }
}

/// Whether `raw`, a JSON value's text as the parser saw it, is a number.
fn is_number(raw: &str) -> bool {
    matches!(raw.as_bytes().first(), Some(b'-' | b'0'..=b'9'))
}

fn syntax_problem(error: &serde_json::Error) -> Problem {
    let what = match error.classify() {
        serde_json::error::Category::Data => "the body must be a JSON array of operations",
        serde_json::error::Category::Eof => "the body is not complete JSON",
        _ => "the body is not valid JSON",
    };
    Problem::body(format!(
        "{what} (line {}, column {})",
        error.line(),
        error.column()
    ))
}

/// The array, borrowing each field's raw text from the body.
struct Items<'a>(Vec<Item<'a>>);

/// One array element: an object's fields in order (duplicates kept, to report them), or
/// anything else.
enum Item<'a> {
    Object(Vec<(String, &'a RawValue)>),
    Other,
}

impl<'de> Deserialize<'de> for Items<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ArrayVisitor;
        impl<'de> Visitor<'de> for ArrayVisitor {
            type Value = Items<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON array of operations")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(item) = seq.next_element::<Item<'de>>()? {
                    items.push(item);
                }
                Ok(Items(items))
            }
        }
        deserializer.deserialize_seq(ArrayVisitor)
    }
}

impl<'de> Deserialize<'de> for Item<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(deserializer)?;
        if !raw.get().starts_with('{') {
            return Ok(Item::Other);
        }
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Vec<(String, &'de RawValue)>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an operation object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::with_capacity(3);
                while let Some(name) = map.next_key::<String>()? {
                    fields.push((name, map.next_value::<&'de RawValue>()?));
                }
                Ok(fields)
            }
        }
        let mut inner = serde_json::Deserializer::from_str(raw.get());
        inner
            .deserialize_map(ObjectVisitor)
            .map(Item::Object)
            .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(body: &str) -> Vec<Problem> {
        match parse(body.as_bytes(), 10) {
            Err(Rejection::Invalid(problems)) => problems,
            other => panic!("{body}: expected problems, got {other:?}"),
        }
    }

    fn fields(body: &str) -> Vec<(Option<usize>, Option<String>)> {
        problems(body)
            .into_iter()
            .map(|p| (p.index, p.field))
            .collect()
    }

    #[test]
    fn counts_kinds_of_a_valid_batch() {
        let body = r#"[{"operation":"buy","unit-cost":10.10,"quantity":100},
                       {"quantity":5,"operation":"sell","unit-cost":0.000001},
                       {"operation":"buy","unit-cost":123456789012345678.99,"quantity":18446744073709551615}]"#;
        let batch = parse(body.as_bytes(), 10).unwrap();
        assert_eq!(
            batch,
            Batch {
                count: 3,
                buys: 2,
                sells: 1
            }
        );
        assert_eq!(
            batch.kinds().collect::<Vec<_>>(),
            [(Kind::Buy, 2), (Kind::Sell, 1)]
        );
    }

    #[test]
    fn accepts_zero_costs_and_exponents() {
        for cost in ["0", "0.00", "-0", "-0.0e5", "1e-6", "2.5E+3"] {
            let body = format!(r#"[{{"operation":"buy","unit-cost":{cost},"quantity":1}}]"#);
            assert!(parse(body.as_bytes(), 10).is_ok(), "{cost}");
        }
    }

    fn cost_problem(cost: &str) -> Option<String> {
        let body = format!(r#"[{{"operation":"buy","unit-cost":{cost},"quantity":1}}]"#);
        match parse(body.as_bytes(), 10) {
            Ok(_) => None,
            Err(Rejection::Invalid(found)) => {
                assert_eq!(found.len(), 1, "{cost}: {found:?}");
                assert_eq!(found[0].index, Some(0));
                assert_eq!(found[0].field.as_deref(), Some("unit-cost"));
                Some(found[0].message.clone())
            }
            Err(other) => panic!("{cost}: {other:?}"),
        }
    }

    #[test]
    fn unit_costs_of_38_digits_from_1e_minus_38_to_38_nines_are_accepted() {
        let digits38 = "12345678901234567890123456789012345678";
        let costs = [
            digits38.to_owned(),
            format!("0.{}", &digits38[1..]),
            format!("{}.{}", &digits38[..20], &digits38[20..]),
            format!("0.{}e-37", &digits38[1..]),
            format!("{digits38}E-38"),
            "9".repeat(38),
            format!("9.{}e+37", "9".repeat(37)),
            format!("0.{}e38", "9".repeat(37)),
            "1e-38".to_owned(),
            "0.1e-37".to_owned(),
            "0.10e-37".to_owned(),
            "1e+37".to_owned(),
            "9.5e-038".to_owned(),
            "1e00000000000000000000037".to_owned(),
            "0e0".to_owned(),
            "0.0".to_owned(),
            "0e38".to_owned(),
            "0.000e-38".to_owned(),
            format!("0.{}", "0".repeat(37)),
        ];
        for cost in &costs {
            assert_eq!(cost_problem(cost), None, "{cost}");
        }
    }

    #[test]
    fn unit_costs_past_the_bounds_are_rejected_naming_the_bound() {
        let digits39 = "123456789012345678901234567890123456789";
        let too_many = [
            digits39.to_owned(),
            format!("0.{}", &digits39[1..]),
            format!("{}.{}", &digits39[..1], &digits39[1..]),
            format!("{digits39}e1"),
            "1".repeat(200_000),
            format!("1.{}", "0".repeat(38)),
        ];
        for cost in &too_many {
            let message = cost_problem(cost).unwrap_or_else(|| panic!("{cost} accepted"));
            assert!(message.contains("at most 38 digits"), "{message}");
        }
        for cost in [
            "1e400",
            "1e39",
            "1E+39",
            "1e-39",
            "5e-324",
            "1e123456789012345678901",
        ] {
            let message = cost_problem(cost).unwrap_or_else(|| panic!("{cost} accepted"));
            assert!(message.contains("between -38 and 38"), "{cost}: {message}");
        }
        // The value itself: zero, or from 1e-38 to 38 nines, as the schema states.
        for cost in [
            "1e38",
            "1E+38",
            "5E+38",
            "10e37",
            "1000000000000000000000000000000000000e2",
            "1.0e38",
            "12345678901234567890123456789012345678e38",
            "10.0e37",
        ] {
            let message = cost_problem(cost).unwrap_or_else(|| panic!("{cost} accepted"));
            assert_eq!(
                message, "must be at most 99999999999999999999999999999999999999 (38 nines)",
                "{cost}"
            );
        }
        for cost in [
            "0.5e-38",
            "0.1e-38",
            "0.09e-37",
            "0.99999e-38",
            "0.1234567890123456789012345678901234567E-38",
            "0.0000000000000000000000000000000000001e-2",
        ] {
            let message = cost_problem(cost).unwrap_or_else(|| panic!("{cost} accepted"));
            assert_eq!(message, "must be 0 or at least 1e-38", "{cost}");
        }
        // The exponent is bounded even for zero.
        for cost in ["0e-500", "0.0E+39", "-0e-39"] {
            let message = cost_problem(cost).unwrap_or_else(|| panic!("{cost} accepted"));
            assert!(message.contains("between -38 and 38"), "{cost}: {message}");
        }
        // A negative cost is reported as negative, whatever its size.
        assert_eq!(
            cost_problem("-1e400").as_deref(),
            Some("must not be negative")
        );
    }

    #[test]
    fn rejects_shapes_that_are_not_an_array_of_objects() {
        for body in ["{}", "\"x\"", "1", "null", "", "[", "[1,]", "not json"] {
            let found = problems(body);
            assert_eq!(found.len(), 1, "{body}");
            assert_eq!(found[0].index, None, "{body}");
        }
        assert_eq!(
            problems("[]")[0].message,
            "the body must be a non-empty array of operations"
        );
        assert_eq!(fields("[1, []]"), [(Some(0), None), (Some(1), None)]);
    }

    #[test]
    fn lists_every_field_problem_with_its_index() {
        let body = r#"[
            {"operation":"buy","unit_cost":1,"quantity":1},
            {"operation":"hold","unit-cost":"1","quantity":1.5},
            {"operation":"sell","unit-cost":-0.01,"quantity":-3},
            {"operation":"sell","unit-cost":1,"quantity":0, "quantity": 2},
            {"operation":"sell","unit-cost":1,"quantity":18446744073709551616}
        ]"#;
        let found = fields(body);
        let at = |i: usize, f: &str| (Some(i), Some(f.to_owned()));
        assert_eq!(
            found,
            [
                at(0, "unit_cost"),
                at(0, "unit-cost"),
                at(1, "operation"),
                at(1, "unit-cost"),
                at(1, "quantity"),
                at(2, "unit-cost"),
                at(2, "quantity"),
                at(3, "quantity"),
                at(3, "quantity"),
                at(4, "quantity"),
            ]
        );
        let messages: Vec<String> = problems(body).into_iter().map(|p| p.message).collect();
        assert_eq!(messages[4], "must be a whole number");
        assert_eq!(messages[5], "must not be negative");
        assert_eq!(messages[7], "duplicate field");
    }

    #[test]
    fn too_many_operations_is_its_own_rejection() {
        let one = r#"{"operation":"buy","unit-cost":1,"quantity":1}"#;
        let body = format!("[{}]", [one; 11].join(","));
        assert_eq!(
            parse(body.as_bytes(), 10),
            Err(Rejection::TooMany { count: 11, max: 10 })
        );
    }
}
