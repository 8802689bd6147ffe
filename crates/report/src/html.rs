//! `fatpipe report --html`: one self-contained HTML file with a report's
//! plots (inline SVG) and tables, CSS inline, no scripts and nothing
//! fetched, so it opens from disk, survives being mailed, and prints.
//!
//! The page is a minijinja template (`templates/report.html`, compiled in)
//! with auto-escaping on: every text from the archive (a note, a path, a
//! host name) is escaped; only the SVG that [`crate::plot`] drew is
//! inserted as markup.

use serde::Serialize;

use crate::plot::Plot;
use crate::Table;

/// A report page.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// `<h1>` and `<title>`.
    pub title: String,
    /// The line under the title (path, link, host).
    pub subtitle: String,
    /// Plots shown first, right under the title: the runs a reader asked
    /// for by id (the demo's story: default against auto-tuned over time,
    /// the copy's progress).
    pub lead: Vec<(Plot, String)>,
    /// Name/value facts shown as a list (runs, time range, archive, host).
    pub facts: Vec<(String, String)>,
    /// Plots, in order, each with a caption under it.
    pub plots: Vec<(Plot, String)>,
    /// One run of each cell over time (its median run), after the plots.
    pub runs: Vec<(Plot, String)>,
    /// Tables, in order.
    pub tables: Vec<Table>,
    /// Where the data came from (the archive's location).
    pub source: String,
}

/// A page could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HtmlError {
    /// A plot failed to draw.
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    /// The template failed (a defect: it is compiled in).
    #[error("rendering the HTML report: {0}")]
    Template(#[from] minijinja::Error),
}

#[derive(Serialize)]
struct PlotView {
    svg: String,
    caption: String,
}

/// Renders `page` as one HTML document.
pub fn render(page: &Page) -> Result<String, HtmlError> {
    let mut env = minijinja::Environment::new();
    env.add_template("report.html", include_str!("../templates/report.html"))?;
    let views = |plots: &[(Plot, String)]| {
        plots
            .iter()
            .map(|(p, caption)| {
                Ok(PlotView {
                    svg: p.svg()?,
                    caption: caption.clone(),
                })
            })
            .collect::<Result<Vec<_>, crate::plot::PlotError>>()
    };
    let ctx = minijinja::context! {
        title => page.title,
        subtitle => page.subtitle,
        facts => page.facts,
        lead => views(&page.lead)?,
        plots => views(&page.plots)?,
        runs => views(&page.runs)?,
        tables => page.tables,
        source => page.source,
        version => env!("CARGO_PKG_VERSION"),
        made => chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
    };
    Ok(env.get_template("report.html")?.render(ctx)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::{Metric, Stat};
    use crate::plot::tests::sweep;
    use crate::plot::{line_data, Caption};

    fn page() -> Page {
        let runs = sweep();
        let p = line_data(
            &runs,
            "window",
            &["mtu".into()],
            Metric::Throughput,
            Stat::Median,
            Caption {
                title: "throughput against window".into(),
                context: String::new(),
            },
        )
        .unwrap();
        Page {
            title: "000 <Korea> & Seattle".into(),
            subtitle: "path lab:korea→seattle".into(),
            facts: vec![("runs".into(), runs.len().to_string())],
            plots: vec![(Plot::Line(p), "median and p10–p90".into())],
            lead: Vec::new(),
            runs: Vec::new(),
            tables: vec![crate::tables::cells(&runs)],
            source: "/tmp/a.sqlite".into(),
        }
    }

    #[test]
    fn a_page_is_one_file_with_inline_svg_escaped_text_and_no_scripts() {
        let html = render(&page()).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<title>000 &lt;Korea&gt; &amp; Seattle</title>"));
        assert_eq!(html.matches("<svg ").count(), 1);
        assert!(html.contains("<figcaption>median and p10–p90</figcaption>"));
        assert!(html.contains("<caption>per cell: throughput statistics"));
        assert!(!html.contains("<script"));
        // Nothing fetched: no links, images or fonts from elsewhere.
        for bad in ["src=", "href=", "url(", "@import"] {
            assert!(!html.contains(bad), "{bad} in the page");
        }
    }

    #[test]
    fn runs_asked_for_lead_the_page_and_cells_over_time_follow_the_plots() {
        let t = crate::timeseries::tests::tcp(2, 5, false);
        let c = crate::timeseries::tests::copy(true);
        let caption = |title: &str| Caption {
            title: title.into(),
            context: String::new(),
        };
        let ts = crate::timeseries::test_data(&[("lead run".into(), &t)], caption("LEAD")).unwrap();
        let cp =
            crate::timeseries::copy_data(&[("copy".into(), &c)], None, caption("CELL")).unwrap();
        let mut p = page();
        p.lead = vec![(Plot::Timeseries(ts), "the story".into())];
        p.runs = vec![(Plot::Progress(cp), "a cell over time".into())];
        let html = render(&p).unwrap();
        assert_eq!(html.matches("<svg ").count(), 3);
        let at = |s: &str| html.find(s).unwrap_or_else(|| panic!("{s} missing"));
        assert!(
            at("LEAD") < at("<dl class=\"facts\">"),
            "lead before the facts"
        );
        assert!(at("<h2>Plots</h2>") < at("<h2>Runs over time</h2>"));
        assert!(at("<h2>Runs over time</h2>") < at("CELL"));
        assert!(at("CELL") < at("<h2>Tables</h2>"));
        assert!(!html.contains("<script"));
    }
}
