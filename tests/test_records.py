"""Run records: an event's row holds what ``dataclasses.asdict`` would, for every event."""

from __future__ import annotations

import dataclasses
import json
import typing

from hypothesis import given
from hypothesis import strategies as st

from orchmode.core import events
from orchmode.store.records import event_row

EVENT_CLASSES = typing.get_args(events.Event)


@given(st.one_of(*(st.from_type(cls) for cls in EVENT_CLASSES)))
def test_an_event_row_holds_the_event_as_asdict_gives_it(event: events.Event) -> None:
    row = event_row(7, event)
    expected = json.dumps(dataclasses.asdict(event), ensure_ascii=False, default=str)
    assert row.seq == 7 and row.kind == type(event).__name__
    assert json.loads(row.data) == json.loads(expected)


def test_every_event_class_is_covered() -> None:
    assert len(EVENT_CLASSES) >= 15
    assert all(dataclasses.is_dataclass(cls) for cls in EVENT_CLASSES)
