//! DogStatsD mogrifiers: a regular expression that renames a statistic and turns parts
//! of its name into tags (`DOG_STATSD_MOGRIFIER_<NAME>_{PATTERN,NAME,TAGS}`).

use regex::Regex;

/// One mogrifier.
#[derive(Clone, Debug)]
pub struct Mogrifier {
    pattern: Regex,
    name: String,
    tags: Vec<(String, String)>,
}

impl Mogrifier {
    /// Reads mogrifier `name` from `env`.
    pub fn from_env(
        name: &str,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Mogrifier, String> {
        let var = |part: &str| format!("DOG_STATSD_MOGRIFIER_{name}_{part}");
        let required = |part: &str| {
            env(&var(part))
                .filter(|value| !value.is_empty())
                .ok_or_else(|| {
                    format!(
                        "{}: required by USE_DOG_STATSD_MOGRIFIERS={name}",
                        var(part)
                    )
                })
        };
        let pattern = Regex::new(&required("PATTERN")?)
            .map_err(|error| format!("{}: {error}", var("PATTERN")))?;
        let tags = env(&var("TAGS"))
            .unwrap_or_default()
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| match pair.split_once(':') {
                Some((key, value)) if !key.is_empty() && !value.is_empty() => {
                    Ok((key.to_owned(), value.to_owned()))
                }
                _ => Err(format!(
                    "{}: expected key:value pairs; got '{pair}'",
                    var("TAGS")
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(Mogrifier {
            pattern,
            name: required("NAME")?,
            tags,
        })
    }

    /// The new name and the tags, when the pattern matches `statistic`.
    pub fn apply(&self, statistic: &str) -> Option<(String, Vec<String>)> {
        let captures = self.pattern.captures(statistic)?;
        let expand = |template: &str| {
            let mut out = String::with_capacity(template.len());
            let mut rest = template;
            while let Some(at) = rest.find('$') {
                out.push_str(&rest[..at]);
                let digits = rest[at + 1..]
                    .bytes()
                    .take_while(u8::is_ascii_digit)
                    .count();
                let group = rest[at + 1..at + 1 + digits].parse::<usize>().ok();
                match group.and_then(|i| captures.get(i)) {
                    Some(found) => out.push_str(found.as_str()),
                    None => out.push_str(&rest[at..at + 1 + digits]),
                }
                rest = &rest[at + 1 + digits..];
            }
            out.push_str(rest);
            out
        };
        let tags = self
            .tags
            .iter()
            .map(|(key, value)| format!("{key}:{}", expand(value)))
            .collect();
        Some((expand(&self.name), tags))
    }
}

/// The first mogrifier that matches `statistic`, applied; else the name unchanged.
pub fn mogrify(mogrifiers: &[Mogrifier], statistic: &str) -> (String, Vec<String>) {
    mogrifiers
        .iter()
        .find_map(|m| m.apply(statistic))
        .unwrap_or_else(|| (statistic.to_owned(), Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_first_match_renames_and_tags() {
        let rules = env(&[
            (
                "DOG_STATSD_MOGRIFIER_RL_PATTERN",
                r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
            ),
            (
                "DOG_STATSD_MOGRIFIER_RL_NAME",
                "ratelimit.service.rate_limit.$3",
            ),
            (
                "DOG_STATSD_MOGRIFIER_RL_TAGS",
                "domain:$1,descriptor:$2,missing:$9",
            ),
        ]);
        let mogrifiers = [Mogrifier::from_env("RL", &rules).unwrap()];
        let (name, tags) = mogrify(
            &mogrifiers,
            "ratelimit.service.rate_limit.edge.user_alice.over_limit",
        );
        assert_eq!(name, "ratelimit.service.rate_limit.over_limit");
        assert_eq!(tags, ["domain:edge", "descriptor:user_alice", "missing:$9"]);
        assert_eq!(
            mogrify(&mogrifiers, "ratelimit.service.config_load_success"),
            ("ratelimit.service.config_load_success".to_owned(), vec![])
        );
    }

    #[test]
    fn incomplete_mogrifiers_name_the_variable() {
        let error =
            Mogrifier::from_env("X", &env(&[("DOG_STATSD_MOGRIFIER_X_PATTERN", "a")])).unwrap_err();
        assert!(error.contains("DOG_STATSD_MOGRIFIER_X_NAME"), "{error}");
        let error = Mogrifier::from_env(
            "X",
            &env(&[
                ("DOG_STATSD_MOGRIFIER_X_PATTERN", "("),
                ("DOG_STATSD_MOGRIFIER_X_NAME", "n"),
            ]),
        )
        .unwrap_err();
        assert!(error.contains("DOG_STATSD_MOGRIFIER_X_PATTERN"), "{error}");
    }
}
