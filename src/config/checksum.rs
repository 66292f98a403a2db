//! A checksum of rule files, to tell whether the files on disk are the ones being served.
//!
//! The rule set keeps this instead of the files' text: a reload compares checksums to skip files
//! that did not change, and `/rlconfig` and the metrics show the served and the on-disk checksum
//! side by side, so a reload that never happened is visible.

use std::fmt;

/// SHA-256 over every file's name and text, in the order given (sorted by name when read from
/// disk). Names are included so that renaming a file, which changes what errors and `/rlconfig`
/// show, is a change too. The default (all zeros) stands for no files at all.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Checksum([u8; 32]);

impl Checksum {
    /// The checksum of (file name, text) pairs.
    pub fn of(sources: &[(String, String)]) -> Checksum {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        for (name, text) in sources {
            // Length-prefixed, so that no two different lists hash the same bytes.
            for part in [name.as_bytes(), text.as_bytes()] {
                context.update(&(part.len() as u64).to_le_bytes());
                context.update(part);
            }
        }
        let mut bytes = [0; 32];
        bytes.copy_from_slice(context.finish().as_ref());
        Checksum(bytes)
    }
}

/// Lower-case hex, as `sha256sum` prints.
impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Checksum({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::Checksum;

    fn of(files: &[(&str, &str)]) -> Checksum {
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        Checksum::of(&sources)
    }

    #[test]
    fn names_and_boundaries_count() {
        assert_eq!(of(&[("a", "x")]), of(&[("a", "x")]));
        assert_ne!(of(&[("a", "x")]), of(&[("b", "x")]));
        assert_ne!(of(&[("a", "xy")]), of(&[("ax", "y")]));
        assert_ne!(of(&[("a", "x"), ("b", "")]), of(&[("a", "x")]));
        assert_eq!(of(&[]).to_string().len(), 64);
    }
}
