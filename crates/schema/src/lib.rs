//! The numbers fatpipe shows, one way everywhere.
//!
//! Two things live here because every other crate needs both and neither
//! deserves a crate of its own:
//!
//! * [`units`]: parsing and printing of the quantities users type and read
//!   (`2M`, `1gbit`, `93ms`, `0.01%`; "941 Mbit/s", "11.6 MB").
//! * the versioned result schema (serde types) that feeds `--json`, the
//!   archive and the reports. It is documented in `docs/json-schema.md`;
//!   changing a type here is changing a public interface.

/// Gives a unit enum of the schema `as_str()`, its JSON text, and a
/// `Display` that prints the same text, from one list of variant → text.
/// The enum's serde names must say the same; each enum's test pins both.
macro_rules! json_text {
    ($ty:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            /// The JSON text of this value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod copy;
pub mod path;
pub mod test;
pub mod tune;
pub mod units;

/// What protected a session's connections (`--encrypt`): the JSON's
/// `encryption` object of `test` and `copy` (docs/json-schema.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Encryption {
    /// `"TLS 1.3"`.
    pub protocol: String,
    /// The cipher suite's IANA name, e.g. `"TLS13_AES_128_GCM_SHA256"`.
    pub suite: String,
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use serde::{Deserialize, Serialize};

    /// Serializes `v`, checks its JSON text is `text` and that `Display`
    /// prints the same without quotes, and that it reads back.
    pub(crate) fn pins<T>(v: T, text: &str)
    where
        T: Serialize + for<'de> Deserialize<'de> + fmt::Display + PartialEq + fmt::Debug,
    {
        assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{text}\""));
        assert_eq!(v.to_string(), text);
        let back: T = serde_json::from_str(&format!("\"{text}\"")).unwrap();
        assert_eq!(back, v);
    }
}
