//! `cniVersion` handling: the versions ipkeep speaks and Go's `version.ParseVersion` rules.

/// Every CNI specification version ipkeep supports, oldest first.
pub const SUPPORTED: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest supported version (reported by VERSION).
pub const CURRENT: &str = "1.1.0";

/// Go's `strconv.Atoi` with its error text.
fn atoi(s: &str) -> Result<i64, String> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.Atoi: parsing {}: invalid syntax",
            crate::gojson::go_quote(s)
        ));
    }
    s.parse::<i64>().map_err(|_| {
        format!(
            "strconv.Atoi: parsing {}: value out of range",
            crate::gojson::go_quote(s)
        )
    })
}

/// Go's `version.ParseVersion`: `""` is 0.1.0, up to three dot-separated integers.
pub fn parse(version: &str) -> Result<(i64, i64, i64), String> {
    if version.is_empty() {
        return Ok((0, 1, 0));
    }
    let parts: Vec<&str> = version.split('.').collect();
    if parts.len() >= 4 {
        return Err(format!(
            "invalid version {}: too many parts",
            crate::gojson::go_quote(version)
        ));
    }
    let part = |i: usize, name: &str| -> Result<i64, String> {
        match parts.get(i) {
            None => Ok(0),
            Some(p) => atoi(p).map_err(|e| {
                format!(
                    "failed to convert {name} version part {}: {e}",
                    crate::gojson::go_quote(p)
                )
            }),
        }
    };
    Ok((part(0, "major")?, part(1, "minor")?, part(2, "micro")?))
}

/// Go's `version.GreaterThanOrEqualTo(a, b)`.
pub fn at_least(a: &str, b: &str) -> Result<bool, String> {
    Ok(parse(a)? >= parse(b)?)
}

/// Whether `version` is exactly one of [`SUPPORTED`] (the CNI library's reconciler check).
pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// The `details` text of an "incompatible CNI versions" error.
pub fn incompatible_details(config: &str) -> String {
    let list: Vec<String> = SUPPORTED
        .iter()
        .map(|v| crate::gojson::go_quote(v))
        .collect();
    format!(
        "config is {}, plugin supports [{}]",
        crate::gojson::go_quote(config),
        list.join(" ")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parse_table() {
        type Case<'a> = (&'a str, Result<(i64, i64, i64), &'a str>);
        let cases: &[Case] = &[
            ("", Ok((0, 1, 0))),
            ("1", Ok((1, 0, 0))),
            ("1.1", Ok((1, 1, 0))),
            ("0.3.1", Ok((0, 3, 1))),
            ("+1.-2.3", Ok((1, -2, 3))),
            (
                "1.2.3.4",
                Err("invalid version \"1.2.3.4\": too many parts"),
            ),
            (
                "a.b",
                Err(
                    "failed to convert major version part \"a\": strconv.Atoi: parsing \"a\": invalid syntax",
                ),
            ),
            (
                "1..2",
                Err(
                    "failed to convert minor version part \"\": strconv.Atoi: parsing \"\": invalid syntax",
                ),
            ),
            (
                "1.0.x",
                Err(
                    "failed to convert micro version part \"x\": strconv.Atoi: parsing \"x\": invalid syntax",
                ),
            ),
            (
                "99999999999999999999",
                Err(
                    "failed to convert major version part \"99999999999999999999\": strconv.Atoi: parsing \"99999999999999999999\": value out of range",
                ),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), want.map_err(str::to_owned), "{input:?}");
        }
    }

    #[test]
    fn comparisons_and_support() {
        assert!(at_least("0.4.0", "0.4.0").unwrap());
        assert!(!at_least("", "0.3.0").unwrap());
        assert!(at_least("1.1.0", "1.0.0").unwrap());
        assert!(is_supported("1.1.0") && !is_supported("1.0") && !is_supported(""));
        assert_eq!(
            incompatible_details("9.9.9"),
            r#"config is "9.9.9", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#
        );
    }
}
