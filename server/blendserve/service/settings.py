"""Service settings: read from ``BLENDSERVE_*`` environment variables once, then passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from blendserve.core.answers import ReasoningTags
from blendserve.core.policies import DEFAULT_POLICY
from blendserve.core.signals import MAX_TOP_LOGPROBS
from blendserve.core.stopping import DEFAULT_CAP
from blendserve.core.waves import DEFAULT_MAX_ROUNDS
from blendserve.engines.config import Limits, RetryPolicy, Timeouts
from blendserve.engines.factory import EngineConfig, EngineKind
from blendserve.engines.openai.wire import normalise_base_url
from blendserve.scheduler.spec import DEFAULT_IN_FLIGHT_PER_QUESTION
from blendserve.service.connections import ConnectionTimeouts
from blendserve.service.vocabulary import TRACE_RULE_PATTERN, check_policy, check_traces

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Everything the service reads from its environment (``BLENDSERVE_<FIELD>``).

    Command-line flags of ``blendserve serve`` override these.
    """

    model_config = SettingsConfigDict(env_prefix="BLENDSERVE_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on")
    engine: EngineKind = Field(
        "auto",
        description="auto: openai with upstreams, else replay with data, else vllm with "
        "vllm-model, else the embedded llama.cpp default",
    )
    upstreams: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="OpenAI-compatible base URLs (repeat, or a comma-separated list)"
    )
    model: str | None = Field(
        None,
        description="model name sent upstream (unset: the upstream's own); with --vllm-model, "
        "the name it is served under (unset: as given)",
    )
    upstream_api_key: str | None = Field(None, description="bearer key sent to the upstreams")
    upstream_timeout: float = Field(600.0, gt=0, description="seconds an upstream request may take")
    job_failure_timeout: float = Field(
        5.0, ge=0, description="seconds a job outlives every upstream being down"
    )
    session_header: str | None = Field(None, description="question id header (session routing)")
    upstream_stall_timeout: float | None = Field(
        None, gt=0, description="stream upstream requests; fail one silent this long"
    )
    upstream_max_response_bytes: int = Field(
        64 << 20, ge=1024, description="an upstream response over this fails (or is cut)"
    )
    data: Path | None = Field(None, description="recorded answers (JSONL) for the replay engine")
    embedded_model: str = Field("qwen2.5-coder-0.5b", description="model of the embedded default")
    model_cache_dir: Path = Field(
        Path("~/.cache/blendserve/models"), description="where the embedded model is kept"
    )
    embedded_threads: int | None = Field(
        None, ge=1, description="CPU threads of the embedded default (unset: half the cores)"
    )
    vllm_model: str | None = Field(
        None, description="run this model with vLLM in-process (a GPU, or vLLM's CPU build)"
    )
    default_concurrency: int | None = Field(
        None,
        ge=1,
        description="samples in flight per /solve job or /v1 pool at most, waves included "
        "(unset: a job decides at most 64 sample by sample and sends waves as large as the "
        "engine has room for; a pool keeps 64)",
    )
    default_in_flight_per_question: float = Field(
        DEFAULT_IN_FLIGHT_PER_QUESTION,
        gt=0,
        description="samples in flight per open question of a job",
    )
    default_max_rounds: int = Field(
        DEFAULT_MAX_ROUNDS,
        ge=0,
        le=64,
        description="waves per question at most, where the engine has room (0: sample by sample)",
    )
    engine_capacity: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="sequences each upstream replica runs at once (vLLM's --max-num-seqs); "
        "with it, a job on an engine with room goes in a few waves, reading vLLM's /metrics "
        "for its load (the replay engine knows its own)",
    )
    engine_profile: str | None = Field(
        None,
        description="the engine's decode-step cost by width and context: a JSONL profile "
        "(blendserve calibrate writes one) or a shipped name such as qwen2.5-7b-h100; "
        "a vLLM engine refines it live from its own metrics, and learns one without it",
    )
    replay_capacity: int | None = Field(
        None, ge=1, le=1_000_000, description="replay engine: sequences it runs at once"
    )
    replay_per_token_latency_s: float = Field(
        0.0, ge=0, le=10, description="replay engine: seconds per completion token"
    )
    replay_profile: str | None = Field(
        None,
        description="replay engine: batch continuously, each decode step priced by a profile "
        "(a shipped name such as qwen2.5-7b-h100, or a JSONL file of batch/ctx/ms_median "
        "points); --replay-capacity bounds the batch",
    )
    replay_time_scale: float = Field(
        1.0, gt=0, le=1000, description="replay engine: multiplies each profiled step's time"
    )
    replay_lengths: Literal["text", "cot", "reasoning"] = Field(
        "text",
        description="replay engine: completion tokens of a sample recorded without them, the "
        "rendered text's words, or log-normal as chain of thought (about 265) or a reasoning "
        "model (about 2,100)",
    )
    # The OpenAI-compatible routes: self-consistency defaults and request grouping.
    sc_budget_per_question: float = Field(8.0, gt=0, description="/v1: mean samples per question")
    sc_policy: str = Field(DEFAULT_POLICY, description="/v1 grouped jobs' allocation policy")
    sc_answer: Literal["auto", "number", "math", "choice", "exact"] = Field(
        "auto", description="/v1 answer format when a request names none"
    )
    sc_settle_delta: float = Field(
        0.0, ge=0, lt=1, description="/v1 grouped jobs: a question settles at this confidence gap"
    )
    sc_greedy_temperature: float | None = Field(
        None, gt=0, le=2, description="sample temperature-0 requests at this (unset: one sample)"
    )
    sc_mode: Literal["online", "grouped"] = Field(
        "online", description="online: per-question stopping paced to the budget; grouped: jobs"
    )
    sc_score: Literal["asc", "ppr"] = Field(
        "asc", description="/v1 online: the uncertainty its stopping uses"
    )
    sc_cap: float = Field(
        DEFAULT_CAP, ge=1, description="/v1 online: a question's cap, a multiple of the mean"
    )
    group_wait_ms: float = Field(
        50.0, ge=0, description="/v1 grouped: ms a group waits for more requests"
    )
    group_max: int = Field(
        256, ge=1, description="/v1 grouped: questions that start a group at once"
    )
    confidence_logprobs: int = Field(
        0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="read each sample's confidence from this many top logprobs a token, "
        f"1 to {MAX_TOP_LOGPROBS} (0: none asked for): /solve jobs and voted /v1 requests ask "
        "the engine for them, which costs it time (the embedded default computes them in "
        "Python)",
    )
    traces: str = Field(
        "count",
        description="the trace rule of requests that name none (count: every vote counts "
        "one; weighted or filter by a measure, cut=PERCENTILE, first_m=M: docs/solve.md); "
        "a rule that reads confidence asks for 20 logprobs unless --confidence-logprobs "
        "says how many",
        json_schema_extra={"pattern": TRACE_RULE_PATTERN},
    )
    record: Path | None = Field(
        None,
        description="append every question's samples the service sees to this file, in the "
        "recording format (docs/recordings.md): answer, tokens, finish, stop and confidence",
    )
    reasoning_tags: str = Field(
        "<think>,</think>",
        description="the tags around a reasoning model's thought, 'open,close': answers are "
        "read after the closing one (harmony's final channel is read too), and a thought "
        "that never closed is a cut sample",
    )
    sympy_workers: int = Field(
        2,
        ge=1,
        le=32,  # each is a whole Python process with sympy loaded
        description="processes that key math answers with sympy (about 150 MB each, at most "
        "32); from 2, "
        "one is kept for a client or job holding none, so one's slow answers do not delay "
        "another's",
    )
    client_header: str | None = Field(
        None,
        description="/v1 online, on a service without API keys: the request header naming the "
        "client that pools pace and share the sympy workers by (unset: one shared client; "
        "with API keys, each key is a client)",
    )
    allow_model_aliases: bool = Field(
        False,
        description="/v1: accept any model name, as the served model (else a name that "
        "GET /v1/models does not list is a 404)",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info", description="uvicorn's log level"
    )
    keep_alive_s: int = Field(75, ge=1, description="seconds an idle client connection is kept")
    # Slow or silent clients (see blendserve.service.connections).
    header_timeout_s: float = Field(10.0, gt=0, description="seconds a request's headers may take")
    body_timeout_s: float = Field(60.0, gt=0, description="seconds a request's body may take")
    write_timeout_s: float = Field(
        30.0, gt=0, description="seconds a client may read nothing before it is cut"
    )
    replay_latency_s: float = Field(
        0.0, ge=0, description="replay engine: seconds each request takes"
    )
    # Security and limits (see docs/operations.md).
    api_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="accepted bearer keys, comma-separated (prefer api-key-file)"
    )
    api_key_file: Path | None = Field(None, description="accepted bearer keys, one a line")
    metrics_auth: bool = Field(False, description="ask for a key on /metrics too")
    max_questions_per_job: int = Field(10_000, ge=1, description="questions per job (more: 422)")
    max_budget_per_job: int = Field(1_000_000, ge=1, description="samples per job (more: 422)")
    max_budget_per_question: float = Field(
        10_000, gt=0, description="samples per question on average (more: 422)"
    )
    max_prompt_bytes: int = Field(
        1 << 20, ge=1, description="UTF-8 bytes of one prompt (more: 422)"
    )
    max_extra_bytes: int = Field(
        64 << 10,
        ge=1,
        description="bytes of the JSON every upstream request of a job carries besides its "
        "prompt: /solve's sampling.extra, the fields a voted /v1 request does not declare "
        "(more: 422)",
    )
    max_body_bytes: int = Field(16 << 20, ge=1, description="bytes of a request body (more: 413)")
    max_tokenizer_body_bytes: int = Field(
        1 << 20, ge=1, description="bytes of a /tokenize or /detokenize body (more: 413)"
    )
    max_concurrent_jobs: int = Field(
        64, ge=1, description="/solve jobs, /v1 and tokenizer requests at once (more: 429)"
    )
    max_queued_questions: int = Field(
        100_000, ge=1, description="questions running at once (more: 429)"
    )
    shutdown_grace_s: float = Field(30.0, ge=0, description="seconds running jobs get on SIGTERM")

    @field_validator("sc_policy")
    @classmethod
    def _servable(cls, value: str) -> str:
        return check_policy(value)

    @field_validator("traces")
    @classmethod
    def _trace_rule(cls, value: str) -> str:
        return check_traces(value)

    @field_validator("reasoning_tags")
    @classmethod
    def _two_tags(cls, value: str) -> str:
        ReasoningTags.parse(value)
        return value

    @field_validator("data", "model_cache_dir", "api_key_file", "record")
    @classmethod
    def _expand_home(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @field_validator("upstreams", "api_keys", mode="before")
    @classmethod
    def _split_commas(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        parts = tuple(part.strip() for part in value.split(",") if part.strip())
        if info.field_name == "api_keys" and value and not parts:
            # " , " must not leave the service open; an empty value is unset.
            raise ValueError("no key in the list (leave it empty for an open service)")
        return parts

    @field_validator("upstreams")
    @classmethod
    def _distinct_upstreams(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bases = [normalise_base_url(url) for url in value]  # ValueError: not an http(s) URL
        if len(set(bases)) != len(bases):
            raise ValueError(f"an upstream is given twice: {', '.join(value)}")
        return value

    def keys(self) -> frozenset[str]:
        """The API keys that open the service: ``api_keys`` and ``api_key_file``'s lines.

        Raises:
            OSError: the key file cannot be read, is not text or holds no key.
        """
        keys = set(self.api_keys)
        if self.api_key_file is not None:
            try:
                lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError as exc:
                raise OSError(f"{self.api_key_file}: not UTF-8 text") from exc
            in_file = {line.strip() for line in lines if line.strip()}
            if not in_file:
                # An empty file must not leave the service open.
                raise OSError(f"{self.api_key_file}: no keys in the file")
            keys.update(in_file)
        return frozenset(keys)

    def connection_timeouts(self) -> ConnectionTimeouts:
        """The deadlines of client connections."""
        return ConnectionTimeouts(self.header_timeout_s, self.body_timeout_s, self.write_timeout_s)

    def engine_config(self) -> EngineConfig:
        """The engine part of these settings."""
        return EngineConfig(
            kind=self.engine,
            upstreams=self.upstreams,
            model=self.model,
            api_key=self.upstream_api_key,
            timeouts=Timeouts(call=self.upstream_timeout, stall=self.upstream_stall_timeout),
            limits=Limits(response_bytes=self.upstream_max_response_bytes),
            retry=RetryPolicy(max_retry_after=self.job_failure_timeout),
            data=self.data,
            embedded_model=self.embedded_model,
            model_cache_dir=self.model_cache_dir,
            embedded_threads=self.embedded_threads,
            vllm_model=self.vllm_model,
            session_header=self.session_header,
            replay_latency=self.replay_latency_s,
            replay_capacity=self.replay_capacity,
            replay_per_token_latency=self.replay_per_token_latency_s,
            replay_profile=self.replay_profile,
            replay_time_scale=self.replay_time_scale,
            replay_lengths=self.replay_lengths,
            capacity=self.engine_capacity,
            engine_profile=self.engine_profile,
        )
