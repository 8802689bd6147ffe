//! `test --plot FILE` and `copy --plot FILE`: the run just made, drawn
//! over time from the same document `--json` prints and the archive keeps
//! (`fatpipe_report::timeseries`), so the picture and the numbers agree.
//!
//! The subtitle says what a reader of the file alone needs: the server,
//! what the pre-flight probed (RTT, bottleneck) and what was chosen.

use std::path::Path;

use fatpipe_report::plot::{Caption, Plot};
use fatpipe_report::timeseries;
use fatpipe_schema::copy::CopyReport;
use fatpipe_schema::test::{Protocol, TestReport};
use fatpipe_schema::tune::AutoTune;
use fatpipe_schema::units;

use crate::exit::usage;

/// Draws `report` over time into `file` (.svg or .png) and says where on
/// stderr (stdout may be JSON).
pub(crate) fn test(report: &TestReport, file: &Path) -> anyhow::Result<()> {
    let s = &report.start;
    let streams = match s.streams {
        1 => "1 stream".to_string(),
        n => format!("{n} streams"),
    };
    let proto = match s.protocol {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
    };
    let mut context = vec![
        format!("to {}", s.server_addr),
        format!("{proto}, {streams}"),
    ];
    if let Some(cc) = s
        .local
        .first()
        .map(|l| l.congestion.as_str())
        .filter(|c| !c.is_empty())
    {
        context.push(cc.to_string());
    }
    context.extend(probed(s.auto.as_ref()));
    let caption = Caption {
        title: format!("fatpipe test to {} over time", s.server),
        context: context.join(" · "),
    };
    let label = if s.auto.is_some() {
        format!("auto-tuned ({streams} at the start)")
    } else {
        format!("this test ({streams})")
    };
    let t = timeseries::test_data(&[(label, report)], caption).map_err(|e| usage(e.to_string()))?;
    write(&Plot::Timeseries(t), file)
}

/// Draws the copy's bytes over time into `file`.
pub(crate) fn copy(report: &CopyReport, file: &Path) -> anyhow::Result<()> {
    let mut context = vec![
        format!("to {}", report.server),
        format!("{} streams", report.streams),
        format!(
            "{} in {} file{}",
            units::format_bytes(report.bytes_transferred),
            report.files_verified,
            if report.files_verified == 1 { "" } else { "s" }
        ),
    ];
    context.extend(probed(report.auto.as_ref()));
    let caption = Caption {
        title: format!("fatpipe copy to {} over time", report.server),
        context: context.join(" · "),
    };
    let label = format!("this copy ({})", units::format_rate(report.rate as f64));
    let p = timeseries::copy_data(&[(label, report)], None, caption)
        .map_err(|e| usage(e.to_string()))?;
    write(&Plot::Progress(p), file)
}

/// `RTT 228 ms, bottleneck 1.00 Gbit/s (probed)`, when the pre-flight ran.
fn probed(auto: Option<&AutoTune>) -> Option<String> {
    let f = &auto?.facts;
    // Loopback's tens of microseconds would print as 0.0 ms.
    let ms = f.rtt_secs * 1e3;
    let rtt = if ms < 1.0 {
        format!("RTT {:.0} µs", ms * 1e3)
    } else {
        format!("RTT {ms:.1} ms")
    };
    Some(match f.bottleneck_rate {
        Some(r) => format!(
            "{rtt}, bottleneck {} (probed)",
            units::format_rate(r as f64)
        ),
        None => format!("{rtt} (probed)"),
    })
}

fn write(plot: &Plot, file: &Path) -> anyhow::Result<()> {
    super::report::write_plot(plot, file)?;
    eprintln!("fatpipe: plot written to {}", file.display());
    Ok(())
}
