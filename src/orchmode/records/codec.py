"""Events to records and back, by their one declaration in ``core/events.py``.

An event is recorded as its kind (its class name) and its fields as JSON, written and read
through one pydantic ``TypeAdapter`` per kind, so a field added to an event is recorded and
read back with no other edit. Reading is strict: ``"3"`` is not 3, ``true`` is not 1, and a
number must be finite. A field the record leaves out takes the declaration's default or
:class:`~orchmode.core.events.Absent` value; a required field missing, or any field of the
wrong type, makes the record :class:`UnreadableRecord`, which names the event and the field.
Readers of a whole run skip such a record (:func:`parse_row` gives None) and count it: an
older or newer orchmode may have written it, and one bad row must not hide the rest.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from ..core.errors import UnreadableRecord as UnreadableRecord  # what read_event raises
from ..core.events import EVENTS, Event
from ..store import EventRow

log = logging.getLogger("orchmode")

#: Every event class by the kind its records carry.
KINDS: dict[str, type[Event]] = {cls.__name__: cls for cls in EVENTS}

#: How events are read and written: no coercion, no NaN read as a number; a NaN written is
#: written as ``NaN``, as ``json.dumps`` always did.
_CONFIG = {"strict": True, "allow_inf_nan": False, "ser_json_inf_nan": "constants"}


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """The adapter that writes and reads ``cls``'s records, made on first use and kept."""
    found = _ADAPTERS.get(cls)
    if found is None:
        # pydantic takes a plain dataclass's settings from this attribute; it is set here so
        # that the core declares its events without importing pydantic.
        cls.__pydantic_config__ = _CONFIG
        found = _ADAPTERS[cls] = TypeAdapter(cls)
    return found


def event_row(seq: int, event: Event) -> EventRow:
    """The row that records ``event``: its kind and its fields as JSON."""
    written = adapter(type(event))
    try:
        data = written.dump_json(event, warnings=False).decode()
    except PydanticSerializationError:  # a value of no JSON type: recorded as its str()
        data = json.dumps(written.dump_python(event, warnings=False), default=str)
    return EventRow(seq, time.time(), type(event).__name__, data)


def read_event(kind: str, data: str | bytes) -> Event:
    """The event of ``kind`` that ``data`` records, or :class:`UnreadableRecord` saying why not."""
    cls = KINDS.get(kind)
    if cls is None:
        raise UnreadableRecord(f"an event of unknown kind {kind!r}")
    try:
        event: Event = adapter(cls).validate_json(data, strict=True)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"]) or "the record"
        raise UnreadableRecord(f"a {kind} record: {where}: {error['msg']}") from None
    return event


def parse_row(row: EventRow) -> Event | None:
    """The event a recorded row holds, or None if the row cannot be understood."""
    at = row.at
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        return None
    try:
        return read_event(row.kind, row.data)
    except UnreadableRecord as exc:
        log.debug("event row %s left out: %s", row.seq, exc)
        return None
