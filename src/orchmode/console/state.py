"""What every request of one console shares: its settings, store, secret and started runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse

from ..core.settings import Settings
from ..store import Store
from .auth import Access
from .control import Runs
from .runs import HistoryCache
from .templates_env import environment, render


@dataclass
class Console:
    """One server's state; the store opens with the app and closes with it."""

    settings: Settings
    workdir: Path
    access: Access = field(default_factory=Access)
    store: Store | None = None
    cache: HistoryCache = field(default_factory=HistoryCache)

    def __post_init__(self) -> None:
        self.store_url = self.settings.store_url(self.workdir)
        self.runs = Runs(self.store_url)
        self.templates = environment()

    def opened(self) -> Store:
        assert self.store is not None, "the console's store opens with the app"
        return self.store

    async def page(self, request: Request, name: str, **values: object) -> HTMLResponse:
        """A console page, with what every page shows: the store, the waiting count, and a
        message a POST left for it (escaped like everything else)."""
        waiting = len(await self.opened().approvals(None))
        said, error = request.query_params.get("said"), request.query_params.get("error")
        html = render(
            self.templates, name, store=self.opened().location, waiting=waiting,
            csrf=self.access.csrf, message=error or said or "",
            message_kind="error" if error else "", **values,
        )  # fmt: skip
        return HTMLResponse(html)


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def back(path: str, **message: str) -> RedirectResponse:
    """After a POST, to the page it came from with what happened (Post/Redirect/Get)."""
    return RedirectResponse(f"{path}?{urlencode(message)}", 303)
