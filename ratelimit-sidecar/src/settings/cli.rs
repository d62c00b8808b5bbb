//! Go-style flags for the command-line tools (`-domain x`, `--domain=x`), so scripts
//! written for envoyproxy/ratelimit's tools keep working.

/// The flags that ask for the usage.
const HELP: [&str; 2] = ["h", "help"];

/// Parsed flags, in order.
#[derive(Debug, Default)]
pub struct Flags(Vec<(String, String)>);

impl Flags {
    /// Parses `args`. `switches` are the flags that take no value; `-h` and `-help` (or
    /// `--help`) are switches too, asking for the usage ([`Flags::wants_help`]).
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
    ) -> Result<Flags, String> {
        let mut flags = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                return Err(format!("unexpected argument '{arg}'"));
            };
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name.to_owned(), value.to_owned()),
                None if switches.contains(&flag) || HELP.contains(&flag) => {
                    (flag.to_owned(), "true".to_owned())
                }
                None => {
                    let value = args
                        .next()
                        .ok_or_else(|| format!("flag needs an argument: -{flag}"))?;
                    (flag.to_owned(), value)
                }
            };
            flags.push((name, value));
        }
        Ok(Flags(flags))
    }

    /// Whether `-h`, `-help` or `--help` was given.
    pub fn wants_help(&self) -> bool {
        HELP.iter().any(|flag| self.get(flag).is_some())
    }

    /// The last value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`, in order.
    pub fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first flag not in `known`.
    pub fn unknown(&self, known: &[&str]) -> Option<&str> {
        self.0
            .iter()
            .map(|(n, _)| n.as_str())
            .find(|n| !known.contains(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_flags() {
        let args = [
            "-domain",
            "d",
            "--descriptors=a=1,b=2",
            "-descriptors",
            "c=3",
            "-merge",
        ];
        let flags = Flags::parse(args.map(String::from), &["merge"]).unwrap();
        assert_eq!(flags.get("domain"), Some("d"));
        assert_eq!(
            flags.all("descriptors").collect::<Vec<_>>(),
            ["a=1,b=2", "c=3"]
        );
        assert_eq!(flags.get("merge"), Some("true"));
        assert_eq!(flags.unknown(&["domain", "descriptors", "merge"]), None);
        assert!(Flags::parse(["-domain".to_owned()], &[]).is_err());
        assert!(Flags::parse(["loose".to_owned()], &[]).is_err());
        assert!(!flags.wants_help());
        for help in ["-h", "-help", "--help"] {
            let flags = Flags::parse([help.to_owned(), "-domain".to_owned(), "d".to_owned()], &[]);
            assert!(flags.unwrap().wants_help(), "{help}");
        }
    }
}
