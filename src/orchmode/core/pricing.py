"""What models cost and how much they hold: per-model prices and context windows.

The price defaults are Anthropic's published list prices for current models (5-minute
cache writes), in US dollars per million tokens; a different or newer price goes in
``orchmode.toml`` under ``[prices."model-id"]``. Web search is billed per use besides the
tokens (``web_search``, dollars per thousand searches); web fetch only by its tokens.
Context windows are in tokens; the ``context_window`` setting overrides the table for the
model in use.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .events import TokenUsage

#: What a batched request costs against the same request sent interactively.
BATCH_SHARE = 0.5
#: Anthropic's list price of a thousand web searches, in dollars.
WEB_SEARCH_PER_THOUSAND = 10.0


class ModelPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    #: Writes kept in the cache for an hour (``ttl: "1h"``, as a batched request's prefix
    #: is); default: twice ``input``, the API's rate.
    cache_write_1h: float | None = Field(default=None, ge=0)
    #: Dollars per thousand web searches (the server tool ``web_search``), at every model.
    web_search: float = Field(default=WEB_SEARCH_PER_THOUSAND, ge=0)

    @property
    def hour_write(self) -> float:
        return self.input * 2 if self.cache_write_1h is None else self.cache_write_1h

    def cost(self, usage: TokenUsage) -> float:
        """Dollars for one request's usage."""
        hour = min(usage.cache_write_1h_tokens, usage.cache_write_tokens)
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + (usage.cache_write_tokens - hour) * self.cache_write
            + hour * self.hour_write
            + usage.cache_read_tokens * self.cache_read
        ) / 1_000_000 + self.searches(usage.web_search_requests)

    def searches(self, count: int) -> float:
        """Dollars for ``count`` web searches: billed per use, whatever their tokens."""
        return count * self.web_search / 1000

    def batched(self) -> ModelPrice:
        """The price of a request sent through the Message Batches API: half of every rate,
        the cache's included (the two discounts stack)."""
        return ModelPrice(
            input=self.input * BATCH_SHARE,
            output=self.output * BATCH_SHARE,
            cache_write=self.cache_write * BATCH_SHARE,
            cache_read=self.cache_read * BATCH_SHARE,
            cache_write_1h=self.hour_write * BATCH_SHARE,
            web_search=self.web_search,  # billed per use, batched or not
        )

    def worst_case(
        self, input_tokens: int, output_tokens: int, *, hour_writes: bool = False
    ) -> float:
        """The most a request of this size could cost, however the cache behaves (its
        writes kept an hour, if it asks for that)."""
        rates = (self.input, self.cache_write, self.cache_read)
        dearest_input = max(*rates, self.hour_write) if hour_writes else max(rates)
        return (input_tokens * dearest_input + output_tokens * self.output) / 1_000_000


#: Short names for the current models, as Claude Code's agent files spell them.
MODEL_ALIASES = {
    "opus": "claude-opus-5-5",
    "sonnet": "claude-sonnet-5-5",
    "haiku": "claude-haiku-4-5",
}


def model_id(name: str) -> str:
    """The model ID a name stands for: an alias's current model, else the name itself."""
    return MODEL_ALIASES.get(name.strip().lower(), name.strip())


def default_prices() -> dict[str, ModelPrice]:
    return {
        "claude-opus-5-5": ModelPrice(input=4, output=20, cache_write=5, cache_read=0.2),
        "claude-opus-5": ModelPrice(input=5, output=25, cache_write=6.25, cache_read=0.5),
        "claude-sonnet-5-5": ModelPrice(input=2, output=10, cache_write=2.5, cache_read=0.2),
        "claude-sonnet-5": ModelPrice(input=2, output=10, cache_write=2.5, cache_read=0.2),
        "claude-haiku-4-5": ModelPrice(input=1, output=5, cache_write=1.25, cache_read=0.1),
    }


#: The context window of a model missing from :func:`default_context_windows`.
FALLBACK_CONTEXT_WINDOW = 200_000


def default_context_windows() -> dict[str, int]:
    """Tokens each current model can hold in one request (input and output together)."""
    return {
        "claude-opus-5-5": 200_000,
        "claude-opus-5": 200_000,
        "claude-sonnet-5-5": 200_000,
        "claude-sonnet-5": 200_000,
        "claude-haiku-4-5": 200_000,
    }


def context_window_of(model: str) -> int:
    return default_context_windows().get(model, FALLBACK_CONTEXT_WINDOW)
