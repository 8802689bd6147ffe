//! Path MTU search: which IP packet sizes pass with Don't Fragment set.
//!
//! A sans-IO state machine in the style of the protocol crate: the probe
//! client asks [`MtuSearch::poll_probe`] what size to send next, and feeds
//! back what happened with `handle_ack` (the peer echoed it),
//! `handle_timeout` (no echo in time) or `handle_too_big` (this host
//! refused to send it: larger than the local device, `EMSGSIZE`). It opens
//! no socket and reads no clock, so the search is tested with scripted
//! paths.
//!
//! The search starts at the local route MTU, because on most paths that
//! size passes and one probe settles it. Otherwise it bisects between the
//! largest size known to pass and the smallest known to fail. A size fails
//! only after `tries` probes go unanswered, so one lost probe on a lossy
//! path does not shrink the MTU; an ICMP "too big" would be faster but
//! many paths filter it (the black holes this probe exists to find).

/// Where the search stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtuSearch {
    /// Largest size that passed (or the assumed floor, unconfirmed).
    good: u32,
    /// True once `good` was actually echoed.
    confirmed: bool,
    /// Smallest size that failed; one past the upper bound before any did.
    bad: u32,
    /// Size being probed and the probes sent for it.
    current: Option<(u32, u32)>,
    /// Probes per size before it counts as failed.
    tries: u32,
    /// Probes sent in total.
    sent: u32,
}

/// Outcome of a finished search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtuResult {
    /// Largest IP packet size that passed; `None` if not even the floor did.
    pub path_mtu: Option<u32>,
    /// Probes sent.
    pub probes: u32,
}

impl MtuSearch {
    /// Searches sizes in `floor..=ceiling` (the ceiling is usually the local
    /// route MTU), giving each size `tries` probes.
    pub fn new(floor: u32, ceiling: u32, tries: u32) -> MtuSearch {
        let ceiling = ceiling.max(floor);
        MtuSearch {
            good: floor,
            confirmed: false,
            bad: ceiling.saturating_add(1),
            current: Some((ceiling, 0)),
            tries: tries.max(1),
            sent: 0,
        }
    }

    /// The size to send next, or `None` when the search is done. Each call
    /// counts as one probe sent of that size.
    pub fn poll_probe(&mut self) -> Option<u32> {
        let (size, n) = self.current?;
        if n >= self.tries {
            return None;
        }
        self.current = Some((size, n + 1));
        self.sent += 1;
        Some(size)
    }

    /// The size the search is waiting on, if any.
    pub fn pending(&self) -> Option<u32> {
        self.current.map(|(s, _)| s)
    }

    /// The peer echoed a probe of `size` (late echoes of earlier sizes count
    /// too: a size that passed, passed).
    pub fn handle_ack(&mut self, size: u32) {
        if size >= self.bad {
            // A size recorded as failing did pass after all (its echo was
            // late): trust the evidence and reopen the range above it.
            self.bad = size.saturating_add(1);
        }
        if size > self.good || (size == self.good && !self.confirmed) {
            self.good = size;
            self.confirmed = true;
        }
        if self.current.is_some_and(|(cur, _)| cur <= self.good) {
            self.next();
        }
    }

    /// The probe of `size` got no echo in time. After `tries` of them the
    /// size counts as too big.
    pub fn handle_timeout(&mut self, size: u32) {
        if let Some((cur, n)) = self.current {
            if cur == size && n >= self.tries {
                self.fail(size);
            }
        }
    }

    /// This host refused to send `size` (larger than the device allows).
    pub fn handle_too_big(&mut self, size: u32) {
        if self.current.map(|(c, _)| c) == Some(size) {
            self.fail(size);
        }
    }

    /// True when nothing is left to probe.
    pub fn is_done(&self) -> bool {
        self.current.is_none()
    }

    /// The result so far (final once [`is_done`](Self::is_done)).
    pub fn result(&self) -> MtuResult {
        MtuResult {
            path_mtu: self.confirmed.then_some(self.good),
            probes: self.sent,
        }
    }

    fn fail(&mut self, size: u32) {
        if size <= self.good {
            // Even the floor (or a size below a confirmed one) failed: the
            // path drops everything of this size; nothing smaller to try
            // unless the floor is unconfirmed and larger than this.
            self.bad = size;
            self.current = None;
            return;
        }
        self.bad = self.bad.min(size);
        self.next();
    }

    /// Picks the next size: bisect, or probe the unconfirmed floor last.
    fn next(&mut self) {
        if self.bad > self.good + 1 {
            let mid = self.good + (self.bad - self.good) / 2;
            self.current = Some((mid, 0));
        } else if !self.confirmed && self.good < self.bad {
            self.current = Some((self.good, 0));
        } else {
            self.current = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a path that passes sizes up to `mtu`, with
    /// `too_big_above` the local device limit, losing the probes for which
    /// `lose(n)` is true (n counts probes sent).
    fn run(search: &mut MtuSearch, mtu: u32, local: u32, lose: impl Fn(u32) -> bool) -> u32 {
        let mut n = 0;
        while let Some(size) = search.poll_probe() {
            n += 1;
            assert!(n < 200, "search does not end");
            if size > local {
                search.handle_too_big(size);
            } else if size <= mtu && !lose(n) {
                search.handle_ack(size);
            } else {
                search.handle_timeout(size);
            }
        }
        assert!(search.is_done());
        n
    }

    #[test]
    fn route_mtu_passes_in_one_probe() {
        let mut s = MtuSearch::new(576, 1500, 2);
        let n = run(&mut s, 1500, 1500, |_| false);
        assert_eq!(n, 1);
        assert_eq!(s.result().path_mtu, Some(1500));
    }

    #[test]
    fn black_hole_below_route_mtu_is_found_exactly() {
        for mtu in [577, 1280, 1400, 1476, 1499, 8999] {
            let mut s = MtuSearch::new(576, 9000, 2);
            run(&mut s, mtu, 9000, |_| false);
            assert_eq!(s.result().path_mtu, Some(mtu), "mtu {mtu}");
            // log2(8425) ≈ 14 sizes, two tries for the failing ones.
            assert!(s.result().probes <= 30, "{:?}", s.result());
        }
    }

    #[test]
    fn local_device_limit_fails_at_once() {
        let mut s = MtuSearch::new(576, 9000, 3);
        run(&mut s, 9000, 1500, |_| false);
        assert_eq!(s.result().path_mtu, Some(1500));
    }

    #[test]
    fn one_lost_probe_does_not_shrink_the_mtu() {
        let mut s = MtuSearch::new(576, 1500, 2);
        // The very first probe (1500) is lost; its retry passes.
        run(&mut s, 1500, 1500, |n| n == 1);
        assert_eq!(s.result().path_mtu, Some(1500));
        assert_eq!(s.result().probes, 2);
    }

    #[test]
    fn nothing_passes() {
        let mut s = MtuSearch::new(576, 1500, 2);
        run(&mut s, 0, 1500, |_| false);
        assert_eq!(s.result().path_mtu, None);
    }

    #[test]
    fn floor_equal_to_ceiling() {
        let mut s = MtuSearch::new(1280, 1280, 1);
        run(&mut s, 1500, 1500, |_| false);
        assert_eq!(s.result().path_mtu, Some(1280));
        assert_eq!(s.result().probes, 1);
    }

    #[test]
    fn late_echo_of_a_failed_size_reopens_the_range() {
        let mut s = MtuSearch::new(576, 1500, 1);
        assert_eq!(s.poll_probe(), Some(1500));
        s.handle_timeout(1500);
        let next = s.poll_probe().unwrap();
        assert!(next < 1500);
        // The 1500 echo arrives late: 1500 passes after all.
        s.handle_ack(1500);
        s.handle_ack(next);
        while let Some(size) = s.poll_probe() {
            s.handle_ack(size);
        }
        assert_eq!(s.result().path_mtu, Some(1500));
    }
}
