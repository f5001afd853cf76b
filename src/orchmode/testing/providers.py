"""Amazon Bedrock's and Google Vertex AI's wire formats, in front of the scripted model.

The scripted server answers the same responder, validation and cache simulation on three
front doors; this module is what differs between them, so that the SDK's real
``AsyncAnthropicBedrock`` and ``AsyncAnthropicVertex`` clients can be driven exactly as
they drive the platforms:

* **Vertex**: ``POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/
  {model}:streamRawPredict`` (SSE, the Messages API's events) or ``:rawPredict`` (JSON), and
  ``.../models/count-tokens:rawPredict``; the body has ``anthropic_version:
  vertex-2023-10-16`` and no ``model``; an OAuth bearer token is required. Failures of
  authentication are Google's shape; the model's own errors are the Messages API's.
* **Bedrock**: ``POST /model/{modelId}/invoke-with-response-stream`` (AWS event-stream
  framing, each event a ``chunk`` whose payload is ``{"bytes": base64(event)}``) or
  ``/model/{modelId}/invoke`` (JSON); the body has ``anthropic_version:
  bedrock-2023-05-31``, betas as ``anthropic_beta``, and neither ``model`` nor ``stream``.
  Requests must be signed with SigV4, which is recomputed here with botocore's own signer
  from the headers the client says it signed; errors are Bedrock's ``{"message": ...}``
  with ``x-amzn-ErrorType``.

Only what the platforms document is imitated; their quotas, model catalogue and IAM are
not.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hmac
import importlib
import json
import re
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict
from urllib.parse import unquote

from ..core.wire import UncheckedJson
from .validate import InvalidRequest

__all__ = [
    "BEDROCK_VERSION",
    "GOOGLE_TOKEN_PATH",
    "VERTEX_VERSION",
    "AuthRefused",
    "AwsKeys",
    "Route",
    "bedrock_error",
    "bedrock_exception_frame",
    "bedrock_frame",
    "check_bearer",
    "check_sigv4",
    "google_error",
    "google_token_answer",
    "messages_body",
    "route_of",
]

Provider = Literal["anthropic", "bedrock", "vertex"]

BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
#: Where the scripted server mints Google access tokens (a service-account key's
#: ``token_uri`` can name it, so google-auth's own refresh runs with no Google network).
GOOGLE_TOKEN_PATH = "/oauth2/token"
_JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"

_MESSAGES = "/v1/messages"
_COUNT_TOKENS = "/v1/messages/count_tokens"
_VERTEX = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/publishers/anthropic/"
    r"models/(?P<model>[^/]+):(?P<method>rawPredict|streamRawPredict)$"
)
_BEDROCK = re.compile(r"^/model/(?P<model>[^/]+)/(?P<method>invoke|invoke-with-response-stream)$")


@dataclass(frozen=True)
class Route:
    """Which front door a request came in by, and what its path says."""

    provider: Provider
    counting: bool = False
    #: Whether to stream, when the path decides it (Bedrock, Vertex); None: the body does.
    stream: bool | None = None
    model: str | None = None
    project: str | None = None
    region: str | None = None


def route_of(method: str, raw_path: str) -> Route | None:
    """The route of a request's path as sent (still percent-encoded, so that a model ID with
    a ``/`` in it, an inference-profile ARN, stays one segment), or None if none serves it."""
    if method != "POST":
        return None
    path = raw_path.split("?", 1)[0].rstrip("/")
    if path == _MESSAGES:
        return Route("anthropic")
    if path == _COUNT_TOKENS:
        return Route("anthropic", counting=True)
    found = _VERTEX.match(path)
    if found:
        counting = found["model"] == "count-tokens"
        if counting and found["method"] != "rawPredict":
            return None
        return Route(
            "vertex",
            counting=counting,
            stream=None if counting else found["method"] == "streamRawPredict",
            model=None if counting else unquote(found["model"]),
            project=unquote(found["project"]),
            region=unquote(found["region"]),
        )
    found = _BEDROCK.match(path)
    if found:
        stream = found["method"] == "invoke-with-response-stream"
        return Route("bedrock", stream=stream, model=unquote(found["model"]))
    return None


def messages_body(route: Route, body: Any, betas: set[str]) -> tuple[Any, set[str]]:
    """A platform's body as the Messages API's, and the betas it asks for.

    Raises :class:`InvalidRequest` where the platform itself would refuse the body, in the
    platform's words.
    """
    if route.provider == "anthropic" or not isinstance(body, dict):
        return body, betas
    body = dict(body)
    if route.provider == "bedrock":
        return _bedrock_body(route, body)
    return _vertex_body(route, body), betas


def _bedrock_body(route: Route, body: UncheckedJson) -> tuple[UncheckedJson, set[str]]:
    def malformed(problem: str) -> InvalidRequest:
        return InvalidRequest(
            f"Malformed input request: {problem}, please reformat your input and try again."
        )

    version = body.pop("anthropic_version", None)
    if version is None:
        raise malformed("#: required key [anthropic_version] not found")
    if version != BEDROCK_VERSION:
        raise malformed(f"#/anthropic_version: {version!r} is not a valid enum value")
    for extra in ("model", "stream"):
        if extra in body:
            raise malformed(f"#: extraneous key [{extra}] is not permitted")
    names = body.pop("anthropic_beta", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise malformed("#/anthropic_beta: expected type: JSONArray of strings")
    assert route.model is not None
    body["model"] = route.model
    if route.stream:
        body["stream"] = True
    return body, set(names)


def _vertex_body(route: Route, body: UncheckedJson) -> UncheckedJson:
    version = body.pop("anthropic_version", None)
    if route.counting:
        if version not in (None, VERTEX_VERSION):
            raise InvalidRequest(f"anthropic_version: Input should be {VERTEX_VERSION!r}")
        return body
    if version is None:
        raise InvalidRequest("anthropic_version: Field required")
    if version != VERTEX_VERSION:
        raise InvalidRequest(f"anthropic_version: Input should be {VERTEX_VERSION!r}")
    if "model" in body:
        raise InvalidRequest("model: Extra inputs are not permitted (the model is in the URL)")
    streaming = body.get("stream") is True
    if route.stream and not streaming:
        raise InvalidRequest("streamRawPredict needs `stream: true` in the body")
    if not route.stream and streaming:
        raise InvalidRequest("rawPredict cannot stream; use streamRawPredict")
    assert route.model is not None
    body["model"] = route.model
    return body


# --------------------------------------------------------------------------- authentication


class AuthRefused(Exception):
    """A request the platform would refuse before reading it: status, error type, words."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class AwsKeys:
    """The one IAM identity the scripted Bedrock knows."""

    access_key: str
    secret_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return f"AwsKeys({self.access_key!r}, ***)"


_SIGV4 = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request,\s*SignedHeaders=(?P<signed>[a-z0-9;\-]+),\s*"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)
_AMZ_DATE = "%Y%m%dT%H%M%SZ"
#: How far a request's X-Amz-Date may be from the server's clock, as AWS allows.
_SKEW = datetime.timedelta(minutes=5)
_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details."
)


def check_sigv4(
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    keys: AwsKeys,
    region: str | None,
    service: str = "bedrock",
    now: datetime.datetime | None = None,
) -> None:
    """Verify a SigV4-signed request as AWS does, or raise :class:`AuthRefused`.

    ``headers`` are the received ones, names lower-cased; ``url`` is scheme, host and the
    path exactly as it arrived (undecoded). The canonical request is rebuilt by botocore's
    ``SigV4Auth`` from the headers the client lists as signed, with the client's own
    timestamp, so any difference between what was signed and what arrived shows.
    """
    authorization = headers.get("authorization")
    if authorization is None:
        raise AuthRefused(
            403, "MissingAuthenticationTokenException", "Missing Authentication Token"
        )
    parsed = _SIGV4.match(authorization.strip())
    if parsed is None:
        raise AuthRefused(
            403,
            "IncompleteSignatureException",
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' "
            f"parameters. Authorization={authorization.split(' ', 1)[0]}",
        )
    _check_scope(parsed, headers, keys, region, service)
    stamp = _check_date(headers.get("x-amz-date", ""), parsed["date"], now)
    signed = parsed["signed"].split(";")
    if "host" not in signed or any(name not in headers for name in signed):
        raise AuthRefused(403, "InvalidSignatureException", _MISMATCH)
    expected = _signature(
        method, url, {n: headers[n] for n in signed}, body, keys, parsed["region"], service, stamp
    )
    if not hmac.compare_digest(expected, parsed["signature"]):
        raise AuthRefused(403, "InvalidSignatureException", _MISMATCH)


def _check_scope(
    parsed: re.Match[str],
    headers: Mapping[str, str],
    keys: AwsKeys,
    region: str | None,
    service: str,
) -> None:
    """The credential names our key, this service and region, and our session token."""
    if not hmac.compare_digest(parsed["key"], keys.access_key):
        raise AuthRefused(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    if parsed["service"] != service:
        raise AuthRefused(
            403,
            "InvalidSignatureException",
            f"Credential should be scoped to correct service: '{service}'.",
        )
    if region is not None and parsed["region"] != region:
        raise AuthRefused(
            403,
            "InvalidSignatureException",
            f"Credential should be scoped to a valid region, not '{parsed['region']}'.",
        )
    if keys.session_token is not None and not hmac.compare_digest(
        headers.get("x-amz-security-token", ""), keys.session_token
    ):
        raise AuthRefused(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )


def _check_date(stamp: str, scope_date: str, now: datetime.datetime | None) -> str:
    """The request's ``x-amz-date``, refused when unreadable, stale or off its scope's day."""
    try:
        when = datetime.datetime.strptime(stamp, _AMZ_DATE).replace(tzinfo=datetime.UTC)
    except ValueError:
        raise AuthRefused(
            403, "IncompleteSignatureException", "Date must be in ISO-8601 'basic format'."
        ) from None
    now = now or datetime.datetime.now(datetime.UTC)
    if abs(now - when) > _SKEW or stamp[:8] != scope_date:
        raise AuthRefused(
            403,
            "InvalidSignatureException",
            f"Signature expired: {stamp} is now earlier than "
            f"{(now - _SKEW).strftime(_AMZ_DATE)} ({now.strftime(_AMZ_DATE)} - 5 min.)",
        )
    return stamp


def _signature(
    method: str,
    url: str,
    signed_headers: dict[str, str],
    body: bytes,
    keys: AwsKeys,
    region: str,
    service: str,
    stamp: str,
) -> str:
    """The signature botocore computes for this request, at the client's timestamp."""
    auth = importlib.import_module("botocore.auth")
    awsrequest = importlib.import_module("botocore.awsrequest")
    botocore_credentials = importlib.import_module("botocore.credentials")
    credentials = botocore_credentials.Credentials(
        keys.access_key, keys.secret_key, keys.session_token
    )
    signer = auth.SigV4Auth(credentials, service, region)
    request = awsrequest.AWSRequest(method=method, url=url, headers=signed_headers, data=body)
    request.context["timestamp"] = stamp
    canonical = signer.canonical_request(request)
    return str(signer.signature(signer.string_to_sign(request, canonical), request))


def check_bearer(headers: Mapping[str, str], token: str | None) -> str:
    """The bearer token of ``headers`` (any, when ``token`` is None), or raise."""
    value = headers.get("authorization", "")
    given = value[7:].strip() if value.lower().startswith("bearer ") else ""
    if not given:
        raise AuthRefused(401, "UNAUTHENTICATED", _GOOGLE_UNAUTHENTICATED)
    if token is not None and not hmac.compare_digest(given.encode(), token.encode()):
        raise AuthRefused(401, "UNAUTHENTICATED", _GOOGLE_UNAUTHENTICATED)
    return given


def check_bedrock_access(
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes | None,
    keys: AwsKeys | None,
    region: str | None,
    api_key: str | None,
) -> None:
    """Bedrock's front door: ``api_key`` as a bearer token, or a SigV4 signature by ``keys``
    (with no keys, any ``Authorization``); or raise :class:`AuthRefused`. A ``body`` too
    large to read (None) passes, to be refused for its size next."""
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):  # a Bedrock API key
        key = authorization[7:].strip()
        if api_key is None or not secrets.compare_digest(key.encode(), api_key.encode()):
            raise AuthRefused(
                403,
                "AccessDeniedException",
                "Authentication failed: Please make sure your API Key is valid.",
            )
        return
    if keys is None:
        if not authorization:
            raise AuthRefused(
                403, "MissingAuthenticationTokenException", "Missing Authentication Token"
            )
        return
    if body is None:
        return
    check_sigv4(method=method, url=url, headers=headers, body=body, keys=keys, region=region)


def check_vertex_access(
    route: Route,
    headers: Mapping[str, str],
    *,
    token: str | None,
    project: str | None,
    region: str | None,
) -> None:
    """Vertex's front door: the bearer ``token``, for ``project`` and ``region`` when set."""
    check_bearer(headers, token)
    for wanted, given, what in (
        (project, route.project, "project"),
        (region, route.region, "location"),
    ):
        if wanted is not None and given != wanted:
            raise AuthRefused(
                403,
                "PERMISSION_DENIED",
                f"Permission 'aiplatform.endpoints.predict' denied on resource "
                f"'//aiplatform.googleapis.com/projects/{route.project}/locations/"
                f"{route.region}/publishers/anthropic/models/{route.model}' (or it may "
                f"not exist): unknown {what} {given!r}.",
            )


_GOOGLE_UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)


class OAuthError(TypedDict):
    error: str
    error_description: str


class OAuthToken(TypedDict):
    access_token: str
    expires_in: int
    token_type: str


def google_token_answer(form: Mapping[str, str], token: str) -> tuple[int, OAuthError | OAuthToken]:
    """Google's OAuth token endpoint, for a service account's JWT-bearer grant."""
    if form.get("grant_type") != _JWT_BEARER:
        return 400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type"}
    parts = form.get("assertion", "").split(".")
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return 400, {"error": "invalid_grant", "error_description": "Invalid JWT"}
    if not isinstance(claims, dict) or not claims.get("iss") or not claims.get("scope"):
        return 400, {"error": "invalid_scope", "error_description": "Invalid JWT claims"}
    return 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}


# --------------------------------------------------------------------------- error shapes

#: The Messages API's error types as Bedrock names and numbers them.
_BEDROCK_ERRORS: dict[str, tuple[int, str]] = {
    "invalid_request_error": (400, "ValidationException"),
    "request_too_large": (400, "ValidationException"),
    "not_found_error": (404, "ResourceNotFoundException"),
    "rate_limit_error": (429, "ThrottlingException"),
    "overloaded_error": (503, "ServiceUnavailableException"),
    "api_error": (500, "InternalServerException"),
    "authentication_error": (403, "UnrecognizedClientException"),
}
_BEDROCK_WORDS = {
    "ThrottlingException": "Too many requests, please wait before trying again.",
    "ServiceUnavailableException": "Bedrock is unable to process your request.",
}


class BedrockError(TypedDict):
    message: str


def bedrock_error(
    status: int, kind: str, message: str, request_id: str
) -> tuple[int, BedrockError, dict[str, str]]:
    """Status, body and headers of a Bedrock error for one of the Messages API's (or one
    already named the AWS way, as the signature checks name theirs)."""
    if kind in _BEDROCK_ERRORS:
        status, kind = _BEDROCK_ERRORS[kind]
        message = _BEDROCK_WORDS.get(kind, message)
    headers = {
        "x-amzn-errortype": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
        "x-amzn-requestid": request_id,
    }
    return status, {"message": message}, headers


_GOOGLE_STATUS = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}


class GoogleErrorDetail(TypedDict):
    code: int
    message: str
    status: str


class GoogleError(TypedDict):
    """Google's error body, for what the Vertex front end itself refuses."""

    error: GoogleErrorDetail


def google_error(status: int, message: str) -> GoogleError:
    """Google's error body, for what the Vertex front end itself refuses."""
    return {"error": {"code": status, "message": message, "status": _GOOGLE_STATUS.get(status, "")}}


# --------------------------------------------------------------------------- event stream


def _string_header(name: str, value: str) -> bytes:
    encoded_name, encoded_value = name.encode(), value.encode()
    # name length, name, value type 7 (string), value length (u16), value
    return (
        struct.pack("!B", len(encoded_name))
        + encoded_name
        + b"\x07"
        + struct.pack("!H", len(encoded_value))
        + encoded_value
    )


def _frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (total length, headers length), its CRC32,
    headers, payload, and the CRC32 of everything before it."""
    encoded = b"".join(_string_header(k, v) for k, v in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    message = prelude + struct.pack("!I", binascii.crc32(prelude)) + encoded + payload
    return message + struct.pack("!I", binascii.crc32(message))


def bedrock_frame(data: Mapping[str, object]) -> bytes:
    """One Messages API event as Bedrock streams it: a ``chunk`` holding its JSON, base64,
    with the random padding Bedrock adds so a frame's length says nothing."""
    event = json.dumps(data, ensure_ascii=False).encode()
    payload = {
        "bytes": base64.b64encode(event).decode(),
        "p": secrets.token_hex(8)[: 1 + len(event) % 16],
    }
    headers = {
        ":event-type": "chunk",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return _frame(headers, json.dumps(payload).encode())


def bedrock_exception_frame(kind: str, message: str) -> bytes:
    """A stream's mid-way failure, as Bedrock sends it (e.g. ``serviceUnavailableException``)."""
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return _frame(headers, json.dumps({"message": message}).encode())
