//! The batch parser's rules, case by case.

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
