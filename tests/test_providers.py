"""`--provider bedrock|vertex`: the SDK's own platform clients, through orchmode's gateway,
against the scripted server's Bedrock and Vertex wire formats.

No AWS or Google endpoint is reached: Bedrock requests are SigV4-signed with static test keys
and verified by the server with botocore's signer; Vertex requests carry a test access token,
or one that google-auth's own service-account refresh fetched from the scripted server.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from conftest import StartServer
from orchmode.core.errors import AuthError, ConfigError, StreamInterrupted
from orchmode.core.mode import Notice
from orchmode.core.prompts import MAIN_TOOLS, NOTICES
from orchmode.core.settings import Settings
from orchmode.model.gateway import ModelGateway
from orchmode.model.providers import (
    BEDROCK_VERSION,
    VERTEX_VERSION,
    AwsAccess,
    Credentials,
    GoogleAccess,
)
from orchmode.testing import Fault, Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.providers import AuthRefused, AwsKeys, bedrock_frame, check_sigv4
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env, orchmode

KEYS = AwsKeys("AKIAORCHMODETEST0001", "orchmode/test/secret+key/not-a-real-one00")
REGION = "eu-west-3"
BEDROCK_MODEL = "anthropic.claude-opus-5-5-v1:0"
VERTEX_MODEL = "claude-opus-5-5@20260101"
PROJECT = "orchmode-test-project"
GOOGLE_TOKEN = "ya29.orchmode-test-token"
USER = [{"role": "user", "content": "hello"}]
NOTICE_MARK = "\n\n[orchmode notice: from the harness, not written by the user]\n"
NOTICE_END = "\n[end of orchmode notice]"
SAID_ONCE = "mode notices go in the user's turn"


# --------------------------------------------------------------------------- environments


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """An AWS environment with nothing in it: no keys, no profile, empty config files and
    no instance metadata (so boto3's chain never leaves this machine)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


@pytest.fixture
def google(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A Google environment with no credentials anywhere, and no metadata server probe."""
    from google.auth.compute_engine import _metadata

    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "GCLOUD_", "CLOUDSDK_", "ANTHROPIC_VERTEX_")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("CLOUD_ML_REGION", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)
    return monkeypatch


def clean_env(**extra: str) -> dict[str, str]:
    """A child process's environment without any provider's credentials (nor Anthropic's)."""
    env = {
        k: v
        for k, v in base_env().items()
        if not k.startswith(("AWS_", "GOOGLE_", "GCLOUD_", "CLOUDSDK_", "CLOUD_ML_"))
    }
    del env["ANTHROPIC_API_KEY"]  # neither platform needs one
    env.update(AWS_EC2_METADATA_DISABLED="true", NO_GCE_CHECK="true")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def private_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def service_account(
    path: Path, private_key: str, token_uri: str, project: str | None = PROJECT
) -> Path:
    """A service-account key file whose token endpoint is the scripted server."""
    info: dict[str, str] = {
        "type": "service_account",
        "private_key_id": "test-key-1",
        "private_key": private_key,
        "client_email": "orchmode-test@orchmode-test-project.iam.gserviceaccount.com",
        "client_id": "100000000000000000001",
        "token_uri": token_uri,
    }
    if project is not None:
        info["project_id"] = project
    path.write_text(json.dumps(info), encoding="utf-8")
    return path


def settings(server_url: str, provider: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "provider": provider,
        "base_url": server_url,
        "model": BEDROCK_MODEL if provider == "bedrock" else VERTEX_MODEL,
        "max_retries": 0,
    }
    values.update(overrides)
    return Settings(**values)


_gateways: list[ModelGateway] = []


@pytest.fixture(autouse=True)
async def _close_gateways() -> Any:
    yield
    while _gateways:
        await _gateways.pop().close()


def gateway(config: Settings, credentials: Credentials) -> ModelGateway:
    made = ModelGateway(config, credentials)
    _gateways.append(made)
    return made


def google_credentials(token: str = GOOGLE_TOKEN) -> Credentials:
    """Credentials as google-auth holds an access token: no refresh, no network."""
    import google.oauth2.credentials

    held = google.oauth2.credentials.Credentials(token=token)
    return Credentials(google=GoogleAccess(region="us-east5", project=PROJECT, credentials=held))


def last_block(body: dict[str, Any]) -> dict[str, Any]:
    content = body["messages"][-1]["content"]
    assert isinstance(content, list)
    block: dict[str, Any] = content[-1]
    return block


# --------------------------------------------------------------------------- Bedrock


async def test_bedrock_streams_through_the_sdk_client_with_a_verified_signature(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    server = await serve(
        lambda r: Reply.tool_use(
            "bash",
            {"command": "ls"},
            preamble="Looking around the tree first, before anything else.",
        ),
        aws_keys=KEYS,
        aws_region=REGION,
    )
    aws.setenv("AWS_REGION", REGION)
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    aws.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    credentials = Credentials.from_env(os.environ, "bedrock")
    assert credentials.api_key is None and credentials.aws is not None
    assert credentials.aws.region == REGION
    assert KEYS.secret_key in credentials.secrets and KEYS.secret_key not in repr(credentials)
    bedrock = gateway(settings(server.url, "bedrock"), credentials)
    pieces: list[str] = []
    reply = await bedrock.complete(
        agent="main", system="s", messages=USER, tools=MAIN_TOOLS, on_text=pieces.append
    )
    assert isinstance(bedrock.client, anthropic.AsyncAnthropicBedrock)
    assert reply.text == "Looking around the tree first, before anything else."
    assert len(pieces) > 1 and "".join(pieces) == reply.text
    assert [b["name"] for b in reply.tool_uses] == ["bash"]
    assert reply.tool_uses[0]["input"] == {"command": "ls"}
    assert reply.stop_reason == "tool_use" and reply.usage.output_tokens > 0
    (entry,) = server.log
    assert (entry.provider, entry.outcome, entry.status) == ("bedrock", "ok", 200)
    assert entry.path == f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"
    assert entry.headers["authorization"] == "***"
    body = entry.body
    assert body["anthropic_version"] == BEDROCK_VERSION
    assert not {"model", "stream", "cache_control", "diagnostics"} & set(body)
    assert body["output_config"] == {"effort": "xhigh"}
    # The cache breakpoint the top-level field would have set, on the last message instead.
    assert last_block(body) == {
        "type": "text",
        "text": "hello",
        "cache_control": {"type": "ephemeral"},
    }
    assert USER == [{"role": "user", "content": "hello"}]  # the caller's history is untouched


async def test_a_wrongly_signed_bedrock_request_is_refused_with_a_clear_auth_error(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    responder_calls: list[ScriptedRequest] = []

    def responder(request: ScriptedRequest) -> Reply:
        responder_calls.append(request)
        return Reply.text("never")

    server = await serve(responder, aws_keys=KEYS, aws_region=REGION)
    wrong_secret = "this-is-not-the-secret-the-server-knows"
    aws.setenv("AWS_DEFAULT_REGION", REGION)  # the other variable the chain reads
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    aws.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    bedrock = gateway(settings(server.url, "bedrock"), Credentials.from_env(os.environ, "bedrock"))
    with pytest.raises(AuthError) as caught:
        await bedrock.complete(agent="main", system="s", messages=USER, tools=[])
    message = str(caught.value)
    assert "Amazon Bedrock denied access (403" in message
    assert "signature we calculated does not match" in message
    assert "AWS_SECRET_ACCESS_KEY" in message and wrong_secret not in message
    assert [e.outcome for e in server.log] == ["auth:InvalidSignatureException"]
    assert responder_calls == []


async def test_a_session_token_is_signed_and_required_when_the_identity_has_one(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    temporary = AwsKeys(KEYS.access_key, KEYS.secret_key, "FwoGZXIvYXdzEXAMPLE//session")
    server = await serve(lambda r: Reply.text("ok"), aws_keys=temporary, aws_region=REGION)
    aws.setenv("AWS_REGION", REGION)
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    aws.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    without = gateway(settings(server.url, "bedrock"), Credentials.from_env(os.environ, "bedrock"))
    with pytest.raises(AuthError, match="security token included in the request is invalid"):
        await without.complete(agent="main", system="s", messages=USER, tools=[])
    aws.setenv("AWS_SESSION_TOKEN", temporary.session_token or "")
    credentials = Credentials.from_env(os.environ, "bedrock")
    assert temporary.session_token in credentials.secrets
    signed = gateway(settings(server.url, "bedrock"), credentials)
    assert (await signed.complete(agent="main", system="s", messages=USER, tools=[])).text == "ok"
    assert [e.outcome for e in server.log] == ["auth:UnrecognizedClientException", "ok"]
    assert server.log[1].headers["x-amz-security-token"] == "***"


async def test_an_inference_profile_arn_is_one_path_segment(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    server = await serve(lambda r: Reply.text(f"served by {r.model}"), aws_keys=KEYS)
    aws.setenv("AWS_REGION", REGION)
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    aws.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    arn = f"arn:aws:bedrock:{REGION}:123456789012:application-inference-profile/abc123"
    config = settings(server.url, "bedrock", model=arn)
    bedrock = gateway(config, Credentials.from_env(os.environ, "bedrock"))
    reply = await bedrock.complete(agent="main", system="s", messages=USER, tools=[])
    assert reply.text == f"served by {arn}"  # signed over the encoded path, and verified
    assert server.log[0].outcome == "ok"


async def test_a_bedrock_api_key_goes_as_a_bearer_token(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    server = await serve(lambda r: Reply.text("ok"), aws_keys=KEYS, bedrock_api_key="bedrock-key-1")
    aws.setenv("AWS_REGION", REGION)
    aws.setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-key-1")
    credentials = Credentials.from_env(os.environ, "bedrock")
    assert credentials.secrets == ("bedrock-key-1",)
    bedrock = gateway(settings(server.url, "bedrock"), credentials)
    assert (await bedrock.complete(agent="main", system="s", messages=USER, tools=[])).text == "ok"
    assert server.log[0].outcome == "ok"


async def test_bedrock_faults_arrive_in_its_shapes_and_are_retried(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    """A throttle (429 ThrottlingException) and a 503 ServiceUnavailableException are waited
    out and sent again; an exception frame part-way through the event stream is a broken
    stream, sent again; then the reply arrives."""
    script = iter(
        [
            Fault("rate_limit", retry_after=0.01),
            Fault("overloaded", retry_after=0.01),
            Fault("sse_error", after_events=4),
            None,
        ]
    )

    def responder(request: ScriptedRequest) -> Reply | Fault:
        return next(script) or Reply.text("made it through four tries")

    server = await serve(responder, aws_keys=KEYS, aws_region=REGION)
    aws.setenv("AWS_REGION", REGION)
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    aws.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    config = settings(server.url, "bedrock", stream_retries=1)
    bedrock = gateway(config, Credentials.from_env(os.environ, "bedrock"))
    reply = await bedrock.complete(agent="main", system="s", messages=USER, tools=[])
    assert reply.text == "made it through four tries"
    assert [(e.outcome, e.status) for e in server.log] == [
        ("fault:rate_limit", 429),
        ("fault:overloaded", 503),
        ("fault:sse_error", 200),
        ("ok", 200),
    ]
    assert server.log[1].body == server.log[0].body  # the very same request, signed again
    assert bedrock.limit.limit < config.max_concurrent  # both refusals reached the limit
    # Without a stream retry left, the exception frame is the gateway's broken stream.
    script = iter([Fault("sse_error", after_events=2)])
    once = gateway(settings(server.url, "bedrock", stream_retries=0), bedrock.credentials)
    with pytest.raises(StreamInterrupted, match="Bedrock is unable to process your request"):
        await once.complete(agent="main", system="s", messages=USER, tools=[])


async def test_bedrock_takes_the_context_editing_beta_in_the_body(
    serve: StartServer, aws: pytest.MonkeyPatch
) -> None:
    server = await serve(lambda r: Reply.text("ok"), aws_keys=KEYS, aws_region=REGION)
    aws.setenv("AWS_REGION", REGION)
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    aws.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    bedrock = gateway(settings(server.url, "bedrock"), Credentials.from_env(os.environ, "bedrock"))
    assert bedrock.context_editing is True
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000}}
    reply = await bedrock.complete(
        agent="main", system="s", messages=USER, tools=[], context_edits=[edit]
    )
    assert reply.text == "ok" and bedrock.context_editing is True
    body = server.log[0].body
    assert body["anthropic_beta"] == ["context-management-2025-06-27"]
    assert body["context_management"] == {"edits": [edit]}
    # Bedrock counts no tokens for the SDK: the gateway does not ask, and says nothing.
    assert await bedrock.count_tokens(system="s", messages=USER, tools=[]) is None
    assert len(server.log) == 1


def test_the_sigv4_check_refuses_any_change_to_what_was_signed() -> None:
    """botocore signs a request as the SDK does; the server accepts exactly that request."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as AwsCredentials

    url = f"http://127.0.0.1:9/model/{BEDROCK_MODEL}/invoke"
    body = json.dumps({"anthropic_version": BEDROCK_VERSION, "max_tokens": 5}).encode()
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"content-type": "application/json"}
    )
    request.headers["host"] = "127.0.0.1:9"
    SigV4Auth(AwsCredentials(KEYS.access_key, KEYS.secret_key), "bedrock", REGION).add_auth(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    when = datetime.datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.UTC
    )

    def check(**changes: Any) -> None:
        values: dict[str, Any] = {
            "method": "POST",
            "url": url,
            "headers": headers,
            "body": body,
            "keys": KEYS,
            "region": REGION,
            "now": when,
        }
        values.update(changes)
        check_sigv4(**values)

    check()  # as signed
    refusals = {
        "a changed body": {"body": body.replace(b"5", b"6")},
        "a changed path": {"url": url.replace("invoke", "invoke-with-response-stream")},
        "a changed signed header": {"headers": {**headers, "content-type": "text/plain"}},
        "another secret": {"keys": AwsKeys(KEYS.access_key, "another-secret")},
        "another key id": {"keys": AwsKeys("AKIAANOTHERKEY000000", KEYS.secret_key)},
        "another region": {"region": "us-east-1"},
        "a stale date": {"now": when + datetime.timedelta(minutes=6)},
        "no signature": {"headers": {k: v for k, v in headers.items() if k != "authorization"}},
    }
    for name, change in refusals.items():
        with pytest.raises(AuthRefused) as refused:
            check(**change)
        assert refused.value.status == 403, name


def test_event_stream_frames_are_what_botocore_parses_and_their_crc_holds() -> None:
    from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

    event = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "é"},
    }
    frame = bedrock_frame(event)
    buffer = EventStreamBuffer()
    buffer.add_data(frame[:7])  # a frame split across reads
    assert list(buffer) == []
    buffer.add_data(frame[7:])
    (message,) = list(buffer)
    assert message.headers[":event-type"] == "chunk"
    assert json.loads(base64.b64decode(json.loads(message.payload)["bytes"])) == event
    corrupt = EventStreamBuffer()
    corrupt.add_data(frame[:-6] + bytes([frame[-6] ^ 1]) + frame[-5:])
    with pytest.raises(ChecksumMismatch):
        list(corrupt)


# --------------------------------------------------------------------------- Vertex


async def test_vertex_streams_with_an_access_token_and_counts_tokens(
    serve: StartServer,
) -> None:
    server = await serve(
        lambda r: Reply.text("hello from the scripted model on vertex"),
        vertex_token=GOOGLE_TOKEN,
        vertex_project=PROJECT,
        vertex_region="us-east5",
    )
    vertex = gateway(settings(server.vertex_url, "vertex"), google_credentials())
    reply = await vertex.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert isinstance(vertex.client, anthropic.AsyncAnthropicVertex)
    assert reply.text == "hello from the scripted model on vertex"
    counted = await vertex.count_tokens(system="s", messages=USER, tools=MAIN_TOOLS)
    assert counted is not None and counted == server.log[1].prompt_tokens
    stream, count = server.log
    base = f"/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic/models"
    assert stream.path == f"{base}/{VERTEX_MODEL}:streamRawPredict"
    assert count.path == f"{base}/count-tokens:rawPredict"
    assert [(e.provider, e.outcome) for e in server.log] == [("vertex", "ok")] * 2
    assert stream.body["anthropic_version"] == VERTEX_VERSION and stream.body["stream"] is True
    assert not {"model", "cache_control", "diagnostics"} & set(stream.body)
    assert last_block(stream.body)["cache_control"] == {"type": "ephemeral"}
    assert count.body["model"] == VERTEX_MODEL
    assert count.body["anthropic_version"] == VERTEX_VERSION
    assert vertex.endpoint == server.vertex_url


async def test_vertex_refuses_a_wrong_token_and_a_wrong_project_clearly(
    serve: StartServer,
) -> None:
    server = await serve(
        lambda r: Reply.text("never"), vertex_token=GOOGLE_TOKEN, vertex_project=PROJECT
    )
    stale = gateway(settings(server.vertex_url, "vertex"), google_credentials("ya29.expired"))
    with pytest.raises(
        AuthError, match=r"Google Vertex AI rejected the credentials \(401"
    ) as caught:
        await stale.complete(agent="main", system="s", messages=USER, tools=[])
    assert "gcloud auth application-default login" in str(caught.value)
    elsewhere = Credentials(
        google=GoogleAccess(region="us-east5", project="someone-else", access_token=GOOGLE_TOKEN)
    )
    other = gateway(settings(server.vertex_url, "vertex"), elsewhere)
    with pytest.raises(AuthError, match=r"denied access \(403: Permission 'aiplatform"):
        await other.complete(agent="main", system="s", messages=USER, tools=[])
    assert [e.outcome for e in server.log] == ["auth:UNAUTHENTICATED", "auth:PERMISSION_DENIED"]


async def test_system_notices_in_a_recorded_history_are_sent_as_user_text(
    serve: StartServer,
) -> None:
    """A history with system notices (a session begun on the Messages API) still goes to a
    provider without them, folded into the user turn exactly as user-text delivery does."""
    server = await serve(lambda r: Reply.text("ok"), vertex_token=GOOGLE_TOKEN)
    vertex = gateway(settings(server.vertex_url, "vertex"), google_credentials())
    history = [
        {"role": "user", "content": "first"},
        {"role": "system", "content": NOTICES[Notice.ENTER]},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
        {"role": "system", "content": NOTICES[Notice.EXIT]},
    ]
    await vertex.complete(agent="main", system="s", messages=history, tools=[])
    sent = server.log[0].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[0]["content"] == f"first{NOTICE_MARK}{NOTICES[Notice.ENTER]}{NOTICE_END}"
    assert [b["text"] for b in sent[2]["content"]] == [
        "second",
        f"{NOTICE_MARK}{NOTICES[Notice.EXIT]}{NOTICE_END}",
    ]
    assert history[1]["role"] == "system"  # only the request was folded


# --------------------------------------------------------------------------- what the gateway says


def test_each_provider_says_once_what_it_changes_and_sets_the_gateway_up_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="orchmode")
    bedrock = ModelGateway(
        settings("http://127.0.0.1:9", "bedrock"),
        Credentials(aws=AwsAccess(region=REGION, access_key="a", secret_key="b")),
    )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("Amazon Bedrock: ")
    assert SAID_ONCE in lines[0] and "no cache diagnostics" in lines[0]
    assert bedrock.notices_in_user_text and bedrock.context_editing
    caplog.clear()
    anthropic_gateway = ModelGateway(Settings(), Credentials(api_key="k"))
    assert caplog.records == [] and not anthropic_gateway.notices_in_user_text
    asked = ModelGateway(Settings(notice_delivery="user-text"), Credentials(api_key="k"))
    assert asked.notices_in_user_text
    # Asked for user text already: only what else differs is said.
    ModelGateway(
        settings("http://127.0.0.1:9", "vertex", notice_delivery="user-text"),
        google_credentials(),
    )
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("Google Vertex AI: ") and SAID_ONCE not in line


def test_a_gateway_for_a_platform_needs_that_platform_s_access() -> None:
    with pytest.raises(ConfigError, match="--provider bedrock, but no AWS region"):
        ModelGateway(settings("http://127.0.0.1:9", "bedrock"), Credentials(api_key="k"))
    with pytest.raises(ConfigError, match="--provider vertex, but no Google region"):
        ModelGateway(settings("http://127.0.0.1:9", "vertex"), Credentials(api_key="k"))


# --------------------------------------------------------------------------- what is missing


def test_bedrock_names_what_is_missing(aws: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="AWS_REGION") as no_region:
        Credentials.from_env(os.environ, "bedrock")
    assert "~/.aws/config" in str(no_region.value)
    aws.setenv("AWS_REGION", REGION)
    with pytest.raises(AuthError) as no_credentials:
        Credentials.from_env(os.environ, "bedrock")
    for needle in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK"):
        assert needle in str(no_credentials.value)
    aws.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    with pytest.raises(AuthError, match="AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY"):
        Credentials.from_env(os.environ, "bedrock")
    aws.delenv("AWS_ACCESS_KEY_ID")
    aws.setenv("AWS_PROFILE", "nobody")
    with pytest.raises(ConfigError, match="the AWS profile 'nobody'"):
        Credentials.from_env(os.environ, "bedrock")


def test_a_profile_supplies_bedrock_s_region_and_credentials(
    aws: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "aws-config").write_text(f"[profile work]\nregion = {REGION}\n")
    (tmp_path / "aws-credentials").write_text(
        f"[work]\naws_access_key_id = {KEYS.access_key}\n"
        f"aws_secret_access_key = {KEYS.secret_key}\n"
    )
    aws.setenv("AWS_PROFILE", "work")
    found = Credentials.from_env(os.environ, "bedrock").aws
    assert found is not None and (found.region, found.profile) == (REGION, "work")
    assert found.secret_key is None  # left to the SDK's boto3 session, which can refresh it


def test_vertex_names_what_is_missing(
    google: pytest.MonkeyPatch, tmp_path: Path, private_key: str
) -> None:
    with pytest.raises(ConfigError, match="CLOUD_ML_REGION"):
        Credentials.from_env(os.environ, "vertex")
    google.setenv("CLOUD_ML_REGION", "us-east5")
    with pytest.raises(AuthError) as no_credentials:
        Credentials.from_env(os.environ, "vertex")
    assert "gcloud auth application-default login" in str(no_credentials.value)
    assert "GOOGLE_APPLICATION_CREDENTIALS" in str(no_credentials.value)
    key = service_account(tmp_path / "sa.json", private_key, "http://127.0.0.1:9", project=None)
    google.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with pytest.raises(ConfigError, match="ANTHROPIC_VERTEX_PROJECT_ID"):
        Credentials.from_env(os.environ, "vertex")


def test_a_missing_extra_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch, aws: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install 'orchmode\[bedrock\]'"):
        Credentials.from_env(os.environ, "bedrock")
    monkeypatch.setitem(sys.modules, "google.auth", None)
    with pytest.raises(ConfigError, match=r"pip install 'orchmode\[vertex\]'"):
        Credentials.from_env(os.environ, "vertex")


def test_credentials_travel_to_ray_nodes_without_google_s_signer() -> None:
    """Credentials are pickled to Ray actors: AWS keys go along; a google-auth object (whose
    signer may hold a private key) does not, and a node uses its own default credentials."""
    aws = Credentials(aws=AwsAccess(region=REGION, access_key="a", secret_key="s" * 12))
    assert pickle.loads(pickle.dumps(aws)).aws == aws.aws
    google_side = pickle.loads(pickle.dumps(google_credentials())).google
    assert google_side is not None and google_side.credentials is None
    assert (google_side.region, google_side.project) == ("us-east5", PROJECT)


def test_anthropic_credentials_are_as_before() -> None:
    with pytest.raises(AuthError, match="ANTHROPIC_API_KEY"):
        Credentials.from_env({})
    assert Credentials.from_env({"ANTHROPIC_AUTH_TOKEN": "t"}, "anthropic").auth_token == "t"
    assert Credentials.from_env({"ANTHROPIC_API_KEY": "k"}).secrets == ("k",)


# --------------------------------------------------------------------------- whole runs


class UnfoldNotices:
    """The scripted scenario reads mode notices as system messages; on a platform they come
    as user text, so it is shown them the way it reads them. The server's log keeps the
    request as it was sent."""

    def __init__(self, scenario: OrchestrationScenario) -> None:
        self.scenario = scenario

    def __call__(self, request: ScriptedRequest) -> Reply:
        body = {**request.body, "messages": list(unfolded(request.messages))}
        return self.scenario(ScriptedRequest(request.index, body, request.headers))


def unfolded(messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for message in messages:
        content = message.get("content")
        text = (
            content[0].get("text") if isinstance(content, list) and len(content) == 1 else content
        )
        if message.get("role") != "user" or not isinstance(text, str) or NOTICE_MARK not in text:
            yield message
            continue
        said, *notices = text.split(NOTICE_MARK)
        yield {"role": "user", "content": said}
        for notice in notices:
            yield {"role": "system", "content": notice.removesuffix(NOTICE_END)}


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def assert_a_platform_run(server: ScriptedServer, result: Any, provider: str, label: str) -> None:
    assert result.returncode == 0, result.stderr
    assert "Synthesis: 2 agents reported; 2 results were confirmed." in result.stdout
    assert "In brief:" in result.stdout
    assert result.stderr.count(SAID_ONCE) == 1, result.stderr
    assert f"orchmode: WARNING: {label}: " in result.stderr
    log = server.log
    assert log and all((e.provider, e.outcome) == (provider, "ok") for e in log)
    roles = [role_of(e.body) for e in log]
    assert roles.count("worker") >= 2 and roles.count("verifier") >= 2
    for entry in log:
        assert all(m["role"] in ("user", "assistant") for m in entry.body["messages"])
    main = [e.body for e in log if role_of(e.body) == "main"]
    first_turn = text_of(main[0]["messages"][0])
    assert first_turn.startswith("go" + NOTICE_MARK) and NOTICES[Notice.ENTER] in first_turn
    summary_turn = text_of(main[-1]["messages"][-1])
    assert NOTICE_MARK + NOTICES[Notice.EXIT] in summary_turn
    # The explicit breakpoint does what automatic caching would: later requests read it.
    assert any(e.usage is not None and e.usage.cache_read_input_tokens > 0 for e in log)


@pytest.mark.slow
def test_orchmode_run_through_bedrock(scripted: Any, tmp_path: Path) -> None:
    scenario = OrchestrationScenario(subtasks=2, scout_command="env", worker_command="pwd")
    server = scripted(UnfoldNotices(scenario), aws_keys=KEYS, aws_region=REGION)
    env = clean_env(
        AWS_REGION=REGION,
        AWS_ACCESS_KEY_ID=KEYS.access_key,
        AWS_SECRET_ACCESS_KEY=KEYS.secret_key,
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        FAVOURITE="blue",
    )
    args = ["--provider", "bedrock", "--base-url", server.url, "--model", BEDROCK_MODEL]
    result = orchmode("run", "go", *args, cwd=tmp_path, env=env)
    assert_a_platform_run(server, result, "bedrock", "Amazon Bedrock")
    assert {e.path for e in server.log} == {f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"}
    sent = "".join(str(e.body) for e in server.log)
    assert "FAVOURITE=blue" in sent  # the scout really ran `env`
    assert KEYS.secret_key not in sent and KEYS.access_key not in sent
    assert KEYS.secret_key.encode() not in (tmp_path / ".orchmode" / "journal.db").read_bytes()


@pytest.mark.slow
def test_orchmode_run_through_vertex(
    scripted: Any, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, private_key: str
) -> None:
    scenario = OrchestrationScenario(subtasks=2, scout_command="ls", worker_command="pwd")
    server = scripted(
        UnfoldNotices(scenario),
        vertex_token=GOOGLE_TOKEN,
        vertex_project=PROJECT,
        vertex_region="us-east5",
    )
    elsewhere = tmp_path_factory.mktemp("google")  # not in the tree the agents look at
    key = service_account(elsewhere / "sa.json", private_key, server.token_uri)
    env = clean_env(
        CLOUD_ML_REGION="us-east5",
        GOOGLE_APPLICATION_CREDENTIALS=str(key),
        CLOUDSDK_CONFIG=str(elsewhere / "gcloud"),
    )
    args = ["--provider", "vertex", "--base-url", server.vertex_url, "--model", VERTEX_MODEL]
    result = orchmode("run", "go", *args, cwd=tmp_path, env=env)
    assert_a_platform_run(server, result, "vertex", "Google Vertex AI")
    # The project came from the service account's key file; its token from google-auth's
    # own refresh against the scripted token endpoint, fetched once at start-up.
    assert server.token_requests == 1
    prefix = f"/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic/models/"
    assert all(e.path.startswith(prefix) for e in server.log)


@pytest.mark.parametrize(
    ("provider", "env", "needle", "code"),
    [
        ("bedrock", {}, "set AWS_REGION", 2),
        ("bedrock", {"AWS_REGION": REGION}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", 3),
        ("vertex", {}, "set CLOUD_ML_REGION", 2),
        ("vertex", {"CLOUD_ML_REGION": "us-east5"}, "gcloud auth application-default login", 3),
    ],
)
@pytest.mark.slow
def test_what_is_missing_stops_a_run_at_start_up_in_one_line(
    tmp_path: Path, provider: str, env: dict[str, str], needle: str, code: int
) -> None:
    isolated = clean_env(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        **env,
    )
    result = orchmode("run", "x", "--provider", provider, cwd=tmp_path, env=isolated)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchmode: ") and needle in lines[0], lines
    assert "Traceback" not in result.stderr
