from tiered.backoff import Backoff


def test_doubles_up_to_the_cap() -> None:
    backoff = Backoff(0.05, 0.3)
    assert [backoff.next_s() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]


def test_a_wait_is_cut_to_what_remains_and_the_sequence_still_doubles() -> None:
    backoff = Backoff(1.0, 8.0)
    assert backoff.next_s(remaining_s=0.25) == 0.25
    assert backoff.next_s() == 2.0
