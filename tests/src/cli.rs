//! The command lines of the tools in `src/bin` (bench, bench-tail, the mock
//! upstream): `--flag value` pairs, with the tool's usage on every error.

use std::fmt::Display;
use std::str::FromStr;

/// The `--flag value` pairs of a command line, in order. `-h` / `--help`, or
/// a flag without its value, is an error that carries `usage`.
pub fn flag_values(
    args: impl IntoIterator<Item = String>,
    usage: &str,
) -> Result<Vec<(String, String)>, String> {
    let mut args = args.into_iter();
    let mut pairs = Vec::new();
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(usage.to_string());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{usage}"))?;
        pairs.push((flag, value));
    }
    Ok(pairs)
}

/// `value`, given for `flag`, as a `T`; the error names both.
pub fn parse<T>(flag: &str, value: &str, usage: &str) -> Result<T, String>
where
    T: FromStr,
    T::Err: Display,
{
    value
        .parse()
        .map_err(|e| format!("{flag} {value}: {e}\n{usage}"))
}

/// The error for a flag the tool does not know.
pub fn unknown(flag: &str, usage: &str) -> String {
    format!("unknown flag {flag}\n{usage}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pairs_flags_with_values_and_refuses_the_rest() {
        assert_eq!(
            flag_values(args(&["--a", "1", "--b", "x"]), "U"),
            Ok(vec![("--a".into(), "1".into()), ("--b".into(), "x".into())])
        );
        assert_eq!(flag_values(args(&["--help"]), "U"), Err("U".into()));
        assert_eq!(
            flag_values(args(&["--a"]), "U"),
            Err("--a needs a value\nU".into())
        );
        assert_eq!(parse::<u32>("--n", "7", "U"), Ok(7));
        assert!(parse::<u32>("--n", "-1", "U")
            .unwrap_err()
            .starts_with("--n -1: "));
    }
}
