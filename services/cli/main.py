"""The ``gpuplan`` command line: thin argument handling over the estimator and the catalogs.

Every error is one readable line on stderr and a non-zero exit (2 for bad input), never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from services.catalog.gpus import find_gpu, gpu_specs
from services.catalog.models import catalog_models
from services.cli import runs as runs_cli
from services.cli.render import render_estimate
from services.core.errors import GpuplanError
from services.estimator.errors import EstimatorError
from services.estimator.estimate import estimate
from services.estimator.validation import PlanError, parse_plan
from services.export import FORMATS, export_setup

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def _read_json(path: str, what: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} {path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def _read_plan_file(path: str) -> dict[str, Any]:
    """A plan JSON file; a benchmark case ({"plan": ..., "measured": ...}) is accepted as well."""
    data = _read_json(path, "--plan")
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "model" not in data:
        data = data["plan"]
    if not isinstance(data, dict):
        raise CliError(f"--plan {path}: must hold a JSON object")
    return dict(data)


# Flags that set plan fields: (flag, plan key, argparse options).
_PLAN_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--method", "method", {"choices": ["full", "lora", "qlora"]}),
    (
        "--framework",
        "framework",
        {"choices": ["hf-trainer", "torchtune", "litgpt", "torchtitan", "axolotl", "unsloth", "pytorch"]},
    ),
    ("--precision", "precision", {"choices": ["bf16", "fp16", "bf16-mixed", "fp16-mixed", "fp32"]}),
    ("--quantization", "quantization", {"choices": ["nf4", "int8"]}),
    (
        "--optimizer",
        "optimizer",
        {"choices": ["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "adafactor", "sgd"]},
    ),
    ("--micro-batch-size", "micro_batch_size", {"type": int, "metavar": "N"}),
    ("--seq-len", "seq_len", {"type": int, "metavar": "TOKENS"}),
    ("--gpus", "gpus", {"type": int, "metavar": "N"}),
    ("--sharding", "sharding", {"choices": ["none", "zero1", "zero2", "zero3", "fsdp"]}),
    ("--grad-accum", "gradient_accumulation_steps", {"type": int, "metavar": "N"}),
    ("--mode", "mode", {"choices": ["train", "inference"]}),
    ("--attention", "attention", {"choices": ["sdpa", "flash", "eager"]}),
]


def _int_arg(name: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {value!r}") from None

    return parse


def _build_parser() -> _Parser:
    parser = _Parser(prog="gpuplan", description="Plan LLM fine-tuning runs: memory, speed and cost per GPU.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="peak GPU memory, fit per card, tokens/s and cost of a plan")
    est.add_argument("--plan", metavar="FILE", help="plan JSON (the schema of benchmarks/README); flags override it")
    est.add_argument("--model", metavar="HF_ID", help="model id from the bundled catalog (see `gpuplan models`)")
    est.add_argument("--config", metavar="FILE", help="the model's config.json, for models not in the catalog")
    est.add_argument("--gpu", metavar="NAME", help="GPU for tokens/s ('A100 80GB', 'h100', 'RTX 4090', ...)")
    est.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    for flag, key, options in _PLAN_FLAGS:
        if options.get("type") is int:
            options = {**options, "type": _int_arg(flag)}
        est.add_argument(flag, dest=key, **options)
    est.add_argument("--batch", dest="micro_batch_size", type=_int_arg("--batch"), help=argparse.SUPPRESS)
    est.add_argument("--lora-rank", type=_int_arg("--lora-rank"), metavar="R")
    est.add_argument("--lora-alpha", type=_int_arg("--lora-alpha"), metavar="A")
    est.add_argument("--lora-targets", metavar="ROLES", help="comma list of q,k,v,o,gate,up,down,lm_head or all-linear")
    est.add_argument("--gradient-checkpointing", dest="gradient_checkpointing", action="store_true", default=None)
    est.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    est.add_argument("--cpu-offload", dest="cpu_offload", action="store_true", default=None)
    est.add_argument("--optimizer-in-backward", dest="optimizer_in_backward", action="store_true", default=None)
    est.add_argument("--dataset-tokens", type=_int_arg("--dataset-tokens"), metavar="N", help="tokens per epoch")
    est.add_argument("--examples", type=_int_arg("--examples"), metavar="N", help="examples per epoch")
    est.add_argument("--avg-tokens", type=float, metavar="N", help="average tokens per example")
    est.add_argument("--epochs", type=float, metavar="N")

    trace = sub.add_parser(
        "trace", help="run one training step of the real model code under fake tensors (needs the trace extra)"
    )
    trace.add_argument("--plan", metavar="FILE", required=True, help="plan JSON")
    trace.add_argument("--json", action="store_true")

    export = sub.add_parser("export", help="ready-to-run training configs for a plan's setup")
    export.add_argument("--plan", metavar="FILE", required=True, help="plan JSON")
    export.add_argument("--format", required=True, choices=list(FORMATS))
    export.add_argument("--gpu", metavar="NAME", help="the card; without it the planner picks the cheapest setup")
    export.add_argument("--gpus", type=_int_arg("--gpus"), metavar="N", help="GPUs of that card (default: the plan's)")
    export.add_argument("--out", metavar="DIR", help="write the files into DIR (new or empty) instead of printing")

    sub.add_parser("models", help="list the bundled model catalog")
    sub.add_parser("gpus", help="list the GPU specs gpuplan knows")

    serve = sub.add_parser("serve", help="run the planning service (migrates the database first)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, or GPUPLAN_HOST)")
    serve.add_argument("--port", type=_int_arg("--port"), help="port (default 8000, or GPUPLAN_PORT)")
    sub.add_parser("migrate", help="apply the database migrations and exit")
    worker = sub.add_parser("worker", help="run a Celery worker (needs GPUPLAN_REDIS_URL)")
    worker.add_argument("--queues", default="estimate,trace,calibrate,sync,maintenance,datacheck", help="comma list")
    worker.add_argument("--concurrency", type=_int_arg("--concurrency"), default=2)
    sub.add_parser("beat", help="run the Celery beat scheduler (needs GPUPLAN_REDIS_URL)")
    data = sub.add_parser("data", help="check a fine-tuning data set before renting GPUs")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    check = data_sub.add_parser("check", help="format, lengths, duplicates, broken rows and personal data")
    check.add_argument("file", help="JSONL, JSON array, CSV or Parquet; .gz accepted")
    check.add_argument("--tokenizer", metavar="TOKENIZER_JSON", help="exact token counts with this tokenizer.json")
    check.add_argument("--names", metavar="FILE", help="person names to look for, one per line")
    check.add_argument("--write-clean", metavar="OUT", help="write the kept rows (JSONL) to a new file")
    check.add_argument("--write-masked", metavar="OUT", help="write a copy with personal data masked")
    check.add_argument("--data-country", metavar="CC", help="where the data comes from (ISO code, e.g. TR)")
    check.add_argument("--provider-country", metavar="CC", help="where the GPUs are (ISO code)")
    check.add_argument("--json", action="store_true")
    upload = data_sub.add_parser("upload", help="upload a data set to a running service (resumable) and check it")
    upload.add_argument("file", help="JSONL, JSON array, CSV or Parquet; .gz accepted")
    upload.add_argument("--api", "--server", dest="api", default="http://127.0.0.1:8000", metavar="URL")
    upload.add_argument("--key", required=True, help="API key (the embedded default keeps it in .gpuplan/local-key)")
    upload.add_argument("--resume", metavar="ID", help="continue an interrupted upload: send only the missing parts")
    upload.add_argument("--data-country", metavar="CC", help="where the data comes from (ISO code, e.g. TR)")
    upload.add_argument("--wait", action="store_true", help="wait for the check and print its summary")
    upload.add_argument("--json", action="store_true")

    plans = sub.add_parser("plans", help="submit and follow plans on a running service")
    plans_sub = plans.add_subparsers(dest="plans_command", required=True, parser_class=_Parser)
    for name, text in (("submit", "submit a plan file (with its dataset and epochs)"), ("get", "show a plan")):
        cmd = plans_sub.add_parser(name, help=text)
        cmd.add_argument("--api", default="http://127.0.0.1:8000", metavar="URL")
        cmd.add_argument("--key", required=True, help="API key (the embedded default keeps it in .gpuplan/local-key)")
        cmd.add_argument("--json", action="store_true")
        if name == "submit":
            cmd.add_argument("--plan", metavar="FILE", required=True)
            cmd.add_argument("--wait", action="store_true", help="wait until the plan is done or failed")
        else:
            cmd.add_argument("id")

    agent = sub.add_parser("agent", help="run on a GPU node: register it, heartbeat, run its calibrations")
    agent.add_argument("--api", required=True, metavar="URL", help="the gpuplan service, e.g. http://planner:8000")
    agent.add_argument("--key", required=True, help="the organization's API key")
    agent.add_argument("--name", help="node name (default: the host name)")
    agent.add_argument("--gpu", help="GPU model when NVML cannot tell (a CPU node registers as 'cpu')")
    agent.add_argument("--provider", help="who rents the node")
    agent.add_argument("--price-usd-per-hour", type=float, metavar="X", help="what the node costs per hour")
    agent.add_argument("--interval", type=float, default=15.0, metavar="S", help="seconds between polls")
    agent.add_argument("--once", action="store_true", help="one heartbeat and at most one job, then exit")
    runs_cli.add_agent_options(agent)
    runs_cli.add_commands(sub)

    admin = sub.add_parser("admin", help="organizations, API keys and price lists")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, parser_class=_Parser)
    create_org = admin_sub.add_parser("create-org", help="create an organization")
    create_org.add_argument("name")
    create_key = admin_sub.add_parser("create-key", help="create an API key; prints the key alone")
    create_key.add_argument("--org", required=True, help="organization name")
    create_key.add_argument("--admin", action="store_true", help="may import price lists")
    import_offers = admin_sub.add_parser("import-offers", help="import a CSV/JSON price list (all or nothing)")
    import_offers.add_argument("file")
    return parser


def _plan_from_args(args: argparse.Namespace) -> dict[str, Any]:
    plan: dict[str, Any] = {}
    if args.plan:
        plan = _read_plan_file(args.plan)
    if args.model or args.config:
        model: dict[str, Any] = {}
        if args.model:
            model["name"] = args.model
        if args.config:
            config = _read_json(args.config, "--config")
            if not isinstance(config, dict):
                raise CliError(f"--config {args.config}: must hold a JSON object (a config.json)")
            model["config"] = config
        plan["model"] = model
    if "model" not in plan:
        raise CliError("no model: give --model HF_ID, --config FILE or --plan FILE")
    for _flag, key, _options in _PLAN_FLAGS:
        value = getattr(args, key)
        if value is not None:
            plan[key] = value
    for key in ("gradient_checkpointing", "cpu_offload", "optimizer_in_backward"):
        if getattr(args, key) is not None:
            plan[key] = getattr(args, key)
    if args.lora_rank is not None or args.lora_alpha is not None or args.lora_targets:
        lora = dict(plan.get("lora") or {})
        if args.lora_rank is not None:
            lora["rank"] = args.lora_rank
        lora.setdefault("rank", 16)
        if args.lora_alpha is not None:
            lora["alpha"] = args.lora_alpha
        if args.lora_targets:
            targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
            lora["targets"] = "all-linear" if targets == ["all-linear"] else targets
        plan["lora"] = lora
        plan.setdefault("method", "lora")
    if any(v is not None for v in (args.dataset_tokens, args.examples, args.avg_tokens, args.epochs)):
        data_spec = dict(plan.get("data") or {})
        for key, value in (
            ("tokens", args.dataset_tokens),
            ("examples", args.examples),
            ("avg_tokens_per_example", args.avg_tokens),
            ("epochs", args.epochs),
        ):
            if value is not None:
                data_spec[key] = value
        plan["data"] = data_spec
    return plan


def _cmd_estimate(args: argparse.Namespace) -> int:
    plan = parse_plan(_plan_from_args(args))
    result = estimate(plan, args.gpu)
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        print(render_estimate(result))
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    plan = parse_plan(_read_plan_file(args.plan))
    try:
        from services.trace.tracer import TraceUnavailable, trace_plan
    except ImportError:
        raise CliError(
            "the trace needs the trace extra: pip install torch==2.13.0 && pip install -e '.[trace]'"
        ) from None
    try:
        result = trace_plan(plan)
    except TraceUnavailable as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(
            f"traced peak allocated {result.peak_allocated_gib:.2f} GiB, "
            f"analytic {result.analytic_peak_allocated_gib:.2f} GiB ({result.disagreement_pct:+.1f}%), "
            f"{result.seconds:.1f} s"
        )
        for key, value in sorted(result.breakdown.items(), key=lambda kv: -kv[1]):
            print(f"  {key:8} {value:8.2f} GiB")
        for note in result.notes:
            print(f"  - {note}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    plan = parse_plan(_read_plan_file(args.plan))
    if args.gpu:
        spec = find_gpu(args.gpu)
        gpus = args.gpus or plan.gpus
        if gpus != plan.gpus:
            plan = plan.model_copy(update={"gpus": gpus, "sharding": plan.sharding if gpus > 1 else "none"})
        report = estimate(plan, spec)
        bundle = export_setup(
            plan,
            None,
            args.format,
            peak_gib_per_gpu=report.memory.peak_device_gib,
            gpu_memory_gib=spec.memory_gib,
            gpu=spec.name,
        )
    else:
        if plan.data is None:
            raise CliError(
                "give --gpu NAME (and --gpus N), or a data set in the plan so the planner can pick the setup"
            )
        from services.planner import plan_setups

        result = plan_setups(plan)
        if not result.recommendations:
            raise CliError("no setup in the catalog fits this plan; see `gpuplan estimate` for its memory")
        rec = result.recommendations[0]
        bundle = export_setup(
            plan,
            rec,
            args.format,
            peak_gib_per_gpu=rec.peak_gib_per_gpu,
            gpu_memory_gib=rec.gpu_memory_gib,
            gpu=rec.gpu,
        )
    if args.out:
        out = Path(args.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise CliError(f"--out {args.out}: must be a new or empty directory (nothing is overwritten)")
        out.mkdir(parents=True, exist_ok=True)
        for name, text in bundle.files.items():
            (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {', '.join(sorted(bundle.files))} to {out}; start with: {bundle.command}")
    else:
        for name, text in bundle.files.items():
            print(f"===== {name} =====\n{text.rstrip()}\n")
        print(f"# start training with: {bundle.command}")
    for note in bundle.notes:
        print(f"# note: {note}", file=sys.stderr)
    return 0


def _cmd_plans(args: argparse.Namespace) -> int:
    import time

    import httpx

    headers = {"Authorization": f"Bearer {args.key}"}
    try:
        with httpx.Client(base_url=args.api, timeout=60, headers=headers) as client:
            if args.plans_command == "submit":
                response = client.post("/v1/plans", json=_read_plan_file(args.plan))
                if response.status_code >= 400:
                    raise CliError(_api_error(response))
                plan_id = response.json()["id"]
                if not args.wait:
                    print(plan_id)
                    return 0
                while True:
                    body = client.get(f"/v1/plans/{plan_id}").json()
                    if body["status"] in ("done", "failed"):
                        break
                    time.sleep(0.5)
            else:
                response = client.get(f"/v1/plans/{args.id}")
                if response.status_code >= 400:
                    raise CliError(_api_error(response))
                body = response.json()
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.api}: {exc}") from None
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"plan {body['id']}: {body['status']}" + (f" ({body['error']})" if body.get("error") else ""))
    for rec in body.get("recommendations", [])[:5]:
        spot = f", spot ${rec['spot_cost_usd']:,.2f}" if rec.get("spot_cost_usd") is not None else ""
        print(
            f"  {rec['gpus']} x {rec['gpu']} ({rec['provider']}): {rec['peak_gib_per_gpu']:.1f} of "
            f"{rec['gpu_memory_gib']:.0f} GiB, {rec['hours']:.1f} h, ${rec['cost_usd']:,.2f}{spot}"
        )
    return 0 if body["status"] != "failed" else 1


def _cmd_data_check(args: argparse.Namespace) -> int:
    from services.datacheck import DataCheckError, check_dataset, data_location_warning, write_clean, write_masked

    names = None
    if args.names:
        try:
            names = [n.strip() for n in Path(args.names).read_text(encoding="utf-8").splitlines() if n.strip()]
        except OSError as exc:
            raise CliError(f"--names {args.names}: cannot read ({exc.strerror or exc})") from None
    try:
        report = check_dataset(args.file, tokenizer_json=args.tokenizer, names=names)
        warning = None
        if args.data_country and args.provider_country:
            warning = data_location_warning(report.pii, args.data_country, args.provider_country)
        written = []
        if args.write_clean:
            written.append(f"{write_clean(args.file, args.write_clean)} clean rows to {args.write_clean}")
        if args.write_masked:
            written.append(
                f"{write_masked(args.file, args.write_masked, names=names)} masked rows to {args.write_masked}"
            )
    except DataCheckError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps({**report.model_dump(mode="json"), "data_location_warning": warning}, indent=2))
        return 0
    t = report.tokens
    print(
        f"{report.path}: {report.rows_total:,} rows, format {report.detected_format or 'unknown'} "
        f"({report.file_format}); {report.rows_kept:,} kept"
    )
    print(
        f"tokens ({t.method}): p50 {t.p50_tokens}, p90 {t.p90_tokens}, p95 {t.p95_tokens}, p99 {t.p99_tokens}, "
        f"max {t.max_tokens}"
    )
    print(
        f"recommended seq_len {t.recommended_seq_len_tokens} (truncates {t.truncated_rows} rows, "
        f"{t.truncated_share:.1%}); tokens per epoch {t.tokens_per_epoch_packed:,} packed, "
        f"{t.tokens_per_epoch_padded:,} padded"
    )
    for label, rows in (
        ("broken", report.broken_rows),
        ("encoding problems", report.encoding_problem_rows),
        ("not matching the format", report.mismatched_rows),
    ):
        if rows:
            shown = "; ".join(f"row {r.row_number}: {r.reason}" for r in rows[:5])
            print(f"{len(rows)} {label}: {shown}{' ...' if len(rows) > 5 else ''}")
    print(
        f"{len(report.empty_rows)} empty, {len(report.short_rows)} very short, {len(report.overlong_rows)} over "
        f"seq_len, {len(report.exact_duplicates)} exact and {len(report.near_duplicates)} near duplicates"
    )
    print(f"validation split: {report.validation_split.rows} rows ({report.validation_split.rule})")
    for kind in report.pii:
        print(
            f"personal data: {kind.count} {kind.kind} (rows {', '.join(map(str, kind.example_row_numbers))}; "
            f"e.g. {', '.join(kind.masked_examples)})"
        )
    if warning:
        print(f"WARNING: {warning}")
    for line in written:
        print(f"wrote {line}")
    return 0


def _cmd_data_upload(args: argparse.Namespace) -> int:
    import httpx

    from services.datasets.client import UploadError, upload_file, wait_for_check

    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"file: no such file {args.file!r}")
    headers = {"Authorization": f"Bearer {args.key}"}
    try:
        with httpx.Client(base_url=args.api, timeout=300, headers=headers) as client:
            body = upload_file(
                client,
                path,
                resume_id=args.resume,
                data_country=args.data_country,
                started=lambda i: print(f"data set {i}: uploading (after a cut: --resume {i})", file=sys.stderr),
                sent=lambda n, total: print(f"  part {n} of {total} sent", file=sys.stderr),
            )
            if args.wait:
                body = wait_for_check(client, body["id"])
    except UploadError as exc:
        raise CliError(str(exc)) from None
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.api}: {exc} (resume with --resume once it is back)") from None
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"data set {body['id']}: {body['status']}" + (f" ({body['error']})" if body.get("error") else ""))
    report = body.get("report")
    if report:
        t, counts = report["tokens"], report["counts"]
        print(
            f"{report['rows_total']:,} rows, {report['rows_kept']:,} kept; seq_len {t['recommended_seq_len_tokens']}; "
            + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in counts.items() if v)
        )
        for kind in report["pii"]:
            print(f"personal data: {kind['count']} {kind['kind']}")
        print(f'plan from it: "dataset_id": "{body["id"]}"')
    return 0 if body["status"] != "failed" else 1


def _api_error(response: Any) -> str:
    try:
        body = response.json()
        return str(body.get("message") or body)
    except ValueError:
        return f"HTTP {response.status_code}"


def _cmd_agent(args: argparse.Namespace) -> int:
    import httpx

    from services.agent.agent import Agent

    with httpx.Client(base_url=args.api, timeout=60) as client:
        agent = Agent(client, args.key)
        try:
            node = agent.register(
                name=args.name,
                gpu=args.gpu,
                provider=args.provider,
                usd_per_hour=args.price_usd_per_hour,
                instance_id=args.instance_id,
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            raise CliError(f"agent: cannot register with {args.api}: {exc}") from None
        print(f"gpuplan agent: node {node} registered with {args.api}", file=sys.stderr)
        runs_cli.agent_run_setup(args, agent, client)
        ended = agent.run(args.interval, once=args.once)
        print(f"gpuplan agent: stopped ({ended})", file=sys.stderr)
    return 0


def _cmd_models(_args: argparse.Namespace) -> int:
    for model in catalog_models():
        params = f"{model.published_params / 1e9:.2f}B" if model.published_params else "?"
        print(f"{model.hf_id:55} {model.config.get('model_type', '?'):12} {params:>9}")
    return 0


def _cmd_gpus(_args: argparse.Namespace) -> int:
    for spec in gpu_specs():
        bf16 = f"{spec.bf16_tflops:g}" if spec.bf16_tflops else "-"
        print(
            f"{spec.name:14} {spec.memory_gib:6.1f} GiB  bf16 {bf16:>6} TFLOPs  {spec.hbm_bandwidth_gb_per_s:6g} GB/s"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command in ("serve", "migrate", "admin", "worker", "beat"):
            from services.cli import server

            return server.run(args)
        if args.command == "agent":
            return _cmd_agent(args)
        if args.command == "plans":
            return _cmd_plans(args)
        if args.command == "data":
            return _cmd_data_check(args)
        if args.command == "sync":
            return runs_cli.cmd_sync(args)
        if args.command == "restore":
            return runs_cli.cmd_restore(args)
            return _cmd_data_upload(args) if args.data_command == "upload" else _cmd_data_check(args)
        handlers = {
            "estimate": _cmd_estimate,
            "trace": _cmd_trace,
            "export": _cmd_export,
            "models": _cmd_models,
            "gpus": _cmd_gpus,
        }
        handler = handlers[args.command]
        return handler(args)
    except (CliError, runs_cli.RunCliError) as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
    except PlanError as exc:
        print(f"gpuplan: error: {'; '.join(exc.problems)}", file=sys.stderr)
    except EstimatorError as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
    except GpuplanError as exc:
        details = f" ({'; '.join(map(str, exc.details[:5]))})" if isinstance(exc.details, list) else ""
        print(f"gpuplan: error: {exc.message}{details}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
