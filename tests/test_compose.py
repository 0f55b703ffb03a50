"""docker/compose.yaml, docker/Dockerfile and docker/prometheus read against the code (no
Docker here, so no container runs): every variable a Keel service sets is one the code reads,
every command is a manage.py command, the shared LocalFile volume is a file root of every
engine process under the settings that environment gives, the image has every package and the
examples, and Prometheus scrapes the web with the token the web is given."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
SOURCES = ("keel", "engine", "dashboard", "devcluster", "history")
ENGINE_SERVICES = ("web", "master-1", "master-2", "worker-1", "worker-2")


@cache
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def keel_services() -> dict[str, dict]:
    """The services that run Keel's image."""
    return {n: s for n, s in compose()["services"].items() if s.get("image") == "keel:latest"}


@cache
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [tuple(ln.split(None, 1)) for ln in lines]


def image_env() -> dict[str, str]:
    env = {}
    for instruction, args in dockerfile():
        if instruction == "ENV":
            env.update(pair.split("=", 1) for pair in args.split())
    return env


def workdir() -> Path:
    return Path(next(args for instruction, args in dockerfile() if instruction == "WORKDIR"))


def interpolate(value: str) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}``, with a stand-in
    for what the operator provides."""

    def one(match: re.Match) -> str:
        name, op, rest = match.group(1), match.group(2), match.group(3)
        return rest if op == ":-" else f"stand-in-{name.lower()}"

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, str(value))


@cache
def settings_under(service: str) -> dict:
    """The engine options a Keel service's process gets: keel.settings imported in a fresh
    interpreter with the image's and the service's environment only."""
    env = {**image_env(), **{k: interpolate(v) for k, v in service_env(service).items()}}
    env["PATH"] = os.environ["PATH"]
    script = (
        "import json; from keel import settings as s; "
        "print(json.dumps({k: s.ENGINE[k] for k in "
        "('connectors.file-roots', 'localfile.shared-storage', 'metrics.token')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def service_env(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in (compose()["services"][name].get("environment") or {}).items()}


def read_by_the_code(name: str) -> bool:
    quoted = (f'"{name}"', f"'{name}'")
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if any(q in text for q in quoted):
                return True
    return False


def test_every_variable_a_keel_service_sets_is_read_by_the_code():
    names = {n for service in keel_services() for n in service_env(service)}
    names |= set(image_env()) - {"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}
    unread = sorted(n for n in names if not read_by_the_code(n))
    assert not unread, f"set in docker/ but read nowhere in {SOURCES}: {unread}"


def test_every_command_is_a_manage_py_command():
    commands = [s["command"] for s in keel_services().values() if "command" in s]
    commands.append(json.loads(next(a for i, a in dockerfile() if i == "CMD")))
    known = get_commands()
    for command in commands:
        assert command[:2] == ["python", "manage.py"], command
        assert command[2] in known, f"manage.py has no command {command[2]!r}"
    services = keel_services()
    assert services["admin"]["command"][2] == "bootstrap_admin"


def test_the_shared_data_volume_is_a_file_root_of_every_engine_process():
    mounts = set()
    for name in ENGINE_SERVICES:
        data = [v for v in compose()["services"][name].get("volumes", []) if ":" in v]
        named = [v.split(":")[:2] for v in data if v.split(":")[0] in compose()["volumes"]]
        assert len(named) == 1, f"{name} mounts {data}"
        mounts.add(tuple(named[0]))
    assert len(mounts) == 1, f"not one volume at one path: {mounts}"
    ((_, path),) = mounts
    for name in ENGINE_SERVICES:
        options = settings_under(name)
        roots = [Path(r) for r in options["connectors.file-roots"]]
        assert any(Path(path).is_relative_to(r) for r in roots), (name, path, roots)
        assert options["localfile.shared-storage"] is True, name
    # The examples' LocalFile paths, relative to the image's working directory, are inside.
    for example in (ROOT / "examples").glob("*.conf"):
        for found in re.findall(r'^\s*path\s*=\s*"([^"]+)"', example.read_text(), re.M):
            resolved = found if found.startswith("/") else str(workdir() / found)
            assert Path(resolved).is_relative_to(path), (example.name, resolved)


def test_the_image_has_every_package_and_the_examples():
    copied = {args.split()[0] for instruction, args in dockerfile() if instruction == "COPY"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages == set(SOURCES)
    missing = (packages | {"examples", "templates", "static", "manage.py"}) - copied
    assert not missing, f"the Dockerfile does not COPY {sorted(missing)}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not (set(ignored) & (packages | {"examples"}))


def test_prometheus_runs_by_default_and_scrapes_the_web_with_its_token():
    services = compose()["services"]
    prometheus = services["prometheus"]
    assert "profiles" not in prometheus  # `docker compose up` starts it
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    (scrape,) = config["scrape_configs"]
    secret = scrape["authorization"]["credentials_file"].removeprefix("/run/secrets/")
    assert secret in prometheus["secrets"]
    assert compose()["secrets"][secret] == {"environment": "KEEL_METRICS_TOKEN"}
    assert service_env("web")["KEEL_METRICS_TOKEN"].startswith("${KEEL_METRICS_TOKEN:?")
    assert settings_under("web")["metrics.token"] == "stand-in-keel_metrics_token"
    (target,) = scrape["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in services and host in service_env(host)["DJANGO_ALLOWED_HOSTS"].split(",")
    cmd = json.loads(next(a for i, a in dockerfile() if i == "CMD"))
    assert cmd[cmd.index("--port") + 1] == port
    mounted = {v.split(":")[1] for v in prometheus["volumes"]}
    assert set(config["rule_files"]) <= mounted


def test_engine_processes_restart_on_failure_and_one_shots_do_not():
    services = compose()["services"]
    for name in ENGINE_SERVICES[1:]:
        # A drained worker exits 0 (engine.member.worker) and so stays out.
        assert services[name]["restart"] == "on-failure", name
    for name in ("migrate", "admin"):
        assert services[name].get("restart", "no") == "no", name
    assert services["admin"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
