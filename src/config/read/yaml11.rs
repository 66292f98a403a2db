//! The scalars yaml.v2 (YAML 1.1) resolves where YAML 1.2 reads a string: the words for booleans
//! and the integers with a leading zero or `_` between digits.

/// yaml.v2's booleans that YAML 1.2 reads as strings.
pub(super) fn yaml11_bool(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// yaml.v2's integers that YAML 1.2 reads as strings: `_` between digits, or a leading 0
/// (octal; Go's `strconv.ParseInt(text, 0, 64)` after dropping `_`, then its float fallback,
/// which reads `09` as 9). Anything YAML 1.2 reads as a string for another reason (it was
/// quoted: `"10"`) is `None`: yaml.v2 rejects a quoted number too.
pub(super) fn yaml11_int(text: &str) -> Option<u64> {
    let plain = text.replace('_', "");
    let unsigned = plain.strip_prefix('+').unwrap_or(&plain);
    let all_digits = !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = all_digits && unsigned.len() > 1 && unsigned.starts_with('0');
    if !text.contains('_') && !leading_zero {
        return None;
    }
    let prefixed = |prefix: &str| {
        unsigned
            .strip_prefix(prefix)
            .or_else(|| unsigned.strip_prefix(&prefix.to_ascii_uppercase()))
    };
    let (digits, radix) = if let Some(hex) = prefixed("0x") {
        (hex, 16)
    } else if let Some(binary) = prefixed("0b") {
        (binary, 2)
    } else if let Some(octal) = prefixed("0o") {
        (octal, 8)
    } else if leading_zero {
        (&unsigned[1..], 8)
    } else {
        (unsigned, 10)
    };
    if digits.starts_with(['+', '-']) {
        return None;
    }
    u64::from_str_radix(digits, radix)
        .ok()
        .or_else(|| all_digits.then(|| unsigned.parse().ok()).flatten())
}

#[cfg(test)]
mod tests {
    use super::{yaml11_bool, yaml11_int};

    #[test]
    fn yaml11_integers_as_yaml_v2_reads_them() {
        assert_eq!(yaml11_int("010"), Some(8));
        assert_eq!(yaml11_int("0777"), Some(511));
        assert_eq!(yaml11_int("1_000"), Some(1000));
        assert_eq!(yaml11_int("0x_10"), Some(16));
        assert_eq!(yaml11_int("+0_10"), Some(8));
        // Go's float fallback: not octal, but a number.
        assert_eq!(yaml11_int("09"), Some(9));
        // What YAML 1.2 also reads, or a quoted number: not ours to reinterpret.
        assert_eq!(yaml11_int("10"), None);
        assert_eq!(yaml11_int("ten"), None);
        assert_eq!(yaml11_int("-1_0"), None);
        assert_eq!(yaml11_int("1_0.5"), None);
        assert_eq!(yaml11_int("0"), None);
    }

    #[test]
    fn yaml11_booleans() {
        for word in ["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"] {
            assert_eq!(yaml11_bool(word), Some(true), "{word}");
        }
        for word in ["n", "N", "no", "No", "NO", "off", "Off", "OFF"] {
            assert_eq!(yaml11_bool(word), Some(false), "{word}");
        }
        assert_eq!(yaml11_bool("true"), None);
        assert_eq!(yaml11_bool("yEs"), None);
    }
}
