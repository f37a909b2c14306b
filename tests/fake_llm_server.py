"""A scripted LLM server on 127.0.0.1 speaking the OpenAI and Anthropic wire formats.

The real `openai` / `anthropic` SDKs are pointed at it, so the tests exercise the real
client code without a network. Each request pops the next scripted step:

    "text"                                  -> a normal answer with this text
    {"text": "...", "truncated": True}      -> an answer cut off by the token limit
    {"status": 429, "retry_after": 0.2}     -> an HTTP error (any status), optional retry-after
    {"hang": 5}                             -> sleep 5 s before answering (past the client timeout)
    {"malformed": True}                     -> a 200 whose body is not JSON

Every request is recorded (path, headers, JSON body) in `server.requests`; helpers give the
text of the prompt the server received. Also runnable: `python tests/fake_llm_server.py
SCRIPT.json` prints the port and serves until killed.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_ANSWER = "I have nothing more to say."


class FakeLLMServer:
    def __init__(self, script: list[Any] | None = None):
        self.script: list[Any] = list(script or [])
        self.requests: list[dict] = []
        self.responder = None  # optional: body -> step, instead of the script (concurrent clients)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    # -- lifecycle
    def __enter__(self) -> "FakeLLMServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- script
    def push(self, *steps: Any) -> None:
        with self._lock:
            self.script.extend(steps)

    def _next_step(self) -> Any:
        with self._lock:
            return self.script.pop(0) if self.script else DEFAULT_ANSWER

    # -- what the server received
    def prompt_text(self, index: int = -1) -> str:
        """All message text of request `index` (system prompt included), joined."""
        body = self.requests[index]["body"]
        parts = []
        if isinstance(body.get("system"), str):
            parts.append(body["system"])
        elif isinstance(body.get("system"), list):
            parts += [block.get("text", "") for block in body["system"]]
        for message in body.get("messages", []):
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            else:
                parts += [block.get("text", "") for block in content or []]
        return "\n".join(parts)

    def last_user_message(self, index: int = -1) -> str:
        messages = self.requests[index]["body"]["messages"]
        content = [m for m in messages if m["role"] == "user"][-1]["content"]
        return content if isinstance(content, str) else "\n".join(b.get("text", "") for b in content)


def _handler_for(server: FakeLLMServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                body = {"_raw": raw.decode(errors="replace")}
            with server._lock:
                server.requests.append({"path": self.path, "body": body,
                                        "headers": {k.lower(): v for k, v in self.headers.items()}})
            if self.path.rstrip("/").endswith("/chat/completions"):
                wire = "openai"
            elif self.path.rstrip("/").endswith("/messages"):
                wire = "anthropic"
            else:
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            step = server.responder(body) if server.responder else server._next_step()
            if isinstance(step, str):
                step = {"text": step}
            if "hang" in step:
                time.sleep(step["hang"])
                step = {k: v for k, v in step.items() if k != "hang"} or {"text": DEFAULT_ANSWER}
            if step.get("malformed"):
                return self._send_raw(200, b'{"id": "x", "choices": [ {"mess', "application/json")
            if "status" in step:
                headers = {}
                if "retry_after" in step:
                    headers["retry-after"] = str(step["retry_after"])
                return self._send(step["status"], _error_body(wire, step["status"]), headers)
            text = step.get("text", DEFAULT_ANSWER)
            prompt_chars = len(json.dumps(body.get("messages", [])))
            usage = (max(1, prompt_chars // 4), max(1, len(text) // 4))
            payload = (_openai_answer(body, text, step.get("truncated", False), usage) if wire == "openai"
                       else _anthropic_answer(body, text, step.get("truncated", False), usage))
            self._send(200, payload)

        def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
            self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

        def _send_raw(self, status: int, data: bytes, content_type: str, headers: dict | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                pass

    return Handler


def _error_body(wire: str, status: int) -> dict:
    kind = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error"}.get(
        status, "api_error")
    message = f"scripted error {status}"
    if wire == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": None}}


def _openai_answer(body: dict, text: str, truncated: bool, usage: tuple[int, int]) -> dict:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "length" if truncated else "stop", "logprobs": None}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                  "total_tokens": usage[0] + usage[1]},
    }


def _anthropic_answer(body: dict, text: str, truncated: bool, usage: tuple[int, int]) -> dict:
    return {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model", "fake"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens" if truncated else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


if __name__ == "__main__":  # pragma: no cover - manual use
    steps = json.load(open(sys.argv[1])) if len(sys.argv) > 1 else []
    with FakeLLMServer(steps) as fake:
        print(fake.port, flush=True)
        threading.Event().wait()
