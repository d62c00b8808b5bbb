//! The body of `POST /operations`: a JSON array of buy/sell operations, validated without
//! ever turning a number into a float, so the text that reaches Kafka is the text received.

mod json;

use serde::Serialize;
use serde_json::value::RawValue;

use self::json::{Item, Items, syntax_problem};

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

/// The domain checks a batch must pass besides its shape; each is off unless configured.
/// A batch that fails one is refused (400) with the problem at the field at fault, like
/// any other validation problem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// `MAX_UNIT_COST_DECIMALS`: most decimal places of a `unit-cost`'s value (trailing
    /// zeros do not count: `1.50` has one, `1.5e-3` has four).
    pub max_unit_cost_decimals: Option<u32>,
    /// `REJECT_OVERSELL`: walking the batch in order from a position of zero (`+quantity`
    /// for a buy, `-quantity` for a sell), the first operation that takes the position
    /// below zero is refused at its `quantity`.
    pub reject_oversell: bool,
}

/// Validates `body` as a batch of at most `max_operations` operations, with no domain
/// check ([`Rules::default`]).
pub fn parse(body: &[u8], max_operations: usize) -> Result<Batch, Rejection> {
    parse_with(body, max_operations, &Rules::default())
}

/// Validates `body` as a batch of at most `max_operations` operations that passes `rules`.
pub fn parse_with(body: &[u8], max_operations: usize, rules: &Rules) -> Result<Batch, Rejection> {
    parse_capped(body, max_operations, rules, usize::MAX).map_err(|(rejection, _)| rejection)
}

/// As [`parse_with`], keeping only the first `max_problems` problems (at least one) and
/// counting the others, the number beside the rejection: a 1 MiB body of 110 000 unknown
/// fields then holds 100 problems in memory, not 110 000.
pub fn parse_capped(
    body: &[u8],
    max_operations: usize,
    rules: &Rules,
    max_problems: usize,
) -> Result<Batch, (Rejection, usize)> {
    let invalid = |problem| (Rejection::Invalid(vec![problem]), 0);
    let items: Vec<Item<'_>> = match serde_json::from_slice::<Items<'_>>(body) {
        Ok(Items(items)) => items,
        Err(error) => return Err(invalid(syntax_problem(&error))),
    };
    if items.is_empty() {
        return Err(invalid(Problem::body(
            "the body must be a non-empty array of operations",
        )));
    }
    if items.len() > max_operations {
        let count = items.len();
        let max = max_operations;
        return Err((Rejection::TooMany { count, max }, 0));
    }
    let mut problems = Found::new(max_problems);
    let mut batch = Batch::default();
    let mut position = rules.reject_oversell.then(Position::default);
    for (index, item) in items.iter().enumerate() {
        let checked = match item {
            Item::Object(fields) => check_operation(index, fields, rules, &mut problems),
            Item::Other => {
                problems.add(|| Problem::at(index, None, "each operation must be a JSON object"));
                Checked::default()
            }
        };
        if let Some(kind) = checked.valid {
            batch.count += 1;
            match kind {
                Kind::Buy => batch.buys += 1,
                Kind::Sell => batch.sells += 1,
            }
        }
        if let Some(walk) = &mut position {
            walk.step(index, &checked, &mut problems);
        }
    }
    if problems.count() == 0 {
        Ok(batch)
    } else {
        Err((Rejection::Invalid(problems.list), problems.omitted))
    }
}

/// The problems found: the first ones, up to a cap, then only a count.
struct Found {
    list: Vec<Problem>,
    cap: usize,
    omitted: usize,
}

impl Found {
    fn new(cap: usize) -> Found {
        Found {
            list: Vec::new(),
            cap: cap.max(1),
            omitted: 0,
        }
    }

    /// Records the problem `make` describes, or only counts it past the cap.
    fn add(&mut self, make: impl FnOnce() -> Problem) {
        if self.list.len() < self.cap {
            self.list.push(make());
        } else {
            self.omitted += 1;
        }
    }

    fn count(&self) -> usize {
        self.list.len() + self.omitted
    }
}

/// What one operation turned out to be.
#[derive(Clone, Copy, Debug, Default)]
struct Checked {
    /// Its kind, when `operation` is valid.
    kind: Option<Kind>,
    /// Its quantity, when `quantity` is valid.
    quantity: Option<u64>,
    /// Its kind, when the whole operation is valid.
    valid: Option<Kind>,
}

/// `REJECT_OVERSELL`: the batch's running position, from zero, while every operation so
/// far has a known kind and quantity.
#[derive(Debug)]
enum Position {
    /// Units held after the operations so far (at most 2^64-1 units times a usize of
    /// operations: an i128 holds it).
    Held(i128),
    /// An operation had no known kind or quantity, so the position is unknown from
    /// there, or one sold short already (only the first is reported).
    Done,
}

impl Default for Position {
    fn default() -> Position {
        Position::Held(0)
    }
}

impl Position {
    /// Applies the operation at `index`, recording a problem if it sells short.
    fn step(&mut self, index: usize, checked: &Checked, problems: &mut Found) {
        let Position::Held(held) = *self else {
            return;
        };
        let (Some(kind), Some(quantity)) = (checked.kind, checked.quantity) else {
            *self = Position::Done;
            return;
        };
        let after = match kind {
            Kind::Buy => held + i128::from(quantity),
            Kind::Sell => held - i128::from(quantity),
        };
        *self = if after < 0 {
            problems.add(|| {
                Problem::at(
                    index,
                    Some("quantity"),
                    format!(
                        "sells {quantity} units when the batch holds {held}: a batch may not sell more than it bought before it (its position starts at zero)"
                    ),
                )
            });
            Position::Done
        } else {
            Position::Held(after)
        };
    }
}

/// Checks one operation object against the schema and the unit-cost rule of `rules`,
/// recording its problems.
fn check_operation(
    index: usize,
    fields: &[(String, &RawValue)],
    rules: &Rules,
    problems: &mut Found,
) -> Checked {
    let before = problems.count();
    // Duplicates are only looked for among the known fields: a set of three, so a body
    // of 50 000 unknown fields then 50 000 `quantity` costs no 50 000² comparisons.
    let mut seen = [false; FIELDS.len()];
    let mut duplicated = [false; FIELDS.len()];
    for (name, _) in fields {
        match FIELDS.iter().position(|known| known == name) {
            None => problems.add(|| {
                Problem::at(
                    index,
                    Some(name),
                    "unknown field; the fields are operation, unit-cost and quantity",
                )
            }),
            Some(k) if seen[k] => {
                duplicated[k] = true;
                problems.add(|| Problem::at(index, Some(name), "duplicate field"));
            }
            Some(k) => seen[k] = true,
        }
    }
    let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.get());
    let mut kind = None;
    match field("operation") {
        None => problems.add(|| Problem::at(index, Some("operation"), "missing field")),
        Some(raw) => match serde_json::from_str::<String>(raw).as_deref() {
            Ok("buy") => kind = Some(Kind::Buy),
            Ok("sell") => kind = Some(Kind::Sell),
            _ => problems
                .add(|| Problem::at(index, Some("operation"), "must be \"buy\" or \"sell\"")),
        },
    }
    match field("unit-cost") {
        None => problems.add(|| Problem::at(index, Some("unit-cost"), "missing field")),
        Some(raw) => match check_unit_cost(raw) {
            Err(message) => problems.add(|| Problem::at(index, Some("unit-cost"), message)),
            Ok(()) => match rules.max_unit_cost_decimals {
                Some(max) if decimal_places(raw) > u64::from(max) => problems.add(|| {
                    Problem::at(
                        index,
                        Some("unit-cost"),
                        format!(
                            "must have at most {max} decimal places; it has {}",
                            decimal_places(raw)
                        ),
                    )
                }),
                _ => {}
            },
        },
    }
    let mut quantity = None;
    match field("quantity") {
        None => problems.add(|| Problem::at(index, Some("quantity"), "missing field")),
        Some(raw) => match check_quantity(raw) {
            Ok(n) => quantity = Some(n),
            Err(message) => problems.add(|| Problem::at(index, Some("quantity"), message)),
        },
    }
    // A field given twice has no one value: the position cannot follow it.
    Checked {
        kind: kind.filter(|_| !duplicated[0]),
        quantity: quantity.filter(|_| !duplicated[2]),
        valid: kind.filter(|_| problems.count() == before),
    }
}

/// The decimal places of a unit cost's value, `raw` having passed [`check_unit_cost`]:
/// the digits after the point once the exponent is applied and trailing zeros dropped
/// (`10.10` has 1, `1.5e-3` has 4, `2.5E+3` and `0.000` have none).
fn decimal_places(raw: &str) -> u64 {
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
fn check_quantity(raw: &str) -> Result<u64, &'static str> {
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
fn is_number(raw: &str) -> bool {
    matches!(raw.as_bytes().first(), Some(b'-' | b'0'..=b'9'))
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
    fn problems_past_the_cap_are_only_counted() {
        let fields: Vec<String> = (0..110_000).map(|i| format!("\"{i:x}\":0")).collect();
        let body = format!("[{{{}}}]", fields.join(","));
        let Err((Rejection::Invalid(kept), omitted)) =
            parse_capped(body.as_bytes(), 10, &Rules::default(), 100)
        else {
            panic!("refused")
        };
        assert_eq!((kept.len(), omitted), (100, 110_003 - 100));
        assert_eq!(kept[99].field.as_deref(), Some("63"));
        // Uncapped, the same problems, all of them.
        assert_eq!(problems(&body).len(), 110_003);
        assert_eq!(problems(&body)[..100], kept[..]);
    }

    #[test]
    fn duplicates_are_found_without_comparing_every_pair_of_fields() {
        let unknown = (0..50_000).map(|i| format!("\"u{i}\":0"));
        let quantities = (0..50_000).map(|_| "\"quantity\":1".to_owned());
        let fields: Vec<String> = unknown.chain(quantities).collect();
        let body = format!("[{{{}}}]", fields.join(","));
        let started = std::time::Instant::now();
        let found = problems(&body);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let duplicates = found.iter().filter(|p| p.message == "duplicate field");
        assert_eq!(duplicates.count(), 49_999);
        assert_eq!(
            found.len(),
            50_000 + 49_999 + 2,
            "and no operation or unit-cost"
        );
    }

    fn with_rules(body: &str, rules: Rules) -> Vec<(Option<usize>, Option<String>, String)> {
        match parse_with(body.as_bytes(), 10, &rules) {
            Ok(_) => Vec::new(),
            Err(Rejection::Invalid(found)) => found
                .into_iter()
                .map(|p| (p.index, p.field, p.message))
                .collect(),
            Err(other) => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn decimal_places_are_counted_on_the_value() {
        let cases = [
            ("10", 0),
            ("10.10", 1),
            ("10.100", 1),
            ("0.015", 3),
            ("1.5e-3", 4),
            ("100e-3", 1),
            ("2.5E+3", 0),
            ("1234.5e2", 0),
            ("0.000", 0),
            ("-0.0e5", 0),
            ("0e-38", 0),
            ("1e-38", 38),
            ("0.12e-36", 38),
        ];
        for (cost, places) in cases {
            assert_eq!(decimal_places(cost), places, "{cost}");
        }
    }

    #[test]
    fn max_unit_cost_decimals_refuses_finer_costs_at_their_unit_cost() {
        let body = r#"[{"operation":"buy","unit-cost":10.125,"quantity":1},
                       {"operation":"buy","unit-cost":10.120,"quantity":1},
                       {"operation":"buy","unit-cost":1e-2,"quantity":1},
                       {"operation":"buy","unit-cost":5e-3,"quantity":1}]"#;
        assert!(
            with_rules(body, Rules::default()).is_empty(),
            "off by default"
        );
        let two = Rules {
            max_unit_cost_decimals: Some(2),
            ..Rules::default()
        };
        let found = with_rules(body, two);
        let at: Vec<_> = found.iter().map(|(i, f, _)| (*i, f.as_deref())).collect();
        assert_eq!(
            at,
            [(Some(0), Some("unit-cost")), (Some(3), Some("unit-cost"))]
        );
        assert_eq!(found[0].2, "must have at most 2 decimal places; it has 3");
        let zero = Rules {
            max_unit_cost_decimals: Some(0),
            ..Rules::default()
        };
        let whole = r#"[{"operation":"buy","unit-cost":1.0e3,"quantity":1}]"#;
        assert!(with_rules(whole, zero).is_empty());
        // A cost outside the schema's bounds gets that problem alone.
        let out = r#"[{"operation":"buy","unit-cost":1e-39,"quantity":1}]"#;
        assert_eq!(with_rules(out, two).len(), 1);
    }

    #[test]
    fn reject_oversell_refuses_the_first_operation_that_sells_short() {
        let op = |kind: &str, quantity: &str| {
            format!(r#"{{"operation":"{kind}","unit-cost":1,"quantity":{quantity}}}"#)
        };
        let on = Rules {
            reject_oversell: true,
            ..Rules::default()
        };
        let body = |ops: &[String]| format!("[{}]", ops.join(","));
        let even = body(&[op("buy", "5"), op("sell", "3"), op("sell", "2")]);
        assert!(with_rules(&even, on).is_empty(), "back to zero is fine");
        let short = body(&[
            op("buy", "5"),
            op("sell", "3"),
            op("sell", "3"),
            op("sell", "9"),
        ]);
        assert!(
            with_rules(&short, Rules::default()).is_empty(),
            "off by default"
        );
        let found = with_rules(&short, on);
        assert_eq!(found.len(), 1, "only the first: {found:?}");
        assert_eq!(
            (found[0].0, found[0].1.as_deref()),
            (Some(2), Some("quantity"))
        );
        assert!(
            found[0].2.contains("sells 3 units when the batch holds 2"),
            "{}",
            found[0].2
        );
        assert_eq!(
            with_rules(&body(&[op("sell", "1")]), on)[0].0,
            Some(0),
            "a position starts at zero"
        );
        // Quantities up to 2^64-1 neither overflow nor wrap.
        let max = "18446744073709551615";
        let big = body(&[
            op("buy", max),
            op("buy", max),
            op("sell", max),
            op("sell", max),
        ]);
        assert!(with_rules(&big, on).is_empty());
        let big_short = body(&[op("buy", max), op("sell", max), op("sell", "1")]);
        assert_eq!(with_rules(&big_short, on)[0].0, Some(2));
        // An operation whose kind or quantity is unknown ends the walk: its own problem
        // is reported, and nothing after it is judged.
        let unknown = body(&[op("buy", "1"), op("hold", "1"), op("sell", "5")]);
        let found = with_rules(&unknown, on);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].1.as_deref(), Some("operation"));
        // A short sale before a bad operation is reported with it.
        let both = body(&[op("sell", "1"), op("buy", "1.5")]);
        let found = with_rules(&both, on);
        let at: Vec<_> = found.iter().map(|(i, f, _)| (*i, f.as_deref())).collect();
        assert_eq!(
            at,
            [(Some(0), Some("quantity")), (Some(1), Some("quantity"))]
        );
        let twice = r#"[{"operation":"sell","unit-cost":1,"quantity":1,"quantity":5}]"#;
        let found = with_rules(twice, on);
        assert_eq!(found.len(), 1, "the duplicate only, no walk: {found:?}");
        assert_eq!(found[0].2, "duplicate field");
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
