"""`gpuplan plans submit|get`: plans on a running service."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import (
    CliError,
    Parser,
    Subparsers,
    add_api_option,
    add_key_options,
    api_error,
    api_key,
    examples,
    id_arg,
    read_plan_file,
    service_json,
)
from services.core.money import usd


def register(sub: Subparsers) -> None:
    plans = sub.add_parser("plans", help="submit and follow plans on a running service")
    plans_sub = plans.add_subparsers(dest="plans_command", required=True, parser_class=Parser)
    for name, text in (("submit", "submit a plan file (with its dataset and epochs)"), ("get", "show a plan")):
        cmd = plans_sub.add_parser(name, help=text)
        if name == "submit":
            examples(cmd, "gpuplan plans submit --plan infra/examples/llama-3.1-8b-qlora.json --wait")
        else:
            examples(cmd, "gpuplan plans get PLAN_ID --json")
        add_api_option(cmd)
        add_key_options(cmd)  # the embedded default keeps the key in .gpuplan/local-key
        cmd.add_argument("--json", action="store_true")
        if name == "submit":
            cmd.add_argument("--plan", metavar="FILE", required=True)
            cmd.add_argument("--wait", action="store_true", help="wait until the plan is done or failed")
            cmd.set_defaults(handler=cmd_plans_submit)
        else:
            cmd.add_argument("id", type=id_arg("id"))
            cmd.set_defaults(handler=cmd_plans_get)


# What _print_plan reads of a plan (services.plans.schemas.PlanOut).
_PLAN_FIELDS = ("id", "status", "recommendations")


def cmd_plans_submit(args: argparse.Namespace) -> int:
    import time

    import httpx

    headers = {"Authorization": f"Bearer {api_key(args, 'plans')}"}
    try:
        with httpx.Client(base_url=args.api, timeout=60, headers=headers) as client:
            response = client.post("/v1/plans", json=read_plan_file(args.plan))
            if response.status_code >= 400:
                raise CliError(api_error(response))
            plan_id = service_json(response, args.api, "id")["id"]
            if not args.wait:
                print(plan_id)
                return 0
            while True:
                body = service_json(client.get(f"/v1/plans/{plan_id}"), args.api, *_PLAN_FIELDS)
                if body["status"] in ("done", "failed"):
                    break
                time.sleep(0.5)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.api}: {exc}") from None
    return _print_plan(args, body)


def cmd_plans_get(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {api_key(args, 'plans')}"}
    try:
        with httpx.Client(base_url=args.api, timeout=60, headers=headers) as client:
            response = client.get(f"/v1/plans/{args.id}")
            if response.status_code >= 400:
                raise CliError(api_error(response))
            body = service_json(response, args.api, *_PLAN_FIELDS)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.api}: {exc}") from None
    return _print_plan(args, body)


def _print_plan(args: argparse.Namespace, body: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"plan {body['id']}: {body['status']}" + (f" ({body['error']})" if body.get("error") else ""))
    for rec in body.get("recommendations", [])[:5]:
        pricing = str(rec.get("pricing", "on_demand")).replace("_", " ")
        expected = rec.get("expected_cost_usd", rec["cost_usd"])
        spot = f", spot {usd(rec['spot_cost_usd'])}" if rec.get("spot_cost_usd") is not None else ""
        # The hours of the pricing shown (a spot run's include its expected preemptions; `hours` is on demand's), and
        # the card's memory as listed (an A10's 22.5 GiB is not 22).
        hours = rec.get("expected_hours", rec["hours"])
        memory = float(rec["gpu_memory_gib"])
        card = f"{memory:.0f}" if memory.is_integer() else f"{memory:.1f}"
        print(
            f"  {rec['gpus']} x {rec['gpu']} ({rec['provider']}, {pricing}): {usd(expected)} expected; "
            f"{rec['peak_gib_per_gpu']:.1f} of {card} GiB, {hours:.1f} h, {usd(rec['cost_usd'])} on demand{spot}"
        )
        # The planner's notes on the setup, in the words the plan page, the quote and the export use.
        for note in rec.get("notes") or ():
            print(f"      note: {note}")
    return 0 if body["status"] != "failed" else 1
