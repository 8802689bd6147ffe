//! Down-time: the link takes nothing in during a window (`lab set --down 5s`).
//!
//! A cut fibre loses what is sent while it is cut; what was already queued
//! or in flight before the cut still arrives. The window is absolute (on the
//! driver's clock) so a change of other parameters does not extend it.

use super::{DirConfig, DropReason, Nanos, Segment, Stage, Verdict};

/// Drops every segment that arrives inside the down window.
#[derive(Debug, Default)]
pub struct Outage {
    window: Option<(Nanos, Nanos)>,
}

impl Stage for Outage {
    fn process(&mut self, seg: &mut Segment) -> Verdict {
        match self.window {
            Some((start, end)) if seg.at >= start && seg.at < end => {
                Verdict::Drop(DropReason::Down)
            }
            _ => Verdict::Pass,
        }
    }

    fn configure(&mut self, cfg: &DirConfig) {
        self.window = cfg.down;
    }
}
