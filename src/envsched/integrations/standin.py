"""Stand-ins for CPU tests and examples of TRL's ``AsyncGRPOTrainer`` -- not for training.

:class:`StandInVLLMServer` stands in for a vLLM server; :func:`digit_share` (a reward) and :class:`ResetLog`
(an environment) are module-level, so TRL's spawned rollout worker can unpickle them by reference.

TRL's asynchronous rollout worker (``trl.experimental.async_grpo.async_rollout_worker``) talks to ``vllm serve``
over HTTP; its trainer reads the model length and pauses/resumes the server around weight syncs. This module
serves a Hugging Face causal LM with plain transformers on CPU, speaking exactly the part of that protocol
TRL 1.16.0 uses:

* ``GET /health`` -> 200.
* ``GET /v1/models`` -> ``{"data": [{"id", "max_model_len"}]}`` (the trainer's default ``token_budget``).
* ``POST /v1/completions`` with ``{"model", "prompt": [token ids], "max_tokens", "temperature", "top_p",
  "top_k", "repetition_penalty", "n": 1, "return_token_ids": true, "logprobs": 0, "seed", ["min_p"]}``
  -> ``{"choices": [{"token_ids": [...], "logprobs": {"token_logprobs": [...]}, "finish_reason"}]}``.
  Sampling is seeded by the request's ``seed``; the log-probabilities are of the raw model distribution
  (vLLM's default ``raw_logprobs``). ``repetition_penalty`` other than 1 and ``n`` other than 1 are refused
  (400): the worker sends neither by default.
* ``POST /pause`` / ``POST /resume``: generation waits while paused.

Weights: :class:`StandInWeightTransfer` implements TRL's ``WeightTransferProtocol`` by copying the trainer's
parameters into the served model in memory (the server runs in the trainer's process, on a thread), where a
real deployment streams them over NCCL.

``delay`` (a callable of the request number) lets a test hold individual requests back, so groups finish late and
out of order the way they do against a busy server.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

__all__ = ["ResetLog", "StandInVLLMServer", "StandInWeightTransfer", "digit_share"]



class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a trainer shutting down its rollout worker) ends its connection without a traceback
    on stderr; any other error of a request is printed as ``http.server`` prints it."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

class StandInVLLMServer:
    """Serve ``model_path`` (a local transformers causal LM) on ``http://127.0.0.1:<port>`` from a thread.

    Args:
        model_path: directory with the model and its config (loaded with ``AutoModelForCausalLM``).
        port: 0 picks a free port (see :attr:`url`).
        max_model_len: reported on ``/v1/models`` (default: the model's ``max_position_embeddings``).
        delay: ``delay(request_number) -> seconds`` to sleep before generating (injected latency; default none).

    Use as a context manager, or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, model_path: str, *, port: int = 0, max_model_len: int | None = None,
                 delay: Callable[[int], float] | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.model_path = str(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, attn_implementation="eager")
        self.model.eval()
        cfg = self.model.config
        self.max_model_len = int(max_model_len or getattr(cfg, "max_position_embeddings", 2048))
        eos = self.model.generation_config.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.delay = delay
        self.requests = 0
        self._lock = threading.Lock()  # one forward pass (or one weight copy) at a time
        self._running = threading.Event()
        self._running.set()
        self._counter = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    #: seconds between the serving loop's checks for :meth:`stop` (``serve_forever``'s default, 0.5 s, is what every
    #: ``stop`` would wait)
    poll_interval: float = 0.05

    def start(self) -> StandInVLLMServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": self.poll_interval},
                                        name="vllm-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._running.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> StandInVLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ weights (used by StandInWeightTransfer)
    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def load_weights(self, named: Iterator[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs into the served model (names as in its ``named_parameters``);
        returns how many were copied. An unknown name or a shape mismatch raises ``KeyError``/``ValueError``."""
        params = dict(self.model.named_parameters())
        n = 0
        with self._lock, torch.no_grad():
            for name, tensor in named:
                target = params.get(name)
                if target is None:
                    raise KeyError(f"the served model has no parameter {name!r}")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != served {tuple(target.shape)}")
                target.copy_(tensor.detach().to(target.device, target.dtype))
                n += 1
        return n

    # ------------------------------------------------------------------ generation
    def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One ``/v1/completions`` request (see the module docstring); ``ValueError`` on what is not served."""
        prompt = payload.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("'prompt' must be a non-empty list of token ids")
        if int(payload.get("n", 1)) != 1:
            raise ValueError("the stand-in serves n=1 only")
        if float(payload.get("repetition_penalty", 1.0)) != 1.0:
            raise ValueError("the stand-in does not implement repetition_penalty")
        max_tokens = int(payload.get("max_tokens", 16))
        temperature = float(payload.get("temperature", 1.0))
        top_k = int(payload.get("top_k", 0) or 0)
        top_p = float(payload.get("top_p", 1.0))
        min_p = payload.get("min_p")
        gen = torch.Generator().manual_seed(int(payload.get("seed", 0)) % (2**63))
        with self._counter:
            number = self.requests
            self.requests += 1
        if self.delay is not None:
            time.sleep(max(0.0, float(self.delay(number))))
        out_ids: list[int] = []
        out_lps: list[float] = []
        finish = "length"
        past = None
        step_ids = torch.tensor([prompt])
        for _ in range(max(0, min(max_tokens, self.max_model_len - len(prompt)))):
            self._running.wait()  # a paused server holds requests between tokens (weights may change)
            with self._lock, torch.no_grad():
                o = self.model(input_ids=step_ids, past_key_values=past, use_cache=True)
            past = o.past_key_values
            logits = o.logits[0, -1].float()
            raw = torch.log_softmax(logits, -1)
            if temperature <= 0:
                tok = int(torch.argmax(logits))
            else:
                probs = torch.softmax(logits / temperature, -1)
                if top_k > 0:
                    kth = torch.topk(probs, min(top_k, probs.numel())).values[-1]
                    probs = torch.where(probs < kth, 0.0, probs)
                if min_p is not None:
                    probs = torch.where(probs < float(min_p) * probs.max(), 0.0, probs)
                if top_p < 1.0:
                    sp, si = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sp, 0) - sp < top_p * sp.sum()
                    probs = torch.zeros_like(probs).scatter(0, si, torch.where(keep, sp, 0.0))
                tok = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
            out_ids.append(tok)
            out_lps.append(float(raw[tok]))
            if tok in self.eos_token_ids:
                finish = "stop"
                break
            step_ids = torch.tensor([[tok]])
        return {"id": f"cmpl-{number}", "object": "text_completion", "model": payload.get("model"),
                "choices": [{"index": 0, "text": "", "token_ids": out_ids, "finish_reason": finish,
                             "logprobs": {"token_logprobs": out_lps}}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/health":
                    self._reply(200, {})
                elif path == "/v1/models":
                    self._reply(200, {"object": "list", "data": [{"id": server.model_path, "object": "model",
                                                                   "max_model_len": server.max_model_len}]})
                else:
                    self._reply(404, {"error": f"no route {path}"})

            def do_POST(self) -> None:
                path = self.path.split("?")[0]
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    payload = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError as e:
                    self._reply(400, {"error": f"bad JSON: {e}"})
                    return
                if path == "/v1/completions":
                    try:
                        self._reply(200, server.complete(payload))
                    except ValueError as e:
                        self._reply(400, {"error": str(e)})
                elif path == "/pause":
                    server.pause()
                    self._reply(200, {})
                elif path == "/resume":
                    server.resume()
                    self._reply(200, {})
                else:
                    self._reply(404, {"error": f"no route {path}"})

        return Handler


class StandInWeightTransfer:
    """TRL's ``WeightTransferProtocol`` for a :class:`StandInVLLMServer` in the same process: ``send_weights``
    copies each parameter into the served model (in memory, where vLLM receives them over NCCL)."""

    def __init__(self, server: StandInVLLMServer) -> None:
        self.server = server
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        self.server.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.server.load_weights(iterator)
        self.syncs += 1

    def resume(self) -> None:
        self.server.resume()

    def destroy(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------- toys
def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))


def digit_share(completions: Sequence[Any], task_id: Sequence[str] | None = None,
                constant_tasks: Sequence[str] = (), **kwargs: Any) -> list[float]:
    """Share of digit characters in each completion (0 for an empty one); a task in ``constant_tasks`` gets 0.5
    for every completion instead (a group without signal, for zero-signal filtering tests)."""
    out = []
    for i, c in enumerate(completions):
        if task_id is not None and task_id[i] in constant_tasks:
            out.append(0.5)
            continue
        text = _text(c)
        out.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return out


class ResetLog:
    """An environment that only records the task each rollout was reset with: one line (the ``task_id``) per
    ``reset`` appended to ``path``. No tools, no reward, no observation."""

    def __init__(self, path: str) -> None:
        self.path = path

    def reset(self, task_id: str, **row: Any) -> None:
        with open(self.path, "a") as f:
            f.write(task_id + "\n")
