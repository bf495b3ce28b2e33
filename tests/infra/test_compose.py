"""docker-compose.yml's gpuplan services, started from the image's file tree.

No container engine runs in CI (nor on this project's machines: docs/operations.md says what was tried),
so this test does what `docker compose up` does with the image, short of the container:

- builds infra/Dockerfile's file tree (its WORKDIR and COPY lines) in a temporary folder;
- installs it as the Dockerfile's `RUN pip install` lines do, into a virtual environment of its own. The
  dependencies come from the test interpreter's site-packages (no network), through a plain path line:
  that skips the .pth files there, so this checkout's editable install is not seen. No PYTHONPATH, and
  the tree is the working directory, so only what the image copies can be imported;
- starts each gpuplan service's command with the compose environment, in the compose dependency order
  (migrate to completion, then api, worker and beat). The service hostnames become 127.0.0.1, the
  database a fresh Postgres database, the broker the test's Redis db, the API's port a free one;
- checks each service's health check, creates the first key with the commands docs/operations.md gives,
  has the worker finish a plan submitted through the API, and sees beat's idle sweep decide for a node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import yaml

from tests.api.conftest import QLORA_PLAN, _postgres_database
from tests.conftest import _free_port, require_service

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
REDIS_URL = os.environ.get("GPUPLAN_TEST_REDIS_URL", "redis://127.0.0.1:6379/12")
# The compose services this machine provides itself (Postgres, Redis) or that no assertion here needs
# (MinIO: plans and the idle sweep never touch object storage).
HOSTS = ("postgres", "redis", "minio")
# Beat's idle sweep runs every 60 s by default; every second here, so the test sees one soon.
OVERRIDES = {"GPUPLAN_IDLE_SWEEP_INTERVAL_S": "1"}
TOTAL_S = 240.0  # the whole test, services started and stopped (about 30 s on a quiet machine)


@dataclass
class DockerImage:
    workdir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/"))
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[list[str], PurePosixPath, bool]] = field(default_factory=list)  # sources, dest, dest is a dir
    pip_installs: list[list[str]] = field(default_factory=list)


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, rest) for each instruction, continuation lines joined, comments dropped."""
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.strip().partition(" ")
        yield word.upper(), rest.strip()
        logical = ""


def parse_dockerfile(text: str) -> DockerImage:
    image = DockerImage()
    for word, rest in _instructions(text):
        if word == "WORKDIR":
            image.workdir = image.workdir / rest
        elif word == "ENV":
            tokens = shlex.split(rest)
            if "=" not in tokens[0]:  # the legacy form: ENV NAME value
                image.env[tokens[0]] = rest.split(None, 1)[1]
            else:
                image.env.update(token.split("=", 1) for token in tokens)  # type: ignore[arg-type]
        elif word == "COPY":
            args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            args = [a for a in args if not a.startswith("--")]  # --chown, --chmod: no effect on the tree
            *sources, dest = args
            image.copies.append((sources, image.workdir / dest, dest.endswith("/") or len(sources) > 1))
        elif word == "RUN":
            argv = shlex.split(rest)
            for prefix in (["pip", "install"], ["python", "-m", "pip", "install"]):
                if argv[: len(prefix)] == prefix:
                    image.pip_installs.append(argv[len(prefix) :])
            # Other RUN lines (useradd) shape the container, not what can be imported.
    return image


def _dockerignored() -> Callable[[Any, list[str]], set[str]]:
    """The .dockerignore patterns that apply inside a copied folder (`**/NAME`)."""
    path = ROOT / ".dockerignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return shutil.ignore_patterns(*(p.strip()[3:] for p in lines if p.strip().startswith("**/")))


def build_tree(image: DockerImage, root: Path) -> Path:
    """The image's file tree under root (the container's / is root); returns its WORKDIR."""

    def here(path: PurePosixPath) -> Path:
        return root / path.relative_to("/")

    ignore = _dockerignored()
    for sources, dest, into_dir in image.copies:
        for source in sources:
            src = ROOT / source
            assert src.exists(), f"infra/Dockerfile: COPY {source}: not in the checkout"
            if src.is_dir():  # a folder's contents go into dest
                shutil.copytree(src, here(dest), ignore=ignore, dirs_exist_ok=True)
            else:
                target = here(dest) / src.name if into_dir else here(dest)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    workdir = here(image.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def clean_env(bin_dir: Path, home: Path, image: DockerImage) -> dict[str, str]:
    """The environment of a container process: nothing of this checkout or of the test's settings."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR", "XDG_STATE_HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_") and k not in dropped}
    env.update(image.env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(home)
    return env


def install(image: DockerImage, root: Path, workdir: Path, env: dict[str, str]) -> Path:
    """A virtual environment (outside the tree, like the image's /usr/local) with the tree installed."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=30,
    ).stdout.strip()
    # The dependencies the image's pip would fetch: the test interpreter's, as plain path lines.
    deps = dict.fromkeys((sysconfig.get_path("purelib"), sysconfig.get_path("platlib")))
    Path(site, "gpuplan-test-dependencies.pth").write_text("\n".join(deps) + "\n", encoding="utf-8")
    assert image.pip_installs, "infra/Dockerfile installs nothing (no RUN pip install line)"
    for args in image.pip_installs:
        offline = ["--no-deps", "--no-build-isolation", "--no-index", "--ignore-installed", "--quiet"]
        result = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", *offline, *args],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"pip install {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return venv / "bin"


def _with_host(value: str, host: str) -> str:
    parts = urlsplit(value)
    netloc = parts.netloc.rsplit("@", 1)
    netloc[-1] = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc="@".join(netloc)))


def service_env(service: dict[str, Any], database: str, redis_url: str) -> dict[str, str]:
    """The service's compose environment on this machine."""
    raw = service.get("environment", {})
    env = dict(item.split("=", 1) for item in raw) if isinstance(raw, list) else {k: str(v) for k, v in raw.items()}
    for name, value in env.items():
        if urlsplit(value).hostname in HOSTS:
            env[name] = _with_host(value, "127.0.0.1")
    db = urlsplit(env["GPUPLAN_DATABASE_URL"])
    # Trust auth as postgres on this machine; the scheme stays the compose file's (postgresql://).
    env["GPUPLAN_DATABASE_URL"] = urlunsplit(db._replace(netloc="postgres@127.0.0.1:5432", path="/" + database))
    env["GPUPLAN_REDIS_URL"] = redis_url
    return {**env, **OVERRIDES}


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *rest = test
    return ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest


def documented_first_key_commands() -> list[list[str]]:
    """The `docker compose exec api gpuplan ...` lines of docs/operations.md, as argv after `exec api`."""
    commands = []
    for line in OPERATIONS.read_text(encoding="utf-8").splitlines():
        if line.startswith("docker compose exec api gpuplan "):
            commands.append(shlex.split(line, comments=True)[4:])
    return commands


def start_order(services: dict[str, Any], ours: list[str]) -> list[str]:
    """Our services in an order that honours depends_on (compose's own start order)."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"docker-compose.yml: depends_on cycle {(*path, name)}"
        if name in done or name not in ours:
            return
        for dep in _depends_on(services[name]):
            visit(dep, (*path, name))
        done.append(name)

    for name in ours:
        visit(name, ())
    return done


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("depends_on", {})
    if isinstance(raw, list):
        return {name: "service_started" for name in raw}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in raw.items()}


@dataclass
class Running:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.name} ({self.log}) ---\n" + self.log.read_text(errors="replace")[-chars:]


def _stop(running: list[Running]) -> None:
    for r in running:
        if r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for r in running:
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait(timeout=5)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _files(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()}


def test_dockerfile_is_parsed_as_written() -> None:
    image = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    assert image.workdir == PurePosixPath("/app")
    copied = {source for sources, _dest, _dir in image.copies for source in sources}
    # What the entrypoints import (services, workers) and the migrations that `gpuplan migrate` runs.
    assert {"services", "workers", "migrations", "pyproject.toml"} <= copied
    assert image.pip_installs == [["-e", "."]]


def test_the_first_key_commands_are_documented() -> None:
    commands = documented_first_key_commands()
    assert [c[:3] for c in commands] == [["gpuplan", "admin", "create-org"], ["gpuplan", "admin", "create-key"]]


@pytest.fixture
def database() -> Iterator[str]:
    for url in _postgres_database():
        yield url.rsplit("/", 1)[1]


def _redis_available() -> bool:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).flushdb()
        return True
    except Exception:
        return False


@pytest.mark.slow
def test_the_compose_stack_starts_from_the_image_tree_and_runs_a_plan(tmp_path: Path, database: str) -> None:
    require_service("Redis", _redis_available(), "redis-server --daemonize yes")
    started = time.monotonic()

    def left_s() -> float:
        return TOTAL_S - (time.monotonic() - started)

    image = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    root, home = tmp_path / "image", tmp_path / "home"
    home.mkdir()
    workdir = build_tree(image, root)
    bootstrap_env = clean_env(root / "venv" / "bin", home, image)
    bin_dir = install(image, root, workdir, bootstrap_env)
    base_env = clean_env(bin_dir, home, image)
    # The installed packages resolve into the image's tree, never this checkout.
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import services, workers; print(services.__file__); print(workers.__file__)"],
        cwd=tmp_path,
        env=base_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(p).is_relative_to(workdir) for p in where.stdout.split()), where.stdout
    tree_files = _files(workdir)

    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services: dict[str, Any] = compose["services"]
    ours = [name for name, s in services.items() if "build" in s]
    assert {"migrate", "api", "worker", "beat"} <= set(ours), ours
    api_port = _free_port()
    container_port = services["api"]["ports"][0].rsplit(":", 1)[1]

    def localise(arg: str) -> str:
        # Loopback only, on a free port.
        return arg.replace("0.0.0.0", "127.0.0.1").replace(f":{container_port}/", f":{api_port}/")

    def argv_of(name: str) -> list[str]:
        argv = [localise(a) for a in services[name]["command"]]
        return [str(api_port) if a == container_port else a for a in argv] if name == "api" else argv

    envs = {name: {**base_env, **service_env(services[name], database, REDIS_URL)} for name in ours}
    running: list[Running] = []
    try:
        for name in start_order(services, ours):
            completed_before = [
                n for n, s in services.items() if _depends_on(s).get(name) == "service_completed_successfully"
            ]
            if completed_before:  # a one-shot step (migrate): the others wait for it to exit 0
                step = subprocess.run(
                    argv_of(name), cwd=workdir, env=envs[name], capture_output=True, text=True, timeout=left_s()
                )
                assert step.returncode == 0, f"{name}: {step.stdout}\n{step.stderr}"
                continue
            log = tmp_path / f"{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv_of(name),
                    cwd=workdir,
                    env=envs[name],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            running.append(Running(name, proc, log))

        def logs() -> str:
            return "\n".join(r.tail() for r in running)

        def wait_until(what: str, check: Any, poll_s: float = 1.0) -> Any:
            while True:
                for r in running:
                    assert r.proc.poll() is None, f"{r.name} exited with {r.proc.returncode} ({what})\n{logs()}"
                result = check()
                if result:
                    return result
                assert left_s() > 0, f"timed out: {what}\n{logs()}"
                time.sleep(poll_s)

        def healthy(name: str) -> bool:
            timeout_s = float(str(services[name]["healthcheck"].get("timeout", "30s")).rstrip("s"))
            argv = [localise(a) for a in healthcheck_argv(services[name])]
            try:
                probe = subprocess.run(
                    argv, cwd=workdir, env=envs[name], capture_output=True, timeout=min(timeout_s, max(1, left_s()))
                )
            except subprocess.TimeoutExpired:
                return False
            return probe.returncode == 0

        for r in running:
            assert "healthcheck" in services[r.name], f"docker-compose.yml: {r.name} has no health check"

        # The first organization and key, as docs/operations.md has them run in the api container; made
        # while the services start (it needs only the migrated database).
        def first_key() -> str:
            key = ""
            for argv in documented_first_key_commands():
                made = subprocess.run(
                    argv, cwd=workdir, env=envs["api"], capture_output=True, text=True, timeout=max(1, left_s())
                )
                assert made.returncode == 0, f"{shlex.join(argv)}: {made.stdout}\n{made.stderr}"
                key = made.stdout.strip() or key
            return key

        api = f"http://127.0.0.1:{api_port}"
        with ThreadPoolExecutor(1) as pool:
            key_future = pool.submit(first_key)
            # A cheap poll first; the compose health check then has to pass as well.
            wait_until("the api answering /healthz", lambda: _answers(api + "/healthz"), poll_s=0.5)
            assert healthy("api"), f"the api's health check\n{logs()}"
            key = key_future.result(timeout=max(1, left_s()))
        assert key.startswith("gp_"), key
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=api, headers=headers, timeout=10) as client:
            # Submitted before the worker need be up: the task waits in Redis.
            submitted = client.post("/v1/plans", json=QLORA_PLAN)
            assert submitted.status_code == 202, submitted.text
            plan_id = submitted.json()["id"]
            node = client.post("/v1/nodes", json={"name": "compose-node", "gpu": "T4"})
            assert node.status_code == 201, node.text
            node_id = node.json()["id"]

            def finished() -> dict[str, Any] | None:
                body: dict[str, Any] = client.get(f"/v1/plans/{plan_id}").json()
                return body if body["status"] in ("done", "failed") else None

            plan = wait_until("the worker finishing the plan", finished, poll_s=0.3)
            assert plan["status"] == "done", plan
            assert plan["attempts"] == 1, plan

            # Beat sends the idle sweep, a worker runs it: the node gets a decision and an event.
            def swept() -> list[dict[str, Any]]:
                if client.get(f"/v1/nodes/{node_id}").json()["last_decision_at"] is None:
                    return []
                events: list[dict[str, Any]] = client.get(f"/v1/nodes/{node_id}/events").json()["items"]
                return events

            events = wait_until("beat's idle sweep deciding for the node", swept, poll_s=0.5)
            assert events and events[0]["node_id"] == node_id
        # The worker's and beat's health checks pass too (the work above shows that they run).
        for name in ("worker", "beat"):
            wait_until(f"{name}'s health check", lambda name=name: healthy(name))
        # Beat's schedule went to its state directory, not the tree.
        beat_log = next(r for r in running if r.name == "beat").log.read_text(errors="replace")
        assert re.search(r"Sending due task sweep-idle-nodes", beat_log), beat_log[-3000:]
        assert list((home / ".local" / "state" / "gpuplan").glob("celerybeat-schedule*"))
        written = _files(workdir) - tree_files
        assert written == set(), f"the services wrote into the image's tree (read-only for its user): {written}"
    finally:
        _stop(running)
    assert time.monotonic() - started < TOTAL_S + 15


@pytest.mark.slow
def test_serve_stops_with_one_line_when_the_image_lacks_the_workers_package(tmp_path: Path) -> None:
    """The image as it was (no `COPY workers`): with GPUPLAN_REDIS_URL set, `serve --workers 2` used to
    restart each crashing worker process for ever without answering; now it stops with one line."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    image = parse_dockerfile("\n".join(line for line in text.splitlines() if not line.startswith("COPY workers")))
    root, home = tmp_path / "image", tmp_path / "home"
    home.mkdir()
    workdir = build_tree(image, root)
    assert not (workdir / "workers").exists()
    bin_dir = install(image, root, workdir, clean_env(root / "venv" / "bin", home, image))
    env = {
        **clean_env(bin_dir, home, image),
        "GPUPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'gpuplan.db'}",
        "GPUPLAN_REDIS_URL": REDIS_URL,
    }
    argv = ["gpuplan", "serve", "--host", "127.0.0.1", "--port", str(_free_port()), "--workers", "2"]
    served = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=90)
    assert served.returncode == 1, (served.stdout, served.stderr)
    assert served.stderr.strip().splitlines() == [
        "gpuplan: error: the API cannot start: No module named 'workers' "
        "(GPUPLAN_REDIS_URL is set: the workers package must be installed)"
    ]
