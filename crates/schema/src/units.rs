//! Parsing and formatting of sizes, rates, durations and probabilities.
//!
//! Conventions (shared/DESIGN.md, "Conventions users expect"):
//!
//! * Sizes are bytes. A bare suffix `K`, `M`, `G`, `T` and the explicit
//!   `KiB`..`TiB` are powers of 1024 (as iperf3 and dd users expect from
//!   `-w 2M`); `KB`, `MB`, `GB`, `TB` are powers of 1000.
//! * Rates are bits per second with SI prefixes only (`1gbit`, `500M`,
//!   `10Gbit/s`, `2.5g`): link rates are never binary.
//! * Durations take `ns`, `us`, `ms`, `s`, `m`, `h`; a bare number is seconds.
//! * Probabilities take `0.01%`, `1e-4` or `0.0001`.
//!
//! Every parser returns a [`UnitError`] that names the offending text, so the
//! binary can print one clear line.

use std::time::Duration;

/// A quantity the user typed could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} '{text}': {why}")]
pub struct UnitError {
    /// What was being parsed ("size", "rate", ...).
    pub kind: &'static str,
    /// The text as the user typed it.
    pub text: String,
    /// What to do instead.
    pub why: &'static str,
}

fn err(kind: &'static str, text: &str, why: &'static str) -> UnitError {
    UnitError {
        kind,
        text: text.to_string(),
        why,
    }
}

/// Splits "12.5Mbit" into (12.5, "Mbit"); rejects negative, NaN and empty.
fn split_number<'a>(kind: &'static str, text: &'a str) -> Result<(f64, &'a str), UnitError> {
    let t = text.trim();
    let end = t
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit()
                || c == '.'
                || ((c == 'e' || c == 'E')
                    && t[i + 1..]
                        .starts_with(|d: char| d.is_ascii_digit() || d == '-' || d == '+'))
                || ((c == '-' || c == '+') && i > 0 && t[..i].ends_with(['e', 'E'])))
        })
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(end);
    if num.is_empty() {
        return Err(err(kind, text, "expected a number first"));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| err(kind, text, "the number is malformed"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(err(kind, text, "must be a finite, non-negative number"));
    }
    Ok((value, suffix.trim()))
}

/// Parses a byte size: `65536`, `512K`, `2M`, `1GiB`, `16MB`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let (v, suffix) = split_number("size", text)?;
    let mult: f64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(err(
                "size",
                text,
                "use bytes with K, M, G, T (powers of 1024) or KB, MB, GB (powers of 1000)",
            ))
        }
    };
    let bytes = (v * mult).round();
    if bytes > u64::MAX as f64 {
        return Err(err("size", text, "too large"));
    }
    Ok(bytes as u64)
}

/// Parses a rate in bits per second: `1gbit`, `500M`, `10Gbit/s`, `2.5g`, `1e9`.
pub fn parse_rate(text: &str) -> Result<u64, UnitError> {
    let (v, suffix) = split_number("rate", text)?;
    let s = suffix.to_ascii_lowercase();
    let s = s
        .strip_suffix("/s")
        .or_else(|| s.strip_suffix("ps"))
        .unwrap_or(&s);
    let s = s
        .strip_suffix("bits")
        .or_else(|| s.strip_suffix("bit"))
        .or_else(|| s.strip_suffix('b'))
        .unwrap_or(s);
    let mult = match s {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => {
            return Err(err(
                "rate",
                text,
                "use bits per second with k, m, g or t, e.g. 1gbit or 500M",
            ))
        }
    };
    let bps = (v * mult).round();
    if bps > u64::MAX as f64 {
        return Err(err("rate", text, "too large"));
    }
    Ok(bps as u64)
}

/// Parses a duration: `93ms`, `30s`, `1.5s`, `250us`, `2m`, `1h`; bare = seconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let (v, suffix) = split_number("duration", text)?;
    let secs = match suffix.to_ascii_lowercase().as_str() {
        "" | "s" | "sec" => v,
        "ms" => v / 1e3,
        "us" | "µs" => v / 1e6,
        "ns" => v / 1e9,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => {
            return Err(err(
                "duration",
                text,
                "use a number with ns, us, ms, s, m or h, e.g. 93ms or 30s",
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| err("duration", text, "too large"))
}

/// Parses a probability: `0.01%`, `1e-4`, `0.0001`. Must lie in [0, 1].
pub fn parse_probability(text: &str) -> Result<f64, UnitError> {
    let (v, suffix) = split_number("probability", text)?;
    let p = match suffix {
        "" => v,
        "%" => v / 100.0,
        _ => return Err(err("probability", text, "use 0.01%, 1e-4 or 0.0001")),
    };
    if p > 1.0 {
        return Err(err("probability", text, "must be at most 1 (100%)"));
    }
    Ok(p)
}

/// Picks an SI prefix so that the mantissa lies in [1, 1000) and prints 3
/// significant digits: 941_000_000 → "941 M", 9_170_000_000 → "9.17 G".
fn si(value: f64) -> (String, &'static str) {
    const PREFIXES: [&str; 5] = ["", "k", "M", "G", "T"];
    let mut v = value;
    let mut i = 0;
    while v.abs() >= 999.5 && i + 1 < PREFIXES.len() {
        v /= 1000.0;
        i += 1;
    }
    let digits = if v == 0.0 || v.abs() >= 99.95 {
        0
    } else if v.abs() >= 9.995 {
        1
    } else {
        2
    };
    (format!("{v:.digits$}"), PREFIXES[i])
}

/// Formats bits per second: "941 Mbit/s", "24.6 Gbit/s", "0 bit/s".
pub fn format_rate(bits_per_sec: f64) -> String {
    let (n, p) = si(bits_per_sec);
    format!("{n} {p}bit/s")
}

/// Formats a packet rate with SI prefixes: "3.71 Mpps", "850 kpps".
pub fn format_packet_rate(packets_per_sec: f64) -> String {
    let (n, p) = si(packets_per_sec);
    format!("{n} {p}pps")
}

/// Formats a byte count with SI prefixes: "11.6 MB", "2.00 GB", "512 B".
pub fn format_bytes(bytes: u64) -> String {
    let (n, p) = si(bytes as f64);
    format!("{n} {p}B")
}

/// Formats a byte count with IEC prefixes, used for buffer sizes the user set
/// in powers of two: "4 MiB", "208 KiB", "1.5 GiB".
pub fn format_bytes_iec(bytes: u64) -> String {
    const PREFIXES: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < PREFIXES.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", PREFIXES[i])
    } else {
        format!("{v:.1} {}", PREFIXES[i])
    }
}

/// Formats a duration the way users type them: "93.0 ms", "1.50 s", "250 us".
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} us", s * 1e6)
    }
}

/// Bandwidth-delay product in bytes for a rate in bit/s and a round trip.
pub fn bdp_bytes(bits_per_sec: u64, rtt: Duration) -> u64 {
    ((bits_per_sec as f64 / 8.0) * rtt.as_secs_f64()).round() as u64
}

/// Prints a loss probability as a percentage with the digits it needs.
pub fn format_loss(p: f64) -> String {
    let pct = p * 100.0;
    let s = if pct >= 1.0 {
        format!("{pct:.1}")
    } else {
        // Enough decimals to show two significant digits.
        let decimals = (-pct.log10()).ceil().max(0.0) as usize + 1;
        format!("{pct:.decimals$}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases = [
            ("65536", 65536),
            ("512K", 512 * 1024),
            ("2M", 2 << 20),
            ("2m", 2 << 20),
            ("1GiB", 1 << 30),
            ("1.5G", 3 << 29),
            ("16MB", 16_000_000),
            ("4 KiB", 4096),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for bad in ["", "M", "-1K", "2X", "nan", "1e400"] {
            assert!(parse_size(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn rates() {
        let cases = [
            ("1gbit", 1_000_000_000),
            ("500M", 500_000_000),
            ("10Gbit/s", 10_000_000_000),
            ("2.5g", 2_500_000_000),
            ("1e9", 1_000_000_000),
            ("100mbps", 100_000_000),
            ("64kbit", 64_000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_rate(text), Ok(want), "{text}");
        }
        assert!(parse_rate("1gbyte").is_err());
    }

    #[test]
    fn durations() {
        let cases = [
            ("93ms", Duration::from_millis(93)),
            ("30s", Duration::from_secs(30)),
            ("30", Duration::from_secs(30)),
            ("1.5s", Duration::from_millis(1500)),
            ("250us", Duration::from_micros(250)),
            ("2m", Duration::from_secs(120)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn probabilities() {
        assert_eq!(parse_probability("0.01%"), Ok(0.0001));
        assert_eq!(parse_probability("1e-4"), Ok(0.0001));
        assert_eq!(parse_probability("1E-6"), Ok(0.000001));
        assert_eq!(parse_probability("0"), Ok(0.0));
        assert!(parse_probability("150%").is_err());
        assert!(parse_probability("2").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_rate(941e6), "941 Mbit/s");
        assert_eq!(format_rate(24.6e9), "24.6 Gbit/s");
        assert_eq!(format_rate(9.17e9), "9.17 Gbit/s");
        assert_eq!(format_packet_rate(3.71e6), "3.71 Mpps");
        assert_eq!(format_packet_rate(85_000.0), "85.0 kpps");
        assert_eq!(format_rate(0.0), "0 bit/s");
        assert_eq!(format_rate(999.7e6), "1.00 Gbit/s");
        assert_eq!(format_bytes(11_625_000), "11.6 MB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes_iec(4 << 20), "4 MiB");
        assert_eq!(format_bytes_iec(212_992), "208 KiB");
        assert_eq!(format_bytes_iec(3 << 29), "1.5 GiB");
        assert_eq!(format_duration(Duration::from_millis(93)), "93.0 ms");
    }

    #[test]
    fn bdp() {
        // The facts DESIGN.md rests on.
        assert_eq!(
            bdp_bytes(1_000_000_000, Duration::from_millis(228)),
            28_500_000
        );
        assert_eq!(
            bdp_bytes(10_000_000_000, Duration::from_millis(93)),
            116_250_000
        );
    }
}
