"""The test-only timer overrides (``GSYNC_TEST_TIMERS`` / ``GSYNC_TEST_TIME_SCALE``)."""
import pytest

from gsync import constants


def test_no_environment_means_no_override():
    assert constants._test_timers({}) == {}


def test_named_timers_are_replaced_and_nothing_else():
    got = constants._test_timers({"GSYNC_TEST_TIMERS": "policy_probe_secs=5, RATE_LIMIT_COOLDOWN_SECS=2.5"})
    assert got == {"POLICY_PROBE_SECS": 5.0, "RATE_LIMIT_COOLDOWN_SECS": 2.5}


def test_a_scale_multiplies_every_timer_and_a_named_one_wins():
    got = constants._test_timers({"GSYNC_TEST_TIME_SCALE": "0.5", "GSYNC_TEST_TIMERS": "DAILY_MIN_SECS=7"})
    assert got["RATE_LIMIT_COOLDOWN_SECS"] == constants.RATE_LIMIT_COOLDOWN_SECS * 0.5
    assert got["DAILY_MIN_SECS"] == 7
    assert set(got) == set(constants.TEST_TIMER_NAMES)


@pytest.mark.parametrize("env", [
    {"GSYNC_TEST_TIMERS": "RECONNECT_OVERLAP_SECS=1"},  # an overlap, not a timer
    {"GSYNC_TEST_TIMERS": "NO_SUCH_TIMER=1"},
    {"GSYNC_TEST_TIMERS": "POLICY_PROBE_SECS"},
    {"GSYNC_TEST_TIME_SCALE": "2"},
])
def test_anything_else_is_an_error_not_a_silent_real_wait(env):
    with pytest.raises(ValueError):
        constants._test_timers(env)


def test_every_named_timer_exists():
    for name in constants.TEST_TIMER_NAMES:
        assert isinstance(getattr(constants, name), (int, float)), name
