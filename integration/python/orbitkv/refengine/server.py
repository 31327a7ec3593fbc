"""OpenAI-compatible HTTP front end (stdlib only): /v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics.

Each HTTP connection has its own thread; all of them feed one EngineLoop. Every wait has a
deadline (request_timeout_s for a whole completion, socket_timeout_s for each socket read or
write), and a client that goes away has its request aborted, so its KV blocks are freed.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import tokenizer
from .loop import EngineDead, EngineLoop, RequestHandle

MAX_BODY_BYTES = 64 << 20
CLIENT_CHECK_S = 0.1  # how often a waiting handler checks that its client is still there

# stat key → (metric name, type, help)
METRICS = [
    ("steps", "steps_total", "counter", "Engine steps."),
    ("prompt_tokens", "prompt_tokens_total", "counter", "Prompt tokens of admitted requests."),
    ("generation_tokens", "generation_tokens_total", "counter", "Generated tokens."),
    ("prefix_query_tokens", "prefix_cache_query_tokens_total", "counter", "Tokens looked up in the local prefix cache."),
    ("prefix_hit_tokens", "prefix_cache_hit_tokens_total", "counter", "Tokens served by the local prefix cache."),
    ("external_query_tokens", "external_query_tokens_total", "counter", "Tokens past the local hit offered to the KV connector."),
    ("external_matched_tokens", "external_matched_tokens_total", "counter", "Tokens the KV connector claimed."),
    ("external_restored_tokens", "external_restored_tokens_total", "counter", "Tokens restored from the external cache without a load error."),
    ("load_error_blocks", "load_error_blocks_total", "counter", "Blocks whose external load failed (recomputed)."),
    ("preemptions", "preemptions_total", "counter", "Requests preempted for lack of KV blocks."),
    ("prefix_cache_evictions", "prefix_cache_evictions_total", "counter", "Cached blocks evicted from the local prefix cache."),
    ("computed_prompt_tokens", "computed_prompt_tokens_total", "counter", "Prompt tokens computed (not from the prefix cache or the connector)."),
    ("prefill_steps", "prefill_steps_total", "counter", "Steps that computed prompt tokens."),
    ("prefill_step_seconds", "prefill_step_seconds_total", "counter", "Time in steps that computed prompt tokens."),
    ("decode_steps", "decode_steps_total", "counter", "Steps that only decoded."),
    ("decode_step_seconds", "decode_step_seconds_total", "counter", "Time in decode-only steps."),
    ("idle_step_seconds", "idle_step_seconds_total", "counter", "Time in steps that computed nothing (waiting for transfers)."),
    ("requests_finished", "requests_finished_total", "counter", "Requests finished (any reason)."),
    ("requests_aborted", "requests_aborted_total", "counter", "Requests aborted."),
    ("requests_running", "requests_running", "gauge", "Running requests."),
    ("requests_waiting", "requests_waiting", "gauge", "Waiting requests."),
    ("requests_waiting_for_remote_kvs", "requests_waiting_for_remote_kvs", "gauge", "Requests waiting for an async KV load."),
    ("requests_held", "requests_held", "gauge", "Finished requests whose blocks wait for a transfer."),
    ("kv_blocks_total", "kv_blocks", "gauge", "KV blocks in the pool."),
    ("kv_blocks_free", "kv_blocks_free", "gauge", "Free KV blocks (cached ones included)."),
    ("kv_blocks_cached", "kv_blocks_cached", "gauge", "Blocks in the local prefix cache."),
    ("kv_usage", "kv_usage_ratio", "gauge", "Fraction of KV blocks held by requests."),
]


def render_metrics(stats: Dict[str, float], alive: bool) -> str:
    lines = []
    for key, name, kind, help_ in METRICS:
        full = f"orbitkv_refengine_{name}"
        lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}", f"{full} {stats.get(key, 0)}"]
    lines += ["# TYPE orbitkv_refengine_up gauge", f"orbitkv_refengine_up {1 if alive else 0}"]
    return "\n".join(lines) + "\n"


class BadRequest(ValueError):
    pass


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_completion(body: Dict[str, Any], vocab: int) -> Tuple[List[int], int, bool, Dict[str, Any]]:
    """(prompt ids, max_tokens, stream, extras) from a /v1/completions body."""
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif _is_ids(prompt):
        ids = prompt
    else:
        raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)")
    return _sampling(body, ids, vocab, body.get("max_tokens", 16))


def chat_prompt(messages: Any) -> str:
    """The refengine's chat template: one "role: content" line per message, then
    "assistant: " (the byte tokenizer has no special tokens). Content is a string or a list
    of {"type": "text", "text": ...} parts."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    lines = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message needs a string role")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest("message content parts must be {\"type\": \"text\", \"text\": ...}")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest("message content must be a string or a list of text parts")
        lines.append(f"{m['role']}: {content}\n")
    return "".join(lines) + "assistant: "


def parse_chat(body: Dict[str, Any], vocab: int) -> Tuple[List[int], int, bool, Dict[str, Any]]:
    """(prompt ids, max_tokens, stream, extras) from a /v1/chat/completions body: the
    messages through chat_prompt and the byte tokenizer, or, as an extension, the token ids
    of `prompt_token_ids` as they are (then messages are not read)."""
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    if "prompt_token_ids" in body:
        ids = body["prompt_token_ids"]
        if not _is_ids(ids):
            raise BadRequest("prompt_token_ids must be a list of token ids")
    else:
        ids = tokenizer.encode(chat_prompt(body.get("messages")))
    return _sampling(body, ids, vocab, body.get("max_completion_tokens", body.get("max_tokens", 16)))


def _sampling(body: Dict[str, Any], ids: List[int], vocab: int,
              max_tokens: Any) -> Tuple[List[int], int, bool, Dict[str, Any]]:
    if not ids:
        raise BadRequest("prompt is empty")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise BadRequest(f"token ids must be in [0, {vocab}); got {bad[:3]}")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer")
    temperature = body.get("temperature", 0)
    if temperature not in (None, 0, 0.0):
        raise BadRequest("refengine samples greedily: temperature must be 0")
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean")
    extras = {"kv_transfer_params": body.get("kv_transfer_params")}
    return ids, max_tokens, stream, extras


def usage(info: Dict[str, Any]) -> Dict[str, Any]:
    p, c = info["prompt_tokens"], info["completion_tokens"]
    local, restored = info["prefix_cache_hit_tokens"], info["restored_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": local + restored},
            "orbitkv_prefix_cache_hit_tokens": local, "orbitkv_restored_tokens": restored,
            "orbitkv_readmission_restored_tokens": info.get("readmission_restored_tokens", 0)}


# A client that closes or resets its connection (a keep-alive connection it is done with, a
# benchmark driver that stops): not an error of the server.
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _text_choice(tokens: List[int], finish_reason: Optional[str]) -> Dict[str, Any]:
    return {"index": 0, "text": tokenizer.decode(tokens), "token_ids": list(tokens),
            "logprobs": None, "finish_reason": finish_reason}


def _chat_choice(tokens: List[int], finish_reason: Optional[str]) -> Dict[str, Any]:
    return {"index": 0, "message": {"role": "assistant", "content": tokenizer.decode(tokens)},
            "token_ids": list(tokens), "logprobs": None, "finish_reason": finish_reason}


def _chat_delta(tokens: List[int], finish_reason: Optional[str]) -> Dict[str, Any]:
    delta = {"content": tokenizer.decode(tokens)} if tokens else {}
    return {"index": 0, "delta": delta, "token_ids": list(tokens), "logprobs": None,
            "finish_reason": finish_reason}


@dataclasses.dataclass(frozen=True)
class _Shape:
    """How one route reads a request and writes its answer (object names, choices)."""
    parse: Callable[[Dict[str, Any], int], Tuple[List[int], int, bool, Dict[str, Any]]]
    object: str
    chunk_object: str
    choice: Callable[[List[int], Optional[str]], Dict[str, Any]]
    delta: Callable[[List[int], Optional[str]], Dict[str, Any]]
    first_delta: Optional[Callable[[], Dict[str, Any]]] = None


ROUTES = {
    "/v1/completions": _Shape(parse_completion, "text_completion", "text_completion", _text_choice, _text_choice),
    "/v1/chat/completions": _Shape(
        parse_chat, "chat.completion", "chat.completion.chunk", _chat_choice, _chat_delta,
        lambda: {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}),
}


class CompletionServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, loop: EngineLoop, model_name: str, vocab: int,
                 request_timeout_s: float = 600.0, socket_timeout_s: float = 60.0):
        self.loop = loop
        self.model_name = model_name
        self.vocab = vocab
        self.request_timeout_s = request_timeout_s
        self.socket_timeout_s = socket_timeout_s
        self.clients_gone = 0  # connections that ended in a reset or broken pipe (no traceback)
        self._gone_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def handle_error(self, request, client_address):
        """socketserver prints a traceback for any exception a handler raises; a client gone
        away is counted instead (its request, if any, was aborted by the handler)."""
        if isinstance(sys.exc_info()[1], CLIENT_GONE):
            with self._gone_lock:
                self.clients_gone += 1
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _ClientGone(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CompletionServer

    def setup(self):
        self.timeout = self.server.socket_timeout_s
        super().setup()

    def log_message(self, fmt, *args):  # quiet: the engine's metrics say what happened
        pass

    # -- routes ---------------------------------------------------------------------------
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        loop = self.server.loop
        if path == "/health":
            if loop.alive():
                self._json(200, {"status": "ok"})
            else:
                self._json(503, {"status": "error", "error": (loop.error or "stopped")[-2000:]})
        elif path == "/metrics":
            self._send(200, render_metrics(loop.stats(), loop.alive()).encode(),
                       "text/plain; version=0.0.4")
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model"}]})
        else:
            self._error(404, f"no route {path}")

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_json()
            if path not in ROUTES:
                return self._error(404, f"no route {path}")
            self.shape = ROUTES[path]
            ids, max_tokens, stream, extras = self.shape.parse(body, self.server.vocab)
            h = self.server.loop.submit(ids, max_tokens, extras["kv_transfer_params"])
        except BadRequest as e:
            return self._error(400, str(e))
        except EngineDead as e:
            return self._error(503, f"engine unavailable: {e}")
        try:
            (self._stream if stream else self._complete)(h)
        except (_ClientGone, OSError):
            self.server.loop.abort(h.request_id)
            self.close_connection = True

    # -- completions ----------------------------------------------------------------------
    def _complete(self, h: RequestHandle) -> None:
        tokens: List[int] = []
        for kind, payload in self._events(h):
            if kind == "tokens":
                tokens += payload
            elif kind == "error":
                return self._error(payload["code"], payload["message"])
            else:
                out = self._envelope(h, [self.shape.choice(tokens, payload["finish_reason"])])
                out["usage"] = usage(payload)
                if payload.get("kv_transfer_params") is not None:
                    out["kv_transfer_params"] = payload["kv_transfer_params"]
                return self._json(200, out)

    def _stream(self, h: RequestHandle) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.shape.first_delta is not None:  # chat: the role comes first, on its own
            self._sse(self._envelope(h, [self.shape.first_delta()], chunk=True))
        for kind, payload in self._events(h):
            if kind == "tokens":
                self._sse(self._envelope(h, [self.shape.delta(payload, None)], chunk=True))
            elif kind == "error":
                self._sse({"error": {"message": payload["message"], "type": "server_error",
                                     "code": payload["code"]}})
                break
            else:
                chunk = self._envelope(h, [self.shape.delta([], payload["finish_reason"])], chunk=True)
                chunk["usage"] = usage(payload)
                self._sse(chunk)
                break
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _events(self, h: RequestHandle):
        """Yield the request's events until done/error; abort on deadline or a gone client."""
        now = time.monotonic()
        deadline, next_check = now + self.server.request_timeout_s, now + CLIENT_CHECK_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                self.server.loop.abort(h.request_id)
                yield "error", {"code": 504, "message":
                                f"deadline: request took longer than {self.server.request_timeout_s:g} s"}
                return
            if now >= next_check:
                next_check = now + CLIENT_CHECK_S
                if self._client_gone():
                    raise _ClientGone()
            try:
                kind, payload = h.events.get(timeout=min(CLIENT_CHECK_S, deadline - now))
            except queue.Empty:
                continue
            yield kind, payload
            if kind != "tokens":
                return

    def _envelope(self, h: RequestHandle, choices, chunk: bool = False) -> Dict[str, Any]:
        return {"id": h.request_id, "object": self.shape.chunk_object if chunk else self.shape.object,
                "created": int(time.time()), "model": self.server.model_name, "choices": choices}

    # -- plumbing -------------------------------------------------------------------------
    def _read_json(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        if n <= 0 or n > MAX_BODY_BYTES:
            raise BadRequest(f"Content-Length must be in 1..{MAX_BODY_BYTES}")
        try:
            return json.loads(self.rfile.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"body is not JSON: {e}") from None

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _sse(self, obj: Dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json")

    def _error(self, code: int, message: str) -> None:
        kind = "invalid_request_error" if code == 400 else "server_error"
        self._json(code, {"error": {"message": message, "type": kind, "code": code}})

    def _send(self, code: int, data: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

