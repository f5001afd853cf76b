"""Batched requests' ids: the API's format, the same for the same request, new for any change."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmode.model.batch_ids import CUSTOM_ID_CHARACTERS, CUSTOM_ID_LENGTH, custom_id

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
bodies = st.dictionaries(st.text(min_size=1), json_values, max_size=6)
attempts = st.integers(min_value=0, max_value=10**7 - 1)


@given(bodies, attempts)
def test_every_id_is_one_the_api_accepts(body: dict[str, object], attempt: int) -> None:
    made = custom_id(body, attempt)
    assert 1 <= len(made) <= CUSTOM_ID_LENGTH
    assert set(made) <= CUSTOM_ID_CHARACTERS


@given(bodies, attempts)
def test_the_same_request_has_the_same_id_however_its_keys_are_ordered(
    body: dict[str, object], attempt: int
) -> None:
    reordered = dict(reversed(list(body.items())))
    assert custom_id(reordered, attempt) == custom_id(body, attempt)


@given(bodies, st.text(), json_values)
def test_a_request_that_differs_anywhere_has_another_id(
    body: dict[str, object], key: str, value: object
) -> None:
    changed = {**body, key: value}
    if changed != body:
        assert custom_id(changed) != custom_id(body)


def test_each_attempt_of_a_request_has_its_own_id() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert len({custom_id(body, attempt) for attempt in range(50)}) == 50


def test_an_attempt_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt"):
        custom_id({}, -1)
    with pytest.raises(ValueError, match="attempt"):
        custom_id({}, 10**7)
