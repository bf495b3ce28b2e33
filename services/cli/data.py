"""`gpuplan data check`, `gpuplan data upload` and `gpuplan data delete`: a fine-tuning data set checked before
renting GPUs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

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
    read_regular_file,
    regular_file,
)
from services.core.country import is_country_code


def register(sub: Subparsers) -> None:
    data = sub.add_parser("data", help="check a fine-tuning data set before renting GPUs")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    check = data_sub.add_parser("check", help="format, lengths, duplicates, broken rows and personal data")
    check.add_argument("file", help="JSONL, JSON array, CSV or Parquet; .gz accepted")
    check.add_argument(
        "--model",
        metavar="HUB_ID",
        help="count tokens with this model's own tokenizer.json (fetched from the Hub and cached), e.g. "
        "meta-llama/Llama-3.1-8B",
    )
    check.add_argument("--tokenizer", metavar="TOKENIZER_JSON", help="exact token counts with this tokenizer.json")
    check.add_argument("--names", metavar="FILE", help="person names to look for, one per line")
    check.add_argument("--write-clean", metavar="OUT", help="write the kept rows (JSONL) to a new file")
    check.add_argument("--write-masked", metavar="OUT", help="write a copy with personal data masked")
    _add_data_country(check)
    check.add_argument(
        "--provider-country", type=country_arg("--provider-country"), metavar="CC", help="where the GPUs are (ISO code)"
    )
    check.add_argument("--json", action="store_true")
    check.set_defaults(handler=cmd_data_check)
    upload = data_sub.add_parser("upload", help="upload a data set to a running service (resumable) and check it")
    examples(upload, "gpuplan data upload train.jsonl --wait", "gpuplan data upload train.jsonl --resume DATASET_ID")
    upload.add_argument("file", help="JSONL, JSON array, CSV or Parquet; .gz accepted")
    add_api_option(upload, "--server")
    add_key_options(upload)  # the embedded default keeps the key in .gpuplan/local-key
    upload.add_argument(
        "--resume",
        type=id_arg("--resume"),
        metavar="ID",
        help="continue an interrupted upload: send only the missing parts",
    )
    _add_data_country(upload)
    upload.add_argument("--model", metavar="HUB_ID", help="the model it trains: its tokenizer counts the tokens")
    upload.add_argument("--wait", action="store_true", help="wait for the check and print its summary")
    upload.add_argument("--json", action="store_true")
    upload.set_defaults(handler=cmd_data_upload)
    delete = data_sub.add_parser("delete", help="delete an uploaded data set and its stored file")
    examples(delete, "gpuplan data delete DATASET_ID")
    delete.add_argument("id", type=id_arg("id"), help="the data set's id (gpuplan data upload prints it)")
    add_api_option(delete, "--server")
    add_key_options(delete)  # the embedded default keeps the key in .gpuplan/local-key
    delete.set_defaults(handler=cmd_data_delete)


# The exit status of `data check` on a data set none of whose rows is kept (bad arguments exit 2).
EXIT_NOTHING_KEPT = 1


def _add_data_country(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-country",
        type=country_arg("--data-country"),
        metavar="CC",
        help="where the data comes from (ISO code, e.g. TR)",
    )


def country_arg(name: str) -> Callable[[str], str]:
    """An argparse type for an ISO 3166-1 alpha-2 country code (the API's data_country rule)."""

    def parse(value: str) -> str:
        code = value.strip()
        if not is_country_code(code):
            raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a two-letter ISO country code (e.g. TR, DE)")
        return code.upper()

    return parse


def cmd_data_check(args: argparse.Namespace) -> int:
    from services.datacheck import DataCheckError, check_dataset, data_location_warning, write_clean, write_masked

    for flag, value in (
        ("--names", args.names),
        ("--write-clean", args.write_clean),
        ("--write-masked", args.write_masked),
    ):
        if value is not None and not value.strip():  # an empty path was taken as the flag not given (exit 0)
            raise CliError(f"{flag}: no file named (got {value!r})")
    names = None
    if args.names:
        try:
            text = read_regular_file(args.names, "--names").decode("utf-8")
            names = [n.strip() for n in text.splitlines() if n.strip()]
        except UnicodeDecodeError as exc:
            raise CliError(f"--names {args.names}: not UTF-8 text (byte {exc.start})") from None
    if args.model and args.tokenizer:
        raise CliError("--model and --tokenizer: give one (the model's tokenizer, or a tokenizer.json file)")
    outputs = [Path(p) for p in (args.write_clean, args.write_masked) if p]
    if len(outputs) == 2 and outputs[0].resolve() == outputs[1].resolve():
        # Checked before either is written: the clean file was written, then the masked one refused (exit 2).
        raise CliError(f"--write-masked {args.write_masked}: the same file as --write-clean; give another")
    counter, tokenizer = None, None
    if args.model:
        from services.hub.tokenizer import model_counter

        counter, tokenizer = model_counter(args.model)
    try:
        report = check_dataset(
            args.file, tokenizer_json=args.tokenizer, names=names, counter=counter, tokenizer=tokenizer
        )
        warning = None
        if args.data_country and args.provider_country:
            warning = data_location_warning(report.pii, args.data_country, args.provider_country)
        written = []
        # Where no row can train the command fails, and writes nothing (an empty clean file was left behind, which a
        # run on the mended data then refused as already there).
        writes = report.rows_kept > 0
        try:
            if args.write_clean and writes:
                written.append(f"{write_clean(args.file, args.write_clean)} clean rows to {args.write_clean}")
            if args.write_masked and writes:
                written.append(
                    f"{write_masked(args.file, args.write_masked, names=names)} masked rows to {args.write_masked}"
                )
        except BaseException:
            # The command fails as a whole: a clean file written before the masked one failed is not left behind.
            if written:
                Path(args.write_clean).unlink(missing_ok=True)
            raise
    except DataCheckError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:  # an output file (--write-clean, --write-masked) that cannot be written
        raise CliError(f"{exc.filename}: cannot write ({exc.strerror or exc})") from None
    if report.rows_total == 0:
        raise CliError(f"{args.file}: no rows: empty, or not JSONL, a JSON array, CSV or Parquet")
    # A set no row of which can train is reported (why each row fails) and fails the command, as a linter does.
    status = 0 if report.rows_kept else EXIT_NOTHING_KEPT
    if args.json:
        print(json.dumps({**report.model_dump(mode="json"), "data_location_warning": warning}, indent=2))
        return status
    t = report.tokens
    print(
        f"{report.path}: {report.rows_total:,} rows, format {report.detected_format or 'unknown'} "
        f"({report.file_format}); {report.rows_kept:,} kept"
    )
    print(f"tokenizer: {tokenizer_line(report.tokenizer)}")
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
    if status:
        print(f"gpuplan: error: {args.file}: none of its {report.rows_total:,} rows can train", file=sys.stderr)
    return status


def cmd_data_upload(args: argparse.Namespace) -> int:
    import httpx

    from services.datasets.client import UploadError, upload_file, wait_for_check

    path = Path(args.file)
    if not regular_file(path):
        raise CliError(f"file: no such file {args.file[:200]!r}")
    headers = {"Authorization": f"Bearer {api_key(args, 'data upload')}"}
    try:
        with httpx.Client(base_url=args.api, timeout=300, headers=headers) as client:
            body = upload_file(
                client,
                path,
                resume_id=args.resume,
                data_country=args.data_country,
                model=args.model,
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
        print(f"tokenizer: {tokenizer_line(report.get('tokenizer') or {})}")
        for kind in report["pii"]:
            print(f"personal data: {kind['count']} {kind['kind']}")
        print(f'plan from it: "dataset_id": "{body["id"]}"')
    return 0 if body["status"] != "failed" else 1


def cmd_data_delete(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {api_key(args, 'data delete')}"}
    try:
        with httpx.Client(base_url=args.api, timeout=60, headers=headers) as client:
            response = client.delete(f"/v1/datasets/{args.id}")
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {args.api}: {exc}") from None
    if response.status_code >= 400:
        raise CliError(f"data set {args.id}: {api_error(response)}")
    if response.status_code != 204:
        # Another server on that address answered (a proxy's page): nothing was deleted.
        kind = response.headers.get("content-type") or "no content type"
        raise CliError(f"--api {args.api}: the answer ({kind}) is not a gpuplan service's; check the URL")
    print(f"data set {args.id}: deleted, with its stored file")
    return 0


def tokenizer_line(tokenizer: dict[str, str]) -> str:
    """Which tokenizer counted, for the summary: its source and the revision or the reason."""
    source = tokenizer.get("source") or "estimate: characters/4"
    if tokenizer.get("revision"):
        return f"{source} (revision {tokenizer['revision'][:12]})"
    if tokenizer.get("reason"):
        return f"{source} ({tokenizer['reason']})"
    return source
