"""Who serves the model: Anthropic's Messages API, Amazon Bedrock or Google Vertex AI.

The SDK's own clients speak each wire format (the model in the path, ``anthropic_version``
in the body, SigV4 or OAuth); this module finds what they need (region, project,
credentials) at start-up, so that a missing piece is one clear error before anything runs
rather than a failure on the first request. It also says which parts of the Messages API
each endpoint is known to take: what is not known is not assumed, and the gateway leaves it
out (see :class:`Capabilities`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from types import ModuleType
from typing import Any

import anthropic

from ..core.errors import AuthError, ConfigError
from ..core.settings import Provider, Settings

#: Any of the SDK's three async clients: they share ``messages``, ``beta`` and ``close``.
Client = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex

#: The body's ``anthropic_version`` each platform documents. The installed SDK (2.14) puts
#: its own first-party version (``2026-10-21``) there, which neither platform documents, so
#: the gateway sends these explicitly.
BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
#: The OAuth scope the SDK asks Google for.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True)
class Capabilities:
    """What one provider's endpoint is known to take, from its documentation.

    Each flag off makes the gateway do without: notices go in the user's turn, orchmode
    compacts on its own, the prompt cache gets an explicit breakpoint instead of the
    top-level one, and so on. A feature an endpoint might refuse is not assumed.
    """

    label: str
    #: ``{"role": "system"}`` messages inside ``messages`` (the mode notices).
    system_messages: bool
    #: The ``context-management-2025-06-27`` beta (context editing); an endpoint that
    #: refuses it anyway is sent the request again without it (see ``ModelGateway``).
    context_editing: bool
    #: ``diagnostics.previous_message_id``: why a cached prefix was missed.
    cache_diagnostics: bool
    #: Top-level ``cache_control`` (automatic caching); without it, the last message
    #: carries the breakpoint, which every platform documents.
    automatic_caching: bool
    #: The API's own token count (the SDK refuses it for Bedrock).
    count_tokens: bool
    #: ``output_config.effort``.
    effort: bool
    #: The ``anthropic_version`` the body must carry, when the platform wants one there.
    body_version: str | None
    #: What to check when the endpoint refuses the credentials.
    credentials_hint: str
    #: Where the endpoint comes from, when it cannot be reached.
    endpoint_hint: str

    def adaptations(self, settings: Settings) -> list[str]:
        """What orchmode does differently here, for the one line that says so."""
        said: list[str] = []
        if not self.system_messages and settings.notice_delivery == "system":
            said.append(
                "it takes no mid-conversation system messages, so mode notices go in the "
                "user's turn (as with --notice-delivery user-text)"
            )
        if not self.context_editing and settings.context_management == "auto":
            said.append("no context-editing beta, so orchmode compacts on its own")
        if not self.cache_diagnostics:
            said.append("no cache diagnostics")
        if not self.automatic_caching:
            said.append("prompt caching by an explicit breakpoint on the last message")
        if not self.count_tokens:
            said.append("token counts are orchmode's own estimate")
        if not self.effort:
            said.append(f"effort is not sent (--effort {settings.effort} has no effect)")
        return said


# Context editing: "Amazon Bedrock (InvokeModel): beta" in the feature's documentation.
# Mid-conversation system messages and top-level cache_control: not documented for
# Bedrock; cache diagnostics: "Claude API" only. Effort: Bedrock's own OutputConfig
# lists low..max. Token counting: the SDK raises for Bedrock.
_BEDROCK = Capabilities(
    label="Amazon Bedrock",
    system_messages=False,
    context_editing=True,
    cache_diagnostics=False,
    automatic_caching=False,
    count_tokens=False,
    effort=True,
    body_version=BEDROCK_VERSION,
    credentials_hint=(
        "check the AWS credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
        "AWS_SESSION_TOKEN, AWS_PROFILE, or AWS_BEARER_TOKEN_BEDROCK) and that they may "
        "invoke this model in this region"
    ),
    endpoint_hint="check --base-url, ANTHROPIC_BEDROCK_BASE_URL, AWS_REGION and the network",
)

CAPABILITIES: dict[Provider, Capabilities] = {
    "anthropic": Capabilities(
        label="the Anthropic API",
        system_messages=True,
        context_editing=True,
        cache_diagnostics=True,
        automatic_caching=True,
        count_tokens=True,
        effort=True,
        body_version=None,
        credentials_hint="check ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN",
        endpoint_hint="check --base-url, ANTHROPIC_BASE_URL and the network",
    ),
    "bedrock": _BEDROCK,
    # Context editing: "Claude Models on Google Cloud (Google managed): beta". The rest as
    # for Bedrock, except that the SDK counts tokens on Vertex (count-tokens:rawPredict).
    "vertex": replace(
        _BEDROCK,
        label="Google Vertex AI",
        count_tokens=True,
        body_version=VERTEX_VERSION,
        credentials_hint=(
            "check the Google credentials (gcloud auth application-default login, or "
            "GOOGLE_APPLICATION_CREDENTIALS) and that the project may use this model"
        ),
        endpoint_hint=(
            "check --base-url, ANTHROPIC_VERTEX_BASE_URL, CLOUD_ML_REGION and the network"
        ),
    ),
}


@dataclass(frozen=True)
class AwsAccess:
    """How to reach Bedrock: a region and either keys, a profile, the default chain, or a
    Bedrock API key. Keys are held only when they came from the environment (so that a Ray
    node, which has no such environment, can sign too); a profile's refreshable credentials
    are left to the SDK's own boto3 session."""

    region: str
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    profile: str | None = None
    #: ``AWS_BEARER_TOKEN_BEDROCK``: a Bedrock API key, sent as a bearer token.
    bearer_token: str | None = None

    def __repr__(self) -> str:  # never print a secret, even by accident
        return f"AwsAccess(region={self.region!r}, ***)"

    @property
    def secrets(self) -> tuple[str, ...]:
        values = (self.access_key, self.secret_key, self.session_token, self.bearer_token)
        return tuple(v for v in values if v)


@dataclass(frozen=True)
class GoogleAccess:
    """How to reach Vertex: region, project, and google-auth credentials (or a token).

    The credentials object refreshes its own token; it is not sent to Ray nodes, which use
    their own application default credentials (see :meth:`__getstate__`).
    """

    region: str
    project: str
    credentials: Any = None
    access_token: str | None = None

    def __repr__(self) -> str:
        return f"GoogleAccess(region={self.region!r}, project={self.project!r}, ***)"

    def __getstate__(self) -> dict[str, object]:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["credentials"] = None  # a signer holds a private key, and may not pickle
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    @property
    def secrets(self) -> tuple[str, ...]:
        token = getattr(self.credentials, "token", None)
        values = (self.access_token, token if isinstance(token, str) else None)
        return tuple(v for v in values if v)


def capabilities_of(provider: Provider) -> Capabilities:
    return CAPABILITIES[provider]


def _extra(provider: str, module: str) -> ModuleType:
    """Import what a provider's extra installs, or say which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"--provider {provider} needs {module.split('.')[0]}, which is not installed — "
            f"pip install 'orchmode[{provider}]'"
        ) from exc


def resolve_bedrock(env: Mapping[str, str]) -> AwsAccess:
    """Region and credentials for Bedrock, as the AWS CLI and boto3 find them.

    Region: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, then the profile's ``region`` in
    ``~/.aws/config``. Credentials: ``AWS_BEARER_TOKEN_BEDROCK`` (a Bedrock API key), else
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``), else
    boto3's chain (``AWS_PROFILE``, shared files, SSO, container and instance roles).
    """
    boto3 = _extra("bedrock", "boto3")
    botocore_exceptions = _extra("bedrock", "botocore.exceptions")
    profile = env.get("AWS_PROFILE") or None
    try:
        session = boto3.Session(profile_name=profile)
    except botocore_exceptions.ProfileNotFound as exc:
        raise ConfigError(
            f"the AWS profile {profile!r} (AWS_PROFILE) is not in ~/.aws/config or "
            "~/.aws/credentials — create it with `aws configure --profile "
            f"{profile}`, or unset AWS_PROFILE"
        ) from exc
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or session.region_name
    if not region:
        raise ConfigError(
            "Amazon Bedrock needs an AWS region and none is set — set AWS_REGION (or "
            "AWS_DEFAULT_REGION), or a `region` for the profile in ~/.aws/config"
        )
    bearer = env.get("AWS_BEARER_TOKEN_BEDROCK") or None
    if bearer:
        return AwsAccess(region=str(region), bearer_token=bearer)
    key = env.get("AWS_ACCESS_KEY_ID") or None
    secret = env.get("AWS_SECRET_ACCESS_KEY") or None
    if key or secret:
        if not (key and secret):
            present, absent = (
                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                if key
                else ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
            )
            raise AuthError(f"{present} is set but {absent} is not — set both, or neither")
        return AwsAccess(
            region=str(region),
            access_key=key,
            secret_key=secret,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )
    try:
        found = session.get_credentials()
    except botocore_exceptions.BotoCoreError as exc:
        raise AuthError(f"cannot load the AWS credentials for Amazon Bedrock: {exc}") from exc
    if found is None:
        raise AuthError(
            "Amazon Bedrock needs AWS credentials and none were found — set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, choose a profile with AWS_PROFILE "
            "(`aws configure`, `aws sso login`), or set AWS_BEARER_TOKEN_BEDROCK to a "
            "Bedrock API key"
        )
    return AwsAccess(region=str(region), profile=profile)


def resolve_vertex(env: Mapping[str, str]) -> GoogleAccess:
    """Region, project and credentials for Vertex, as the SDK and gcloud find them.

    Region: ``CLOUD_ML_REGION``. Credentials: google-auth's application default
    credentials (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default
    login``, the metadata server). Project: ``ANTHROPIC_VERTEX_PROJECT_ID``, else the one
    those credentials name (or ``GOOGLE_CLOUD_PROJECT``). A first token is fetched now, so
    that credentials Google refuses are a start-up error.
    """
    google_auth = _extra("vertex", "google.auth")
    google_exceptions = _extra("vertex", "google.auth.exceptions")
    transport = _extra("vertex", "google.auth.transport.requests")
    region = env.get("CLOUD_ML_REGION") or None
    if not region:
        raise ConfigError(
            "Google Vertex AI needs a region and none is set — set CLOUD_ML_REGION "
            "(for example us-east5, or global)"
        )
    try:
        credentials, found_project = google_auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except google_exceptions.DefaultCredentialsError as exc:
        raise AuthError(
            "Google Vertex AI needs Google Cloud credentials and none were found — run "
            "`gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
            "to a service-account key file"
        ) from exc
    project = env.get("ANTHROPIC_VERTEX_PROJECT_ID") or found_project or None
    if not project:
        raise ConfigError(
            "Google Vertex AI needs a Google Cloud project and none is set — set "
            "ANTHROPIC_VERTEX_PROJECT_ID (or GOOGLE_CLOUD_PROJECT)"
        )
    try:
        credentials.refresh(transport.Request())
    except google_exceptions.RefreshError as exc:
        raise AuthError(
            f"Google refused the credentials for Vertex AI ({exc}) — "
            f"{CAPABILITIES['vertex'].credentials_hint}"
        ) from exc
    except google_exceptions.TransportError as exc:
        raise AuthError(
            f"cannot get a Google access token for Vertex AI: {exc} — check the network"
        ) from exc
    return GoogleAccess(region=region, project=str(project), credentials=credentials)


def auth_failures(provider: Provider) -> tuple[type[BaseException], ...]:
    """What a provider's auth library raises when credentials stop working mid-run (an SSO
    session that expired, a token Google will no longer refresh)."""
    module = {"bedrock": "botocore.exceptions", "vertex": "google.auth.exceptions"}.get(provider)
    if module is None:
        return ()
    try:
        found = importlib.import_module(module)
    except ImportError:
        return ()
    name = "BotoCoreError" if provider == "bedrock" else "GoogleAuthError"
    failure: type[BaseException] = getattr(found, name)
    return (failure,)


@dataclass(frozen=True)
class Credentials:
    """What the provider needs to accept a request: an Anthropic key or token, or the AWS
    or Google access resolved at start-up."""

    api_key: str | None = None
    auth_token: str | None = None
    aws: AwsAccess | None = None
    google: GoogleAccess | None = None

    def __repr__(self) -> str:  # never print a secret, even by accident
        return "Credentials(***)"

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret held, for masking in saved results and commands' environments."""
        found = [self.api_key, self.auth_token]
        for access in (self.aws, self.google):
            if access is not None:
                found.extend(access.secrets)
        return tuple(s for s in found if s)

    @classmethod
    def from_env(cls, env: Mapping[str, str], provider: Provider = "anthropic") -> Credentials:
        """What ``provider`` needs, from the environment and the provider's own config chain.

        Anthropic: ``ANTHROPIC_API_KEY`` first, then ``ANTHROPIC_AUTH_TOKEN``, as the SDK
        orders them. Bedrock and Vertex: see :func:`orchmode.model.providers.resolve_bedrock` and
        :func:`~orchmode.model.providers.resolve_vertex`; neither needs an Anthropic key. Whatever
        is missing is a ConfigError or AuthError naming it, here at start-up.
        """
        if provider == "bedrock":
            return cls(aws=resolve_bedrock(env))
        if provider == "vertex":
            return cls(google=resolve_vertex(env))
        api_key = env.get("ANTHROPIC_API_KEY") or None
        if api_key:
            return cls(api_key=api_key)
        auth_token = env.get("ANTHROPIC_AUTH_TOKEN") or None
        if auth_token:
            return cls(auth_token=auth_token)
        raise AuthError(
            "no API key — set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) in the environment"
        )


def build_client(settings: Settings, credentials: Credentials) -> Client:
    """The SDK client for ``settings.provider``; ``--base-url`` overrides the endpoint.

    Every client gets the SDK's aiohttp transport (measured at about half the CPU per
    request of the default one under concurrency, bench/fanout.py) and no retries of its
    own: retries are the gateway's, so every 429 reaches its adaptive limit.
    """
    common: dict[str, Any] = {
        "http_client": anthropic.DefaultAioHttpClient(),
        "base_url": settings.base_url,
        "timeout": settings.request_timeout,
        "max_retries": 0,
    }
    if settings.provider == "bedrock":
        aws = require_access(settings.provider, credentials)
        assert isinstance(aws, AwsAccess)
        try:
            if aws.bearer_token:
                return anthropic.AsyncAnthropicBedrock(
                    api_key=aws.bearer_token, aws_region=aws.region, **common
                )
            return anthropic.AsyncAnthropicBedrock(
                aws_access_key=aws.access_key,
                aws_secret_key=aws.secret_key,
                aws_session_token=aws.session_token,
                aws_profile=aws.profile,
                aws_region=aws.region,
                **common,
            )
        except ValueError as exc:  # keys given while AWS_BEARER_TOKEN_BEDROCK is set
            raise ConfigError(f"Amazon Bedrock: {exc}") from exc
    if settings.provider == "vertex":
        google = require_access(settings.provider, credentials)
        assert isinstance(google, GoogleAccess)
        return anthropic.AsyncAnthropicVertex(
            region=google.region,
            project_id=google.project,
            credentials=google.credentials,
            access_token=google.access_token,
            **common,
        )
    return anthropic.AsyncAnthropic(
        api_key=credentials.api_key, auth_token=credentials.auth_token, **common
    )


def check_batching(settings: Settings) -> None:
    """Refuse batch mode where the endpoint serves no Message Batches API."""
    if settings.batch != "off" and settings.provider != "anthropic":
        raise ConfigError(
            f"--batch {settings.batch} needs Anthropic's Message Batches API, which --provider "
            f"{settings.provider} does not serve (its own batch jobs are another service) — "
            "use --batch off there, or --provider anthropic"
        )


def require_access(provider: Provider, credentials: Credentials) -> AwsAccess | GoogleAccess | None:
    """The provider's part of ``credentials``; a ConfigError when it was never resolved."""
    if provider == "bedrock":
        if credentials.aws is None:
            raise ConfigError(
                "--provider bedrock, but no AWS region and credentials were resolved "
                "(Credentials.from_env(env, provider='bedrock') finds them)"
            )
        return credentials.aws
    if provider == "vertex":
        if credentials.google is None:
            raise ConfigError(
                "--provider vertex, but no Google region, project and credentials were "
                "resolved (Credentials.from_env(env, provider='vertex') finds them)"
            )
        return credentials.google
    return None
