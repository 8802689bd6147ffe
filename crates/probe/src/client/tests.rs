//! The probe client's pure parts: the train sizer, and which phase
//! follows which.

use super::*;

fn shape() -> TrainShape {
    TrainShape {
        packet: 1500,
        payload: 1472,
        max_len: 400,
    }
}

/// The ack of a train of `n` packets all received at `rate` bit/s.
fn ack(s: &mut Sizer, n: u32, received: u32, rate: f64) {
    let span = f64::from(received - 1) * 1500.0 * 8.0 / rate * 1e9;
    s.handle_ack(&shape(), n, received, span as u64);
}

#[test]
fn a_lost_echo_is_given_up_soon_after_the_slowest_reply_not_a_second_later() {
    let sent = Instant::now();
    let ms = Duration::from_millis;
    // Fewer than half back: the caller's long deadline stands.
    assert_eq!(stragglers_given_up(&[], 5, sent), None);
    assert_eq!(stragglers_given_up(&[ms(228), ms(229)], 5, sent), None);
    // Four of five back at 228-240 ms: the fifth is lost 380 ms after
    // the last send, not at the one-second deadline.
    let by = stragglers_given_up(&[ms(228), ms(240), ms(229), ms(230)], 5, sent);
    assert_eq!(by, Some(sent + ms(380)));
    // A single echo that came back settles it.
    assert_eq!(stragglers_given_up(&[ms(10)], 1, sent), Some(sent + ms(35)));
}

#[test]
fn echo_rtt_subtracts_the_servers_hold() {
    let ms = |x: u64| x * 1_000_000;
    assert_eq!(
        echo_rtt(ms(1000), ms(1045), ms(5)),
        Some(Duration::from_millis(40))
    );
    assert_eq!(
        echo_rtt(ms(1000), ms(1040), 0),
        Some(Duration::from_millis(40))
    );
    // A hold longer than the trip is ignored, not subtracted.
    assert_eq!(
        echo_rtt(ms(1000), ms(1040), ms(50)),
        Some(Duration::from_millis(40))
    );
    // Received before sent (clock stepped back), or a minute later.
    assert_eq!(echo_rtt(ms(1000), ms(999), 0), None);
    assert_eq!(echo_rtt(0, ms(61_000), 0), None);
}

#[test]
fn trains_are_sized_to_span_4ms_at_the_rate_shown() {
    let mut s = Sizer::new(&shape());
    assert_eq!((s.len, s.measured), (FIRST_TRAIN_LEN, None));
    // Unknown rate: drain time assumes 10 Mbit/s.
    assert_eq!(s.drain(&shape(), 64), Duration::from_secs_f64(0.0768));
    ack(&mut s, 64, 64, 1e9);
    assert_eq!(s.len, 333); // 4 ms × 1 Gbit/s / 1500 B
    assert!((s.measured.unwrap() / 1e9 - 1.0).abs() < 1e-6);
    ack(&mut s, 333, 333, 200e6);
    assert_eq!(s.len, 67);
    ack(&mut s, 67, 67, 10e6);
    assert_eq!(s.len, MIN_TRAIN_LEN);
    ack(&mut s, 32, 32, 100e9);
    assert_eq!(s.len, 400, "capped by the train bytes");
}

#[test]
fn lossy_trains_shrink() {
    let mut s = Sizer::new(&shape());
    ack(&mut s, 64, 64, 1e9);
    // Half of a 333-packet train arrived: the queue holds ~166.
    ack(&mut s, 333, 166, 1e9);
    assert_eq!(s.len, 83);
    s.handle_lost_tail(&shape());
    assert_eq!(s.len, MIN_TRAIN_LEN);
    s.handle_ack(&shape(), 32, 1, 0);
    assert_eq!(s.len, MIN_TRAIN_LEN);
}

fn estimate(confidence: f64, sender_limited: bool) -> RateEstimate {
    RateEstimate {
        rate: 1e9,
        low: 0.9e9,
        high: 1.1e9,
        confidence,
        trains: 3,
        used: 3,
        outliers: 0,
        rejected: 0,
        sender_limited,
    }
}

#[test]
fn a_reverse_probe_without_its_token_asks_again_before_the_mtu_search() {
    assert_eq!(after_echoes(true, false), Phase::Token);
    assert_eq!(after_echoes(true, true), Phase::Mtu);
    assert_eq!(after_echoes(false, false), Phase::Mtu);
}

#[test]
fn rounds_go_on_while_the_trains_disagree_and_the_rounds_last() {
    let agreed = estimate(0.8, false);
    let unsure = estimate(0.2, false);
    let limited = estimate(0.2, true);
    // (round, trains so far, estimate, reverse) -> next phase
    let table: &[(u32, u32, Option<&RateEstimate>, bool, Phase)] = &[
        (0, 10, Some(&agreed), false, Phase::Done),
        (0, 10, Some(&unsure), false, Phase::Round(1)),
        (0, 10, None, false, Phase::Round(1)),
        // A sender-limited forward round gets one more chance, not two.
        (0, 10, Some(&limited), false, Phase::Round(1)),
        (1, 20, Some(&limited), false, Phase::Done),
        // The server's host limits a reverse round: no second chance.
        (0, 10, Some(&limited), true, Phase::Done),
        (0, 10, Some(&unsure), true, Phase::Round(1)),
        // The rounds and the trains run out.
        (MAX_ROUNDS - 1, 30, Some(&unsure), false, Phase::Done),
        (0, MAX_TRAINS, Some(&unsure), false, Phase::Done),
    ];
    for &(round, trains, e, reverse, want) in table {
        assert_eq!(
            after_round(round, trains, e, reverse),
            want,
            "round {round}, {trains} trains, {e:?}, reverse {reverse}"
        );
    }
}
