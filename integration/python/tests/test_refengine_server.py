"""The reference engine's OpenAI-compatible server and CLI."""

import glob
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from orbitkv.refengine import PRESETS, engine_config
from orbitkv.refengine.engine import Engine
from orbitkv.refengine.service import Service
from tests.test_refengine import bit_exact

V = PRESETS["tiny"].vocab
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(**kw):
    kw.setdefault("kv_tokens", 4096)
    return engine_config("tiny", block_size=4, page_tokens=16, **kw)


@pytest.fixture
def svc():
    with Service(tiny()) as s:
        yield s


def post(svc, body, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, (json.loads(data) if r.getheader("Content-Type", "").startswith("application/json") else data)


def get(svc, path):
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data


def metrics(svc):
    _, text = get(svc, "/metrics")
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def stream(svc, body):
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    events = [l[len(b"data: "):] for l in r.read().split(b"\n\n") if l.startswith(b"data: ")]
    c.close()
    assert events[-1] == b"[DONE]"
    return [json.loads(e) for e in events[:-1]]


def rand_prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(V) for _ in range(n)]


def test_health_and_models(svc):
    assert get(svc, "/health") == (200, '{"status": "ok"}')
    code, body = get(svc, "/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == "refengine/tiny"
    assert get(svc, "/nope")[0] == 404


@bit_exact
def test_completion_matches_the_engine_and_reports_cache_hits(svc):
    ids = rand_prompt(50, 1)
    with Engine(tiny()) as e:
        want = e.generate([ids], 8)[0]
    code, out = post(svc, {"prompt": ids, "max_tokens": 8})
    assert code == 200, out
    ch = out["choices"][0]
    assert ch["token_ids"] == want and ch["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == 50 and out["usage"]["completion_tokens"] == 8
    assert out["usage"]["orbitkv_restored_tokens"] == 0
    code, again = post(svc, {"prompt": ids, "max_tokens": 8})
    assert again["choices"][0]["token_ids"] == want
    assert again["usage"]["orbitkv_prefix_cache_hit_tokens"] == 48
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
    m = metrics(svc)
    assert m["orbitkv_refengine_prefix_cache_hit_tokens_total"] == 48
    assert m["orbitkv_refengine_requests_finished_total"] == 2
    assert m["orbitkv_refengine_kv_usage_ratio"] == 0.0


def test_string_prompt_is_byte_tokenized(svc):
    code, out = post(svc, {"prompt": "Hello, OrbitKV!", "max_tokens": 4})
    assert code == 200 and out["usage"]["prompt_tokens"] == len("Hello, OrbitKV!")
    code, out2 = post(svc, {"prompt": list(b"Hello, OrbitKV!"), "max_tokens": 4})
    assert out2["choices"][0]["text"] == out["choices"][0]["text"]


@bit_exact
def test_streaming_sends_each_token_then_usage_and_done(svc):
    ids = rand_prompt(30, 2)
    _, plain = post(svc, {"prompt": ids, "max_tokens": 6})
    chunks = stream(svc, {"prompt": ids, "max_tokens": 6})
    toks = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert toks == plain["choices"][0]["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert len(chunks) == 7 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def post_to(svc, path, body, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data, ctype = r.read(), r.getheader("Content-Type", "")
    c.close()
    if ctype == "text/event-stream":
        events = [l[len(b"data: "):] for l in data.split(b"\n\n") if l.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        return r.status, [json.loads(e) for e in events[:-1]]
    return r.status, json.loads(data)


def test_chat_completions_with_token_ids_or_text(svc):
    """/v1/chat/completions: `prompt_token_ids` (an extension) are the prompt as they are;
    messages go through the chat template and the byte tokenizer. Both answer like
    /v1/completions of the same prompt, streamed or not."""
    from orbitkv.refengine.server import chat_prompt
    ids = rand_prompt(40, 5)
    _, ref = post(svc, {"prompt": ids, "max_tokens": 5})
    want = ref["choices"][0]["token_ids"]
    code, out = post_to(svc, "/v1/chat/completions", {"prompt_token_ids": ids, "max_tokens": 5})
    assert code == 200, out
    assert out["object"] == "chat.completion" and out["usage"]["prompt_tokens"] == 40
    ch = out["choices"][0]
    assert ch["token_ids"] == want and ch["message"] == {"role": "assistant", "content": ref["choices"][0]["text"]}
    assert ch["finish_reason"] == "length"

    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "OrbitKV"}]}]
    text = chat_prompt(msgs)
    assert text == "system: Be brief.\nuser: Hello, OrbitKV\nassistant: "
    _, ref = post(svc, {"prompt": text, "max_tokens": 4})
    code, out = post_to(svc, "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 4})
    assert code == 200 and out["choices"][0]["token_ids"] == ref["choices"][0]["token_ids"]
    assert out["usage"]["prompt_tokens"] == len(text.encode())

    code, chunks = post_to(svc, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "stream": True})
    assert code == 200 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == out["choices"][0]["message"]["content"]
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == out["choices"][0]["token_ids"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 4

    for bad, msg in [({"messages": []}, "messages must be"), ({"messages": [{"content": "x"}]}, "string role"),
                     ({"messages": [{"role": "user", "content": 3}]}, "content must be"),
                     ({"prompt_token_ids": [1, "a"]}, "prompt_token_ids must be"),
                     ({"prompt_token_ids": [V]}, "token ids must be in")]:
        code, out = post_to(svc, "/v1/chat/completions", bad)
        assert code == 400 and msg in out["error"]["message"], (bad, out)


@bit_exact
def test_concurrent_clients_get_their_serial_outputs(svc):
    ps = [rand_prompt(10 + 13 * i, 100 + i) for i in range(8)]
    with Engine(tiny()) as e:
        want = [e.generate([p], 12)[0] for p in ps]
    got = [None] * len(ps)

    def run(i):
        if i % 2:
            got[i] = [t for c in stream(svc, {"prompt": ps[i], "max_tokens": 12}) for t in c["choices"][0]["token_ids"]]
        else:
            got[i] = post(svc, {"prompt": ps[i], "max_tokens": 12})[1]["choices"][0]["token_ids"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == want


@pytest.mark.parametrize("body,msg", [
    ({"prompt": [], "max_tokens": 1}, "prompt"),
    ({"prompt": {"x": 1}}, "prompt"),
    ({"prompt": [V], "max_tokens": 1}, "token ids"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "temperature": 0.7}, "temperature"),
    ({"prompt": "hi", "max_tokens": 5000}, "exceed the KV pool"),
])
def test_bad_requests_get_400(svc, body, msg):
    code, out = post(svc, body)
    assert code == 400 and msg in out["error"]["message"]
    assert get(svc, "/health")[0] == 200


def _raw_request(svc, body):
    s = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "plain"])
def test_client_disconnect_aborts_the_request_and_frees_its_blocks(svc, streamed):
    s = _raw_request(svc, {"prompt": rand_prompt(20, 3), "max_tokens": 3000, "stream": streamed})
    if streamed:
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    else:
        wait_for(lambda: metrics(svc)["orbitkv_refengine_requests_running"] == 1)
    s.close()
    wait_for(lambda: metrics(svc)["orbitkv_refengine_requests_aborted_total"] == 1)
    m = metrics(svc)
    assert m["orbitkv_refengine_kv_blocks_free"] == m["orbitkv_refengine_kv_blocks"]
    assert m["orbitkv_refengine_generation_tokens_total"] < 3000


def test_client_reset_on_a_keepalive_connection_prints_no_traceback(svc, capfd):
    """A client that resets its keep-alive connection after a response (or before its
    answer is written) is counted, not reported as a server error with a traceback."""
    for req in (b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
        s.sendall(req)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.close()
    wait_for(lambda: getattr(svc.server, "clients_gone", 0) >= 2)
    assert "Traceback" not in capfd.readouterr().err
    assert get(svc, "/health")[0] == 200


def test_request_deadline():
    with Service(tiny(), request_timeout_s=0.3) as s:
        code, out = post(s, {"prompt": [1, 2, 3], "max_tokens": 4000})
        assert code == 504 and "deadline" in out["error"]["message"]
        wait_for(lambda: metrics(s)["orbitkv_refengine_requests_aborted_total"] == 1)


def test_cli_serves_and_cleans_up_on_sigterm():
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-m", "orbitkv.refengine", "--preset", "tiny", "--port", "0",
                          "--kv-tokens", "512", "--block-size", "4", "--page-tokens", "16"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        line = p.stdout.readline().decode()
        assert line.startswith("refengine listening on http://127.0.0.1:"), (line, p.stderr.read())
        port = int(line.rsplit(":", 1)[1])
        assert glob.glob(f"/dev/shm/orbitkv-refengine-{p.pid}-*")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "abc", "max_tokens": 3}))
        assert json.loads(c.getresponse().read())["usage"]["completion_tokens"] == 3
        c.close()
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        assert not glob.glob(f"/dev/shm/orbitkv-refengine-{p.pid}-*")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_rejects_bad_flags():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "orbitkv.refengine", "--block-size", "16", "--page-tokens", "24",
                        "--port", "0"], capture_output=True, env=env, timeout=60)
    assert r.returncode == 2 and b"multiple of block_size" in r.stderr
    r = subprocess.run([sys.executable, "-m", "orbitkv.refengine", "--connector", "orbitkv"],
                       capture_output=True, env=env, timeout=60)
    assert r.returncode == 2 and b"--orbitkv-socket" in r.stderr
