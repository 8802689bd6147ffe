//! `fatpipe report`: statistics and tables over the archive.
//!
//! Input is what the archive's `measurements` query returns (the query
//! columns of each run, no JSON), so a report over 100,000 runs reads no
//! result documents. Out come [`Table`]s, rendered as aligned text,
//! markdown, CSV or JSON ([`Format`]):
//!
//! - [`tables::cells`]: one row per cell with every statistic the seeds
//!   quote (n, min, p10, median, mean, p90, max, standard deviation of the
//!   throughput; retransmits; RTT min/avg/max/std; loss and jitter; CPU at
//!   both ends);
//! - [`tables::pivot`]: one measure as a grid of two parameters (window ×
//!   MTU), one grid per value of the split parameters (one per protocol),
//!   the shape of the seeds' own tables;
//! - [`tables::seed`]: each figure a source document quotes beside the
//!   same statistic of fatpipe's runs.
//!
//! One run over time (its intervals, a copy's progress, several runs
//! overlaid, CDFs) is drawn from its result document by [`timeseries`].
//!
//! A cell's parameters come from its key (the sweep stores canonical JSON
//! of them), so any parameter of a sweep can be a row, a column or a split.

pub mod html;
pub mod metric;
pub mod plot;
pub mod runs;
pub mod tables;
pub mod timeseries;

use serde::Serialize;

/// A titled table of text cells, with the numbers behind them for JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// What it shows (`throughput (median), window × mtu, protocol=tcp`).
    pub title: String,
    /// Column headings.
    pub header: Vec<String>,
    /// Rows of formatted cells, as long as the header.
    pub rows: Vec<Vec<String>>,
    /// The same rows as numbers in base units where a cell is a number
    /// (bit/s, µs, percent), `None` where it is text or empty.
    pub values: Vec<Vec<Option<f64>>>,
    /// Lines said under the table (what was pooled, what is missing).
    pub notes: Vec<String>,
}

/// How tables are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for a terminal.
    Text,
    /// GitHub-flavoured markdown tables.
    Markdown,
    /// RFC 4180 CSV, one header line per table, tables separated by a
    /// blank line.
    Csv,
    /// One JSON document: `{"schema": "fatpipe.report", "tables": [...]}`.
    Json,
}

/// The JSON document's schema name.
pub const REPORT_SCHEMA: &str = "fatpipe.report";
/// The JSON document's version.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

impl Format {
    /// Parses `text`, `markdown` (`md`), `csv` or `json`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "text" => Some(Format::Text),
            "markdown" | "md" => Some(Format::Markdown),
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// Renders `tables` in `format`, `heading` first where the format has room
/// for it.
pub fn render(heading: &str, tables: &[Table], format: Format) -> String {
    let mut out = String::new();
    match format {
        Format::Text => {
            if !heading.is_empty() {
                out.push_str(heading);
                out.push_str("\n\n");
            }
            for t in tables {
                out.push_str(&t.title);
                out.push('\n');
                text_table(&mut out, t);
                for n in &t.notes {
                    out.push_str("  ");
                    out.push_str(n);
                    out.push('\n');
                }
                out.push('\n');
            }
        }
        Format::Markdown => {
            if !heading.is_empty() {
                out.push_str(&format!("# {heading}\n\n"));
            }
            for t in tables {
                out.push_str(&format!("## {}\n\n", t.title));
                let esc = |s: &str| s.replace('|', "\\|");
                out.push_str(&format!(
                    "| {} |\n",
                    t.header
                        .iter()
                        .map(|h| esc(h))
                        .collect::<Vec<_>>()
                        .join(" | ")
                ));
                out.push_str(&format!(
                    "|{}|\n",
                    t.header
                        .iter()
                        .enumerate()
                        .map(|(i, _)| if i == 0 { "---" } else { "---:" })
                        .collect::<Vec<_>>()
                        .join("|")
                ));
                for r in &t.rows {
                    out.push_str(&format!(
                        "| {} |\n",
                        r.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
                    ));
                }
                for n in &t.notes {
                    out.push_str(&format!("\n{n}\n"));
                }
                out.push('\n');
            }
        }
        Format::Csv => {
            for (i, t) in tables.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                csv_line(
                    &mut out,
                    std::iter::once("table").chain(t.header.iter().map(String::as_str)),
                );
                for r in &t.rows {
                    csv_line(
                        &mut out,
                        std::iter::once(t.title.as_str()).chain(r.iter().map(String::as_str)),
                    );
                }
            }
        }
        Format::Json => {
            #[derive(Serialize)]
            struct Doc<'a> {
                schema: &'static str,
                version: u32,
                heading: &'a str,
                tables: &'a [Table],
            }
            let doc = Doc {
                schema: REPORT_SCHEMA,
                version: REPORT_SCHEMA_VERSION,
                heading,
                tables,
            };
            out = serde_json::to_string_pretty(&doc)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            out.push('\n');
        }
    }
    out
}

fn text_table(out: &mut String, t: &Table) {
    let cols = t.header.len();
    let mut width = vec![0usize; cols];
    for r in std::iter::once(&t.header).chain(t.rows.iter()) {
        for (i, c) in r.iter().enumerate().take(cols) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |out: &mut String, r: &[String]| {
        out.push(' ');
        for (i, c) in r.iter().enumerate().take(cols) {
            let pad = width[i] - c.chars().count();
            out.push_str("  ");
            if i == 0 {
                out.push_str(c);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(c);
            }
        }
        // No trailing blanks.
        while out.ends_with(' ') {
            out.pop();
        }
        out.push('\n');
    };
    line(out, &t.header);
    for r in &t.rows {
        line(out, r);
    }
}

fn csv_line<'a>(out: &mut String, cells: impl Iterator<Item = &'a str>) {
    let quoted: Vec<String> = cells
        .map(|c| {
            if c.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", c.replace('"', "\"\""))
            } else {
                c.to_string()
            }
        })
        .collect();
    out.push_str(&quoted.join(","));
    out.push_str("\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Table {
        Table {
            title: "throughput (median)".into(),
            header: vec!["window".into(), "1500".into(), "9000".into()],
            rows: vec![
                vec!["64K".into(), "2.2 Mbit/s".into(), "2.3 Mbit/s".into()],
                vec!["256M".into(), "780 Mbit/s".into(), "a,\"b\"".into()],
            ],
            values: vec![vec![None, Some(2.2e6), Some(2.3e6)]; 2],
            notes: vec!["pooled over: streams".into()],
        }
    }

    #[test]
    fn text_aligns_numbers_right_and_labels_left() {
        let s = render("", &[t()], Format::Text);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "throughput (median)");
        assert_eq!(lines[1], "   window        1500        9000");
        assert_eq!(lines[2], "   64K     2.2 Mbit/s  2.3 Mbit/s");
        assert_eq!(lines[4], "  pooled over: streams");
    }

    #[test]
    fn markdown_and_csv_escape_what_they_must() {
        let md = render("h", &[t()], Format::Markdown);
        assert!(
            md.contains("| window | 1500 | 9000 |\n|---|---:|---:|\n"),
            "{md}"
        );
        let csv = render("", &[t()], Format::Csv);
        assert!(csv.starts_with("table,window,1500,9000\r\n"));
        assert!(csv.contains(",\"a,\"\"b\"\"\"\r\n"), "{csv}");
    }

    #[test]
    fn json_is_one_document_with_the_numbers() {
        let j = render("h", &[t()], Format::Json);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["schema"], "fatpipe.report");
        assert_eq!(v["tables"][0]["values"][0][1], 2.2e6);
    }
}
