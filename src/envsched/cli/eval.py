"""``envsched eval SPEC``: evaluate a checkpoint served behind an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import click

from envsched.cli.common import (
    MAX_BACKOFF_S,
    MAX_CONCURRENCY,
    MAX_EPISODE_TIMEOUT_S,
    MAX_EVAL_SEEDS,
    MAX_RETRIES,
    MAX_SAMPLES_PER_TASK,
    MAX_SEED,
    MAX_TASKS,
    MAX_TEMPERATURE,
    MAX_THRESHOLD,
    MAX_TOKENS,
    MAX_TURNS,
    float_range,
    int_range,
    shown,
)

__all__ = ["eval_cmd", "resolve_spec"]

_URL = re.compile(r"^(https?|wss?)://", re.I)
_HOSTPORT = re.compile(r"^[\w.-]+:\d+(/.*)?$")


def resolve_spec(spec: str, *, split: str, num_tasks: int = 100, env_name: str | None = None,
                 message_timeout_s: float = 60.0, base_url: str | None = None,
                 dataset_config: dict[str, Any] | None = None, system_prompt: str | None = None) -> dict[str, Any]:
    """Map an environment SPEC to ``{env_factory, tasks, adapter, kind}``.

    Forms: an OpenEnv server (``http(s)://host:port[/path]``, ``ws(s)://.../ws``, ``host:port``);
    ``reasoning_gym:DATASET[,DATASET...]`` (run in process, ``num_tasks`` generated items per dataset);
    ``bfcl[:CATEGORY[,CATEGORY...]]`` (BFCL multi-turn in process).

    With ``base_url`` (``openenv eval``'s ``--base-url``) the episodes run on that OpenEnv server whatever
    the SPEC: ``family:variant`` then keeps the server's tasks whose ``group`` is the variant (all of
    them when no task has a ``group``), a bare name is the Task API environment name, a URL must name the
    same server. ``dataset_config`` (``--dataset-config``) goes to the server's ``reset`` with
    ``dataset_name`` as ``openenv collect`` sends them (a server whose ``reset`` does not declare them
    drops them), and configures in-process ``reasoning_gym:`` datasets.
    """
    from envsched.evaluation.policy import AnswerAdapter, FunctionCallAdapter

    if not isinstance(spec, str) or not spec.strip():
        raise click.BadParameter("SPEC is empty", param_hint="SPEC")
    spec = spec.strip()
    is_url = bool(_URL.match(spec) or _HOSTPORT.match(spec))
    family, _, variant = spec.partition(":")
    family = family.lower().replace("-", "_")
    if is_url or base_url is not None:
        from envsched.cli.common import require_extra

        require_extra("openenv", f"evaluating on an OpenEnv server ({base_url or spec})")  # one line, before work
        from envsched.envs.openenv import OpenEnvEnvironment, TaskAPIClient, http_base_url

        try:
            base = http_base_url(base_url if base_url is not None else spec)
            if is_url and base_url is not None and http_base_url(spec) != base:
                raise click.UsageError(f"SPEC {spec!r} and --base-url {base_url!r} name two different servers; "
                                       "give the server once")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--base-url" if base_url else "SPEC") from None
        group = None
        if not is_url and variant:
            group = variant
        elif not is_url and not variant:
            if env_name is not None and env_name != spec:
                raise click.UsageError(f"SPEC {spec!r} and --env-name {env_name!r} disagree")
            env_name = spec
        name = env_name or _single_env(base)
        client = TaskAPIClient(base, name)
        reset_kwargs: dict[str, Any] = {}
        if dataset_config is not None:
            reset_kwargs = {"dataset_name": variant or None, "dataset_config": dataset_config}

        def factory() -> OpenEnvEnvironment:
            return OpenEnvEnvironment(base, name, message_timeout_s=message_timeout_s, reset_kwargs=reset_kwargs)

        tasks: Any = client if group is None else _group_tasks(client, split, group, spec)
        return {"env_factory": factory, "tasks": tasks, "adapter": AnswerAdapter(system_prompt), "kind": "openenv",
                "base_url": base, "env_name": name}
    if family in ("reasoning_gym", "rg"):
        names = [v.strip() for v in variant.split(",") if v.strip()]
        if not names:
            raise click.BadParameter("name the dataset(s): reasoning_gym:chain_sum[,gcd...]", param_hint="SPEC")
        if dataset_config is not None:
            return _configured_reasoning_gym(names, dataset_config, split, num_tasks, system_prompt)
        from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool

        try:
            tasks = build_reasoning_gym_pool(names, tasks_per_dataset=num_tasks, split=split)
        except (ValueError, KeyError) as exc:
            raise click.BadParameter(str(exc), param_hint="SPEC") from None
        return {"env_factory": ReasoningGymEnvironment, "tasks": tasks, "adapter": AnswerAdapter(system_prompt),
                "kind": "reasoning_gym"}
    if dataset_config is not None:
        raise click.UsageError("--dataset-config applies to reasoning_gym: specs and OpenEnv servers (--base-url)")
    if family == "bfcl":
        from envsched.envs.base import EnvironmentUnavailable
        from envsched.envs.bfcl import BFCLEnvironment, build_bfcl_pool

        cats = [v.strip() for v in variant.split(",") if v.strip()] or None
        try:
            tasks = build_bfcl_pool(cats, split=split, limit=num_tasks)
        except EnvironmentUnavailable as exc:
            raise click.ClickException(str(exc)) from None
        except (ValueError, KeyError) as exc:
            raise click.BadParameter(str(exc), param_hint="SPEC") from None
        return {"env_factory": BFCLEnvironment, "tasks": tasks, "adapter": FunctionCallAdapter(system_prompt),
                "kind": "bfcl"}
    raise click.BadParameter(
        f"unknown environment spec {spec!r}: use an OpenEnv server URL (http://host:port[/path], ws://.../ws), "
        "reasoning_gym:DATASET[,...] or bfcl[:CATEGORY,...]", param_hint="SPEC")


def _group_tasks(client: Any, split: str, group: str, spec: str) -> list[dict[str, Any]]:
    """The split's tasks whose ``group`` is ``group`` (all of them when no task has a group)."""
    from envsched.envs.base import InfrastructureError

    try:
        tasks = []
        for i, t in enumerate(client.iter_tasks(split)):
            t = dict(t)
            t.setdefault("split", split)
            t.setdefault("index", i)
            t.setdefault("env", client.env_name)
            t.setdefault("id", f"{client.env_name}-{split}-{t['index']}")
            tasks.append(t)
    except (InfrastructureError, LookupError, NotImplementedError, ValueError) as exc:
        raise click.ClickException(f"cannot read the {split!r} tasks of {client.base_url}: {exc}") from None
    groups = {t.get("group") for t in tasks} - {None}
    if not groups:
        return tasks
    chosen = [t for t in tasks if t.get("group") == group]
    if not chosen:
        raise click.BadParameter(f"the server's {split!r} tasks have no group {group!r}; its groups are "
                                 f"{sorted(map(str, groups))}", param_hint="SPEC")
    return chosen


def _configured_reasoning_gym(names: list[str], config: dict[str, Any], split: str, num_tasks: int,
                              system_prompt: str | None) -> dict[str, Any]:
    """In-process reasoning-gym with ``openenv collect``'s ``--dataset-config``: ``num_tasks`` items per
    dataset, each generated with that configuration (and a seed from the split and position)."""
    from envsched.envs.openenv_server import SPLIT_SEED_OFFSET, AnswerEnvironment, reasoning_gym_entry
    from envsched.evaluation.policy import AnswerAdapter

    offset = SPLIT_SEED_OFFSET.get(split, 750_000_000)
    tasks = [{"id": f"{name}-{split}-{i}", "env": "reasoning_gym", "split": split, "index": k, "group": name,
              "initial_state": {"reasoning_gym": {"dataset": name, "config": dict(config), "seed": offset + i}}}
             for k, (name, i) in enumerate((n, i) for n in names for i in range(num_tasks))]
    try:
        reasoning_gym_entry(tasks[0])  # the configuration is valid for the dataset
    except Exception as exc:
        raise click.BadParameter(f"reasoning_gym rejected the configuration: {type(exc).__name__}: {exc}",
                                 param_hint="--dataset-config") from None
    return {"env_factory": AnswerEnvironment, "tasks": tasks, "adapter": AnswerAdapter(system_prompt),
            "kind": "reasoning_gym"}


def _single_env(base: str) -> str:
    from envsched.envs.base import InfrastructureError
    from envsched.envs.openenv import TaskAPIClient

    try:
        names = TaskAPIClient.list_environments(base)
    except (InfrastructureError, LookupError) as exc:
        raise click.ClickException(f"cannot list the environments of {base}: {exc}") from None
    if len(names) != 1:
        raise click.ClickException(f"{base} serves {names}; choose one with --env-name")
    return names[0]


_PROVIDER_APIS = {"openai": ("https://api.openai.com/v1", ("OPENAI_API_KEY", "API_KEY")),
                  "anthropic": ("https://api.anthropic.com/v1", ("ANTHROPIC_API_KEY", "API_KEY"))}


def _teacher(provider: str, llm_endpoint: str | None, llm_port: int | None,
             model: str | None) -> tuple[str, str | None]:
    """The endpoint and API key, with ``openenv collect``'s rules: ``--llm-endpoint`` wins (an
    OpenAI-compatible server, ``--llm-port`` added when its URL has no port); otherwise ``--provider``
    picks a hosted API; ``--model`` is required either way."""
    import os

    from envsched.envs.openenv import with_port

    if llm_endpoint is None and provider == "scripted":
        raise click.UsageError("envsched eval evaluates a model: pass --llm-endpoint (an OpenAI-compatible "
                               "server) or --provider openai|anthropic (openenv's scripted teacher only plays "
                               "OpenSpiel games)")
    if not model:
        raise click.BadParameter("--model is required when using a hosted provider or --llm-endpoint.",
                                 param_hint="--model")
    if llm_endpoint is None and llm_port is not None:
        raise click.UsageError("--llm-port is added to --llm-endpoint; it means nothing without it")
    if llm_endpoint is not None:
        try:
            return with_port(llm_endpoint, llm_port), os.environ.get("OPENAI_API_KEY")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--llm-port") from None
    url, names = _PROVIDER_APIS[provider]
    key = next((os.environ[n] for n in names if os.environ.get(n)), None)
    if key is None:
        raise click.BadParameter(f"No API key found for provider={provider!r}. Set one of: {list(names)}",
                                 param_hint="--provider")
    return url, key


def _seeds(values: tuple[str, ...]) -> list[int]:
    out: list[int] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                seed = int(part)
            except ValueError:
                raise click.BadParameter(f"{part!r} is not an integer", param_hint="--seeds") from None
            if not 0 <= seed <= MAX_SEED:
                raise click.BadParameter(f"seeds must lie in 0..{MAX_SEED}, got {part[:40]}", param_hint="--seeds")
            out.append(seed)
            if len(out) > MAX_EVAL_SEEDS:
                raise click.BadParameter(f"at most {MAX_EVAL_SEEDS} seeds", param_hint="--seeds")
    if len(set(out)) != len(out):
        raise click.BadParameter(f"seeds repeat: {out}", param_hint="--seeds")
    return out or [0]


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float):
        return f"{100 * x:.1f}%" if pct else f"{x:.4g}"
    return str(x)


@click.command("eval")
@click.argument("spec")
@click.option("--split", default="test", show_default=True, help="Split to evaluate.")
@click.option("--base-url", default=None,
              help="OpenEnv server the episodes run on (openenv's --base-url); SPEC then names the variant.")
@click.option("--provider", type=click.Choice(["scripted", "openai", "anthropic"]), default="scripted",
              show_default=True,
              help="openenv's teacher provider. openai/anthropic without --llm-endpoint: the provider's "
                   "OpenAI-compatible API (key from OPENAI_API_KEY / ANTHROPIC_API_KEY or API_KEY). "
                   "scripted has no model: pass --llm-endpoint.")
@click.option("--llm-endpoint", default=None, help="OpenAI-compatible endpoint serving the checkpoint.")
@click.option("--llm-port", type=click.IntRange(1, 65535), default=None,
              help="Port added to --llm-endpoint when its URL names none (openenv's --llm-port).")
@click.option("--model", default=None, help="Model name the endpoint knows the checkpoint by.")
@click.option("--output-dir", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where episodes.jsonl and result.json go (an existing run there is resumed).")
@click.option("--num-episodes", "-n", type=int_range(1, MAX_TASKS), default=None,
              help="Run only the first N episodes of the (task, seed, sample) enumeration (openenv's -n).")
@click.option("--dataset-config", default=None,
              help="JSON object: the dataset configuration (reasoning_gym: specs; sent to an OpenEnv "
                   "server's reset as dataset_config, like openenv collect).")
@click.option("--system-prompt", default=None, help="System prompt for the model (replaces the adapter's).")
@click.option("--keep-losses", is_flag=True,
              help="Keep rollouts with reward < 0 (openenv's flag). An evaluation always keeps and scores "
                   "every episode, so this is accepted for command-line compatibility and changes nothing.")
@click.option("--compare", "compare_to", type=click.Path(exists=True, path_type=Path), default=None,
              help="Another result.json (or its folder) to compare with: fixed, regressed, left out.")
@click.option("--samples-per-task", default=1, show_default=True, type=int_range(1, MAX_SAMPLES_PER_TASK),
              help="Completions per (task, seed); pass@k for k up to it.")
@click.option("--seeds", multiple=True, default=("0",), show_default=True,
              help="Episode seeds, comma-separated or repeated.")
@click.option("--limit", type=int_range(1, MAX_TASKS), default=None, help="Only the first N tasks of the split.")
@click.option("--num-tasks", type=int_range(1, MAX_TASKS), default=100, show_default=True,
              help="Tasks generated per dataset / category for in-process specs (reasoning_gym:, bfcl:).")
@click.option("--concurrency", default=1, show_default=True, type=int_range(1, MAX_CONCURRENCY),
              help="Episodes run at once.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Spread episodes over Ray workers (a local Ray, or the cluster at ADDRESS).")
@click.option("--env-name", default=None, help="Task API environment name (OpenEnv servers with several).")
@click.option("--max-turns", default=10, show_default=True, type=int_range(1, MAX_TURNS))
@click.option("--temperature", default=0.0, show_default=True, type=float_range(0.0, MAX_TEMPERATURE))
@click.option("--max-tokens", default=512, show_default=True, type=int_range(1, MAX_TOKENS))
@click.option("--success-threshold", default=1.0, show_default=True,
              type=float_range(-MAX_THRESHOLD, MAX_THRESHOLD))
@click.option("--episode-timeout", default=300.0, show_default=True,
              type=float_range(0.0, MAX_EPISODE_TIMEOUT_S, min_open=True),
              help="Seconds per episode (a timeout is an infrastructure failure).")
@click.option("--retries", default=3, show_default=True, type=int_range(0, MAX_RETRIES),
              help="Retries of an episode after an infrastructure failure (exponential backoff).")
@click.option("--backoff", default=1.0, show_default=True, type=float_range(0.0, MAX_BACKOFF_S),
              help="First backoff in seconds (doubles per retry, at most 30 s).")
@click.option("--stop-after", default=5, show_default=True, type=int_range(0, MAX_TASKS),
              help="Stop after this many consecutive episodes failed on infrastructure (0: never stop).")
@click.option("--no-repro-check", is_flag=True, help="Skip the reproducibility check.")
@click.option("--json", "as_json", is_flag=True, help="Print result.json instead of tables.")
def eval_cmd(spec: str, split: str, base_url: str | None, provider: str, llm_endpoint: str | None,
             llm_port: int | None, model: str | None, output_dir: Path, num_episodes: int | None,
             dataset_config: str | None, system_prompt: str | None, keep_losses: bool, compare_to: Path | None,
             samples_per_task: int, seeds: tuple[str, ...], limit: int | None, num_tasks: int, concurrency: int,
             ray_address: str | None, env_name: str | None, max_turns: int, temperature: float, max_tokens: int,
             success_threshold: float, episode_timeout: float, retries: int, backoff: float, stop_after: int,
             no_repro_check: bool, as_json: bool) -> None:
    """Evaluate the policy at --llm-endpoint on the --split tasks of SPEC (RFC 013's `openenv eval`).

    SPEC: an OpenEnv server URL (http://127.0.0.1:8000, ws://host:port/prefix/ws, host:port),
    reasoning_gym:DATASET[,DATASET...] or bfcl[:CATEGORY,...]; with --base-url, `family:variant` as
    for openenv (the server's tasks of that group). Episodes are written to OUTPUT_DIR/episodes.jsonl as
    they finish; running the same command again resumes the evaluation. `openenv collect`/`eval` flags
    (--base-url, -o, -n, --provider, --llm-port, --dataset-config, --system-prompt, --keep-losses) keep
    their meaning.
    """
    from envsched.cli.common import check_output_paths

    check_output_paths([("--output-dir", output_dir, True)])  # before any task is read or episode run
    llm_endpoint, api_key = _teacher(provider, llm_endpoint, llm_port, model)
    stop_after_or_none = stop_after or None
    config_obj: dict[str, Any] | None = None
    if dataset_config is not None:
        try:
            config_obj = json.loads(dataset_config)
        except ValueError as exc:
            raise click.BadParameter(f"must be valid JSON: {exc}", param_hint="--dataset-config") from None
        if not isinstance(config_obj, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--dataset-config")
    from rich.console import Console

    from envsched.evaluation import ChatCompletionsPolicy, EvalHarness, compare_eval_results
    from envsched.evaluation.compare import as_eval_result
    from envsched.evaluation.guards import EndpointUnreachable, EvaluationStopped

    if ray_address is not None:
        from envsched.cli.common import require_extra

        require_extra("ray", "--ray")  # in one line, before any work
    if samples_per_task > 1 and temperature == 0:
        raise click.BadParameter("--samples-per-task > 1 needs --temperature > 0 (otherwise every sample is "
                                 "the same)", param_hint="--temperature")
    seed_list = _seeds(seeds)
    console = Console(stderr=as_json)
    before = None
    if compare_to is not None:
        try:
            before = as_eval_result(compare_to)  # envsched's or EnvEvalHarness's result.json
        except (ValueError, FileNotFoundError, TypeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--compare") from None
    try:
        policy = ChatCompletionsPolicy(llm_endpoint, str(model), temperature=temperature, max_tokens=max_tokens,
                                       timeout_s=min(120.0, episode_timeout), api_key=api_key)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--llm-endpoint") from None
    env = resolve_spec(spec, split=split, num_tasks=num_tasks, env_name=env_name,
                       message_timeout_s=min(60.0, episode_timeout), base_url=base_url, dataset_config=config_obj,
                       system_prompt=system_prompt)
    meta = {"spec": spec, "model": model, "llm_endpoint": llm_endpoint, "temperature": temperature,
            "max_tokens": max_tokens, "kind": env["kind"], "provider": provider, "keep_losses": True,
            **({"base_url": env["base_url"]} if base_url else {}),
            **({"dataset_config": config_obj} if config_obj is not None else {}),
            **({"system_prompt": system_prompt} if system_prompt else {})}
    try:
        harness = EvalHarness(env["env_factory"], policy, env["tasks"], adapter=env["adapter"], split=split,
                              seeds=seed_list, samples_per_task=samples_per_task, limit=limit,
                              max_turns=max_turns, success_threshold=success_threshold, concurrency=concurrency,
                              episode_timeout_s=episode_timeout, max_retries=retries, backoff_s=backoff,
                              check_reproducibility=not no_repro_check, ray_address=ray_address, meta=meta,
                              num_episodes=num_episodes, max_consecutive_infra_errors=stop_after_or_none,
                              endpoints={"the OpenEnv server": env["base_url"]} if "base_url" in env else None)
        n = len(harness.plan())
    except (ValueError, IndexError, LookupError, NotImplementedError) as exc:
        raise click.ClickException(f"cannot plan the evaluation: {exc}") from None
    except RuntimeError as exc:  # InfrastructureError from the Task API
        raise click.ClickException(f"cannot read the tasks of {spec}: {exc}") from None
    if not as_json:
        console.print(f"[bold]envsched eval[/] {spec} split={split}: {n} episodes "
                      f"({len(harness.tasks)} tasks x {len(seed_list)} seeds x {samples_per_task} samples)")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=as_json or not console.is_terminal) as bar:
        job = bar.add_task("episodes", total=n)

        def progress(rec: Any, done: int, total: int) -> None:
            bar.update(job, completed=done, description=f"episodes ({rec.outcome} {rec.task_id})")

        try:
            result = harness.run(output_dir, resume=True, progress=progress)
        except (ValueError, FileExistsError) as exc:
            raise click.ClickException(str(exc)) from None
        except EndpointUnreachable as exc:  # checked once, before the first episode
            raise click.ClickException(f"{exc}; no episode was run (start the server, or check "
                                       "--llm-endpoint / the SPEC)") from None
        except EvaluationStopped as exc:
            raise click.ClickException(f"{exc}. The episodes so far are in {output_dir / 'episodes.jsonl'}; "
                                       "the same command resumes the evaluation") from None
    comparison = compare_eval_results(before, result) if before is not None else None
    if comparison is not None:
        (output_dir / "comparison.json").write_text(json.dumps(comparison.to_dict(), indent=2, sort_keys=True))
    if as_json:
        payload = result.to_dict()
        if comparison is not None:
            payload["comparison"] = comparison.to_dict()
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    if not as_json:
        _print_result(console, result)
        if comparison is not None:
            _print_comparison(console, comparison)
        console.print(f"wrote {output_dir / 'result.json'}")
    outcomes = result.scores.get("outcomes", {})
    episodes = sum(outcomes.values())
    if episodes and outcomes.get("infra_error", 0) == episodes:
        raise click.ClickException(f"every one of the {episodes} episodes failed on infrastructure (no score); "
                                   f"the errors are in {output_dir / 'episodes.jsonl'}")


def _print_result(console: Any, result: Any) -> None:
    from rich.table import Table

    s = result.scores
    t = Table(title="evaluation", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("± se", justify="right")
    rows = [("episodes", s.get("episodes"), None), ("scored", s.get("scored"), None),
            ("success_rate", s.get("success_rate"), s.get("success_rate_se")),
            ("mean_reward", s.get("mean_reward"), s.get("mean_reward_se")),
            ("error_rate", s.get("error_rate"), s.get("error_rate_se")),
            ("unscored_rate", s.get("unscored_rate"), s.get("unscored_rate_se")),
            ("infra_error_rate", s.get("infra_error_rate"), s.get("infra_error_rate_se")),
            ("mean_turns", s.get("mean_turns"), s.get("mean_turns_se")),
            ("mean_completion_tokens", s.get("mean_completion_tokens"), s.get("mean_completion_tokens_se"))]
    rows += [(k, v, None) for k, v in s.items() if k.startswith("pass@") and not k.endswith("_problems")]
    rows.append(("reproducible", result.reproducible, None))
    for name, value, se in rows:
        t.add_row(name, _fmt(value), _fmt(se))
    console.print(t)
    outcomes = s.get("outcomes", {})
    console.print("outcomes: " + ", ".join(f"{k}={v}" for k, v in outcomes.items() if v))
    for title, table in (("by group", result.by_group), ("by difficulty", result.by_difficulty)):
        if len(table) > 1:
            bt = Table(title=title)
            for col in ("key", "episodes", "success_rate", "± se", "mean_reward", "error_rate"):
                bt.add_column(col, justify="right" if col != "key" else "left")
            for key, row in table.items():
                bt.add_row(shown(key), str(row["episodes"]), _fmt(row["success_rate"]), _fmt(row["success_rate_se"]),
                           _fmt(row["mean_reward"]), _fmt(row["error_rate"]))
            console.print(bt)


def _print_comparison(console: Any, comparison: Any) -> None:
    from rich.table import Table

    t = Table(title="comparison (after - before)")
    for col in ("metric", "before", "after", "delta", "note"):
        t.add_column(col)
    for m, d in comparison.deltas.items():
        t.add_row(m, _fmt(d["before"]), _fmt(d["after"]), _fmt(d["delta"]), d["note"])
    console.print(t)
    console.print(f"fixed ({len(comparison.fixed)}): {', '.join(map(shown, comparison.fixed)) or '-'}")
    console.print(f"regressed ({len(comparison.regressed)}): {', '.join(map(shown, comparison.regressed)) or '-'}")
    console.print(f"left out ({len(comparison.left_out)}): "
                  + (", ".join(f"{shown(k)} \\[{shown(v)}]" for k, v in comparison.left_out.items()) or "-"))


if __name__ == "__main__":  # pragma: no cover
    eval_cmd(sys.argv[1:])
