//! Values parsed the way envoyproxy/ratelimit parses them: Go booleans and durations,
//! `k1:v1,k2:v2` maps.

use std::collections::BTreeMap;
use std::time::Duration;

/// A `k1:v1,k2:v2` map.
pub type StringMap = BTreeMap<String, String>;

/// Go's `strconv.ParseBool`.
pub fn go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("expected a boolean (true, false, 1, 0, t, f)".into()),
    }
}

/// Go's `time.ParseDuration`: `10s`, `150us`, `1h30m`, `1.5s`, `0`.
pub fn go_duration(value: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "expected a duration with a unit, such as 10s, 150ms or 1h30m (units: ns, us, ms, s, m, h); got '{value}'"
        )
    };
    if value == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = value;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if number_len == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// `k1:v1,k2:v2`, as envconfig reads a map: blank is empty, and every item, even an
/// empty one after a trailing comma, holds exactly one `:`.
pub fn go_map(value: &str) -> Result<StringMap, String> {
    if value.trim().is_empty() {
        return Ok(StringMap::default());
    }
    value
        .split(',')
        .map(|pair| match pair.split(':').collect::<Vec<_>>()[..] {
            [k, v] => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!(
                "expected k1:v1,k2:v2; invalid map item '{pair}' (one ':' per item)"
            )),
        })
        .collect()
}

/// A number from 0 to 1.
pub fn ratio(value: &str) -> Result<f32, String> {
    match value.parse::<f32>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("expected a number from 0 to 1; got '{value}'")),
    }
}
