"""The report's Batches section: each Message Batch, its requests, state, age and agents."""

from __future__ import annotations

import time

from ..records.history import SessionHistory
from .formatting import money, seconds
from .report_html import e


def batches_section(history: SessionHistory) -> str:
    """A table of the session's batches, and what batching saved; a line when none was sent."""
    log = history.batches
    if not log:
        return (
            '<section id="batches"><h2>Batches</h2><p class="meta">No request was sent '
            "through the Message Batches API.</p></section>"
        )
    now = time.time()
    rows = []
    for batch in log.batches.values():
        state = "in-progress" if batch.ended is None else "ended"
        rows.append(
            f'<tr class="batch" data-batch="{e(batch.batch_id)}" data-state="{state}">'
            f"<td><code>{e(batch.batch_id)}</code></td>"
            f"<td>{batch.requests or '—'}</td><td>{e(batch.state)}</td>"
            f"<td>{e(seconds(batch.age(now)))}</td>"
            f'<td class="agents">{e(", ".join(batch.agents) or "—")}</td></tr>'
        )
    head = "".join(f"<th>{name}</th>" for name in ("batch", "requests", "state", "age", "agents"))
    total = history.totals.all
    summary = (
        f"{total.batched:,} of {total.requests:,} model requests batched · "
        f"{money(total.batched_cost)} paid for them · {money(total.saved)} saved"
    )
    return (
        '<section id="batches"><h2>Batches</h2>\n'
        f'<p class="meta" id="batch-savings" data-saved="{total.saved!r}">{e(summary)}</p>\n'
        f'<table class="batches"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )
