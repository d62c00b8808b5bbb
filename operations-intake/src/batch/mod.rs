//! The body of `POST /operations`: a JSON array of buy/sell operations, validated without
//! ever turning a number into a float, so the text that reaches Kafka is the text received.

mod json;
mod numbers;

use serde::Serialize;
use serde_json::value::RawValue;

use self::json::{Item, Items, syntax_problem};
use self::numbers::{check_quantity, check_unit_cost, decimal_places};

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

#[cfg(test)]
mod tests;
