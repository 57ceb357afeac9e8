"""Evaluation throughput: episodes per second of EvalHarness against envsched's OpenEnv server (WebSocket
episodes on 127.0.0.1) and reasoning-gym in process, with an instant local OpenAI-compatible policy stub,
so the figure is the harness + environment overhead, not model latency.

    nice python benchmarks/eval_throughput.py [--tasks 200] [--concurrency 1 4]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _stub(answer_of):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            q = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
            raw = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer_of(q)}}],
                              "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args()

    from envsched.envs.openenv import OpenEnvEnvironment, TaskAPIClient
    from envsched.envs.openenv_server import ServerThread, make_app
    from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool, regenerate_item
    from envsched.evaluation import ChatCompletionsPolicy, EvalHarness
    from envsched.pool.pool import TaskPool

    pool = TaskPool([{"id": f"q{i}", "env": "qa", "split": "test",
                      "initial_state": {"question": f"Repeat {i}", "answer": str(i)}} for i in range(args.tasks)])
    rg = build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=args.tasks, split="test")
    answers = {str(regenerate_item(t)["question"]): str(regenerate_item(t)["answer"]) for t in rg}
    stub, url = _stub(lambda q: answers.get(q) or q.split()[-1])
    policy = ChatCompletionsPolicy(url, "stub")
    with ServerThread(make_app(pool, max_concurrent_envs=16)) as srv:
        for c in args.concurrency:
            h = EvalHarness(lambda: OpenEnvEnvironment(srv.url), policy, TaskAPIClient(srv.url, "envsched_pool"),
                            concurrency=c, check_reproducibility=False)
            t = time.perf_counter()
            r = h.run()
            dt = time.perf_counter() - t
            print(f"openenv ws   concurrency={c}: {args.tasks} episodes in {dt:.2f}s = {args.tasks / dt:.1f} ep/s "
                  f"(success_rate {r.scores['success_rate']:.2f})")
    for c in args.concurrency:
        h = EvalHarness(ReasoningGymEnvironment, policy, rg, concurrency=c, check_reproducibility=False)
        t = time.perf_counter()
        r = h.run()
        dt = time.perf_counter() - t
        print(f"reasoning_gym concurrency={c}: {args.tasks} episodes in {dt:.2f}s = {args.tasks / dt:.1f} ep/s "
              f"(success_rate {r.scores['success_rate']:.2f})")
    stub.shutdown()


if __name__ == "__main__":
    main()
