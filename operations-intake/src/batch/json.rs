//! The body as JSON: an array whose elements keep each field's raw text, borrowed from
//! the body, so no number is ever read as a float.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::Problem;

/// The problem with a body serde_json could not read as an array.
pub(super) fn syntax_problem(error: &serde_json::Error) -> Problem {
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
pub(super) struct Items<'a>(pub(super) Vec<Item<'a>>);

/// One array element: an object's fields in order (duplicates kept, to report them), or
/// anything else.
pub(super) enum Item<'a> {
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
