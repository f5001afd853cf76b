"""The mode-notice state machine against an independent reference model of SPEC section 2."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.core.mode import ModeState, Notice

# An event is ("set", bool) or ("turn", None).
events = st.lists(
    st.one_of(st.tuples(st.just("set"), st.booleans()), st.tuples(st.just("turn"), st.none())),
    max_size=60,
)


def reference(start_on: bool, every: int, script: list[tuple[str, bool | None]]) -> list[list[str]]:
    """What the model should be told, phrased as 'what does the model currently believe'."""
    actual = start_on
    believed_on = False  # has the model been told the mode is on (and not told it is off since)?
    since_on_notice = 0
    out: list[list[str]] = []
    for kind, value in script:
        if kind == "set":
            actual = bool(value)
            continue
        notices: list[str] = []
        if not actual and believed_on:
            notices.append("exit")
            believed_on = False
        if actual and not believed_on:
            notices.append("enter")
            believed_on = True
            since_on_notice = 0
        elif actual and since_on_notice >= every:
            notices.append("refresh")
            since_on_notice = 0
        since_on_notice += 1
        out.append(notices)
    return out


def drive(state: ModeState, script: list[tuple[str, bool | None]]) -> list[list[str]]:
    out = []
    for kind, value in script:
        if kind == "set":
            state.set_mode(bool(value))
        else:
            out.append([n.value for n in state.user_turn()])
    return out


@settings(max_examples=400)
@given(start_on=st.booleans(), every=st.integers(1, 5), script=events)
def test_notices_match_the_reference_model(
    start_on: bool, every: int, script: list[tuple[str, bool | None]]
) -> None:
    state = ModeState(mode_on=start_on, refresh_every=every)
    assert drive(state, script) == reference(start_on, every, script)


@given(script=events)
def test_at_most_one_notice_per_turn_and_never_exit_without_enter(
    script: list[tuple[str, bool | None]],
) -> None:
    told_on = False
    for notices in drive(ModeState(), script):
        assert len(notices) <= 1
        for notice in notices:
            if notice == "exit":
                assert told_on
                told_on = False
            elif notice == "enter":
                assert not told_on
                told_on = True
            else:
                assert told_on


def test_refresher_goes_out_on_the_eleventh_user_turn() -> None:
    state = ModeState(refresh_every=10)
    turns = [state.user_turn() for _ in range(31)]
    sent = {i + 1: n for i, n in enumerate(turns) if n}
    assert sent == {
        1: [Notice.ENTER],
        11: [Notice.REFRESH],
        21: [Notice.REFRESH],
        31: [Notice.REFRESH],
    }


def test_switching_off_before_any_turn_sends_nothing() -> None:
    state = ModeState()
    state.set_mode(False)
    assert state.user_turn() == []


def test_off_then_on_between_turns_sends_no_notice() -> None:
    state = ModeState()
    assert state.user_turn() == [Notice.ENTER]
    state.set_mode(False)
    state.set_mode(True)
    assert state.user_turn() == []


def test_exit_then_enter_again() -> None:
    state = ModeState()
    state.user_turn()
    state.set_mode(False)
    assert state.user_turn() == [Notice.EXIT]
    assert state.user_turn() == []
    state.set_mode(True)
    assert state.user_turn() == [Notice.ENTER]
