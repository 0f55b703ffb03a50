"""Django settings for Keel.

Everything comes from environment variables with working local defaults, so a fresh clone runs
with `./run demo`. Production (``KEEL_PRODUCTION=1``) refuses to start without a real secret key
and turns on the transport-security settings that ``manage.py check --deploy`` asks for.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from engine import process as process_role
from keel.dburl import database_settings
from keel.links import BROKER_TRANSPORT_OPTIONS, REDIS_LINK_CHECKS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("KEEL_VAR_DIR", BASE_DIR / ".var"))

PRODUCTION = os.environ.get("KEEL_PRODUCTION", "") == "1"
DEBUG = os.environ.get("DJANGO_DEBUG", "0" if PRODUCTION else "1") == "1"

DEFAULT_DATABASE_URL = "postgres://127.0.0.1:5432/keel"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DATABASE_URL = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
REDIS_URL = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)

#: The name of this OS process inside the cluster (``master-1``, ``worker-2``, ``web``); it
#: becomes the PostgreSQL ``application_name`` so sessions can be told apart in pg_stat_activity.
PROCESS_NAME = os.environ.get("KEEL_PROCESS_NAME", "keel")


def _duration(name: str, text: str) -> float:
    """Seconds from ``500ms``, ``90s``, ``10m``, ``2h``, ``7d`` or a bare number of seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", text)
    if not match:
        raise ImproperlyConfigured(f"{name}: {text!r} is not a duration (e.g. 10m, 90s, 500ms)")
    factor = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}[match.group(2)]
    return float(match.group(1)) * factor


def _seconds(name: str, default: str) -> float:
    """A duration from the environment (``_duration``'s forms), else ``default``."""
    return _duration(name, os.environ.get(name, default))


def _at_least(name: str, default: str, minimum: float) -> float:
    """A duration from the environment, refused at startup below ``minimum`` seconds (zero
    would re-run a recovery step on every pass, or reconcile one still in flight)."""
    value = _seconds(name, default)
    if value < minimum:
        raise ImproperlyConfigured(f"{name}: {value:g}s is below the minimum of {minimum:g}s")
    return value


def _count(name: str, default: str, minimum: int = 0) -> int:
    """A whole number from the environment, refused at startup if it is not one or is below
    ``minimum`` (a negative history size, say, would silently keep nothing)."""
    text = os.environ.get(name, default)
    try:
        value = int(text)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: {text!r} is not a whole number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}: {value} is below the minimum of {minimum}")
    return value


def _bytes(name: str, default: str) -> int:
    """Bytes from ``4MiB``, ``256KiB``, ``512KB``, ``1GiB`` or a bare number, from the
    environment (refused at startup otherwise)."""
    text = os.environ.get(name, default)
    match = re.fullmatch(r"\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*", text)
    if not match:
        raise ImproperlyConfigured(f"{name}: {text!r} is not a size (e.g. 4MiB, 256KiB)")
    unit = {
        None: 1,
        "B": 1,
        "KB": 1000,
        "KiB": 1024,
        "MB": 1000**2,
        "MiB": 1024**2,
        "GB": 1000**3,
        "GiB": 1024**3,
    }[match.group(2)]
    return int(match.group(1)) * unit


def _flag(name: str, default: str) -> bool:
    """true/false (also 1/0, yes/no, on/off) from the environment, refused at startup
    otherwise: a misspelt value must not silently turn an option off."""
    text = os.environ.get(name, default).strip().lower()
    if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ImproperlyConfigured(f"{name}: {text!r} is not true or false")
    return text in ("1", "true", "yes", "on")


def _names(name: str, default: str) -> list[str]:
    """A comma-separated list from the environment, blanks dropped."""
    return [p.strip() for p in os.environ.get(name, default).split(",") if p.strip()]


def _networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Addresses or networks (comma-separated) from the environment, refused at startup if one
    is neither."""
    networks = []
    for text in _names(name, ""):
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name}: {text!r} is not an address or network (e.g. 10.0.0.5, 10.0.0.0/8): {exc}"
            ) from None
    return tuple(networks)


def _secret_key() -> str:
    key = os.environ.get("DJANGO_SECRET_KEY")
    if key:
        return key
    if PRODUCTION:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when KEEL_PRODUCTION=1")
    # Local development: a random key kept (mode 600) under .var/, never committed.
    path = VAR_DIR / "secret-key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    except OSError:
        return secrets.token_urlsafe(50)
    # Several processes of a new cluster may get here at once: the key is written whole to a
    # file of this process's own, then linked into place; whoever links first wins, and the
    # others read the winner's (never an empty file half-written).
    try:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        mine = VAR_DIR / f".secret-key.{os.getpid()}"
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(50))
        try:
            os.link(mine, path)
        except FileExistsError:
            pass
        finally:
            mine.unlink()
        return path.read_text().strip()
    except OSError:
        return secrets.token_urlsafe(50)


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")
    if h.strip()
]

#: The apps of an engine process (engine.process): what masters and workers use, nothing more.
ENGINE_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "engine",
    "history",
]

FULL_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/v1/docs, served by this site
    "channels",
    "axes",
    "engine",
    "history",
    "dashboard",
    "devcluster",
]

INSTALLED_APPS = {
    process_role.ENGINE: ENGINE_APPS,
    process_role.CLUSTER: [*ENGINE_APPS, "devcluster"],
}.get(process_role.role, FULL_APPS)

#: Reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (engine.clientaddr);
#: from any other caller they are ignored, so no caller can claim another address.
TRUSTED_PROXIES = _networks("KEEL_TRUSTED_PROXIES")

MIDDLEWARE = [
    # First: REMOTE_ADDR is the caller as resolved through trusted proxies for all that follows.
    "engine.clientaddr.ForwardedHeadersMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: it answers a locked-out login itself.
    "axes.middleware.AxesMiddleware",
]

#: Failed logins are rate-limited (django-axes): after AXES_FAILURE_LIMIT failures for one
#: username from one address, logins of that pair are refused for AXES_COOLOFF_TIME. API tokens
#: are not passwords and are not counted.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("KEEL_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("KEEL_LOGIN_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "engine.clientaddr.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

ROOT_URLCONF = "keel.urls"
if process_role.role != process_role.FULL:
    # No requests, no logins: nothing of the web stack is loaded, not even by the checks that
    # Celery's Django fixup runs when a worker's consumer starts.
    MIDDLEWARE = []
    AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
    ROOT_URLCONF = "keel.no_urls"
ASGI_APPLICATION = "keel.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_db = database_settings(DATABASE_URL)  # libpq's multi-host form too (keel.dburl)
_db["OPTIONS"] = {
    **_db["OPTIONS"],  # the URL's own (sslmode, target_session_attrs)
    "application_name": f"keel:{PROCESS_NAME}:{os.getpid()}",
    # TCP keepalives: a half-open connection (peer vanished without FIN) is noticed in seconds,
    # so it cannot keep a session advisory lock (leadership, membership) alive for long.
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,  # a link dead with data in flight, unprobed by keepalives (0037)
    "connect_timeout": 3,
}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "engine.api.permissions.HasRole",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "engine.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Keel API",
    "DESCRIPTION": "Fault-tolerant data-integration engine: cluster, jobs and recovery state.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["engine.api.permissions.HasRole"],  # signed in, as a viewer at least
    # Swagger UI (/api/v1/docs) from this site's static files, no CDN, no validator badge.
    **dict.fromkeys(["SWAGGER_UI_DIST", "SWAGGER_UI_FAVICON_HREF"], "SIDECAR"),
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # The layer waits on Redis with BZPOPMIN for 5 s; redis-py's own default read timeout is
        # also 5 s, which would end idle sockets: reads get longer, connects stay short.
        "CONFIG": {
            "hosts": [
                {"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 3}
                | REDIS_LINK_CHECKS
            ]
        },
    }
}

# Celery: Redis broker. Commands to one member travel on ``member.<name>``; durable control
# steps on ``control`` (acks_late, and always backed by a PostgreSQL row — see engine/tasks.py).
CELERY_BROKER_URL = CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = BROKER_TRANSPORT_OPTIONS  # bounded calls, checked links
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_RESULT_EXPIRES = 3600
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

#: Engine options (``engine.*``); each can be overridden by the process's command-line flags.
ENGINE = {
    "heartbeat-interval": float(os.environ.get("KEEL_HEARTBEAT_INTERVAL", "1.0")),
    "heartbeat-timeout": float(os.environ.get("KEEL_HEARTBEAT_TIMEOUT", "5.0")),
    "master-lease-timeout": float(os.environ.get("KEEL_MASTER_LEASE_TIMEOUT", "3.0")),
    # How long an engine process rides out an unreachable database (a restart, a network
    # blip): it reconnects with backoff, members keep their identity, nothing is restored.
    "database-outage-tolerance": _duration(
        "KEEL_DATABASE_OUTAGE_TOLERANCE", os.environ.get("KEEL_DATABASE_OUTAGE_TOLERANCE", "30s")
    ),
    # Retention (engine.retention, the active master's durable sweeps): events by age and by
    # count; REMOVED/LEFT members with their slots, DONE control steps and the split
    # assignments of ended jobs once this old.
    "retention.events-age": _duration(
        "KEEL_RETENTION_EVENTS_AGE", os.environ.get("KEEL_RETENTION_EVENTS_AGE", "7d")
    ),
    "retention.events-count": _count("KEEL_RETENTION_EVENTS_COUNT", "1000000", minimum=1),
    "retention.ended-age": _duration(
        "KEEL_RETENTION_ENDED_AGE", os.environ.get("KEEL_RETENTION_ENDED_AGE", "1d")
    ),
    # Checkpointed LocalFile sinks keep their pending parts under the sink's path until a
    # checkpoint commits them; on workers of several hosts that path must be storage every
    # host mounts at the same place. Set true once it is; until then such jobs are refused.
    "localfile.shared-storage": os.environ.get("KEEL_LOCALFILE_SHARED_STORAGE", "false").lower()
    in ("1", "true", "yes"),
    # Where jobs' connectors may reach (engine.connectors.boundaries): directories for
    # LocalFile (os.pathsep-separated), and host[:port][/database] patterns for Jdbc URLs
    # written in a config (comma-separated; "loopback" is every loopback address). The
    # engine's own database is refused whatever these say.
    "connectors.file-roots": [
        str(BASE_DIR / p) if not os.path.isabs(p) else p
        for p in os.environ.get(
            "KEEL_CONNECTORS_FILE_ROOTS", os.pathsep.join([str(VAR_DIR / "data"), "examples"])
        ).split(os.pathsep)
        if p
    ],
    # Set for the web process by `manage.py web`: plans that connect to databases (Jdbc
    # checks) are made by a worker, so the web process opens no connection a job names.
    "connectors.check-in-workers": os.environ.get("KEEL_CHECK_IN_WORKERS", "") == "1",
    "connectors.check-timeout": _duration(
        "KEEL_CHECK_TIMEOUT", os.environ.get("KEEL_CHECK_TIMEOUT", "20s")
    ),
    "connectors.jdbc-allowed": _names("KEEL_CONNECTORS_JDBC_ALLOWED", "loopback"),
    # Terminal-state cleanup (engine.jobs.cleanup): a finished job's running state stays this
    # long for late callbacks, then a durable cleanup record removes it; failures retry with
    # backoff up to max-attempts (then FAILED, retried from the admin); a record waiting for
    # its job's history spends none. The Celery countdown sent when a job ends is a hint
    # (job-state-cleanup.hint): off, the active master's sweep alone delivers records. History
    # is removed after history.retention, through the same kind of record.
    "job-state-cleanup-delay": _duration(
        "KEEL_JOB_STATE_CLEANUP_DELAY", os.environ.get("KEEL_JOB_STATE_CLEANUP_DELAY", "60s")
    ),
    "job-state-cleanup.max-attempts": _count(
        "KEEL_JOB_STATE_CLEANUP_MAX_ATTEMPTS", "10", minimum=1
    ),
    "job-state-cleanup.hint": _flag("KEEL_JOB_STATE_CLEANUP_HINT", "true"),
    # Recovery's durable intents (engine.master.control): a control step not DONE this long
    # after it was enqueued is enqueued again (its message or its runner was lost); the
    # master's housekeeping reconciles only attempts and episodes left alone this long.
    "control-step.requeue-after": _at_least("KEEL_CONTROL_STEP_REQUEUE_AFTER", "10s", 0.5),
    "housekeeping.settle": _at_least("KEEL_HOUSEKEEPING_SETTLE", "10s", 0.5),
    "history.retention": _duration(
        "KEEL_HISTORY_RETENTION", os.environ.get("KEEL_HISTORY_RETENTION", "7d")
    ),
    # Bounds on one job config (engine.hocon, engine.jobs.planner): its size in bytes, how
    # deep its objects and lists nest, and its readers (pipelines x parallelism).
    "config.max-bytes": _count("KEEL_CONFIG_MAX_BYTES", "262144", minimum=1),
    "config.max-depth": _count("KEEL_CONFIG_MAX_DEPTH", "32", minimum=1),
    "config.max-readers": _count("KEEL_CONFIG_MAX_READERS", "256", minimum=1),
    # Who may scrape GET /metrics besides a viewer's token or session: loopback callers (off by
    # default in production: behind a proxy every caller looks local) and a bearer token.
    "metrics.loopback": os.environ.get("KEEL_METRICS_LOOPBACK", "0" if PRODUCTION else "1")
    in ("1", "true", "yes"),
    "metrics.token": os.environ.get("KEEL_METRICS_TOKEN", ""),
    # Planned leaves (engine.jobs.drain, graceful_close): README's configuration says what.
    "drain.timeout": _duration("KEEL_DRAIN_TIMEOUT", os.environ.get("KEEL_DRAIN_TIMEOUT", "10m")),
    "drain.graceful-close-timeout": _seconds("KEEL_DRAIN_GRACEFUL_CLOSE_TIMEOUT", "30s"),
    # Dirty-job tracking (engine.dirty): recent episodes kept per job, and how long an episode
    # may wait without any deployment before it is aborted as stale (a duration: 10m, 90s, 2h).
    "dirty-task.event-history-size": _count("KEEL_DIRTY_TASK_EVENT_HISTORY_SIZE", "10"),
    "dirty-task.pending-incident-ttl": _duration(
        "KEEL_DIRTY_TASK_PENDING_INCIDENT_TTL",
        os.environ.get("KEEL_DIRTY_TASK_PENDING_INCIDENT_TTL", "10m"),
    ),
    # The engine-managed Source runtime (docs/source-runtime.md): which connectors run in the
    # managed lane (Lane A; none by default), its kill switch (new deployments and restores
    # only), and its bounds. Not connector-overridable; read once at process start.
    "source-runtime.managed-enabled": os.environ.get(
        "KEEL_SOURCE_RUNTIME_MANAGED_ENABLED", "true"
    ).lower()
    in ("1", "true", "yes"),
    "source-runtime.managed-connectors": _names("KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS", ""),
    # The data plane's batches (engine.connectors.batches): at most this many rows and about
    # this many bytes each, so a worker's memory stays flat whatever a row's width.
    "dataplane.batch-rows": _count("KEEL_DATAPLANE_BATCH_ROWS", "16384", minimum=1),
    "dataplane.batch-bytes": _bytes("KEEL_DATAPLANE_BATCH_BYTES", "8MiB"),
    # Task groups' log lines kept in PostgreSQL for the job page and the API
    # (engine.member.tasklog_shipping): the newest this many per task group.
    "logs.lines-per-task-group": _count("KEEL_LOGS_LINES_PER_TASK_GROUP", "1000", minimum=1),
}


def _positive(name: str, default: str) -> int:
    return _count(name, default, minimum=1)


#: The managed Source runtime's bounds: (option under ``source-runtime.``, how read, default).
SOURCE_RUNTIME_BOUNDS = (
    ("mailbox.max-commands", _positive, "1024"),
    ("mailbox.max-bytes", _bytes, "4MiB"),
    ("mailbox.reserved-commands", _positive, "64"),
    ("mailbox.reserved-bytes", _bytes, "256KiB"),
    ("worker-mailbox.max-bytes", _bytes, "256MiB"),
    ("command.max-payload-bytes", _bytes, "512KiB"),
    ("poll.max-records", _positive, "64"),
    ("poll.soft-duration", _seconds, "5ms"),
    ("poll.hard-duration", _seconds, "1s"),
    ("poll.cancellation-timeout", _seconds, "30s"),
    ("schema-change.timeout", _seconds, "60s"),
    ("admission.p99-budget", _seconds, "5ms"),
    ("retry.initial-backoff", _seconds, "10ms"),
    ("retry.max-backoff", _seconds, "1s"),
    ("coordinator.async-max-concurrency", _positive, "4"),
    ("source-events.interval", _seconds, "1s"),  # a reader's SOURCE_EVENTs, at most this often
    ("tracker.max-entries", _positive, "100000"),
    ("tracker.max-bytes", _bytes, "64MiB"),
    ("discovery.max-pending", _positive, "10000"),  # new files waiting for a reader
    ("assignment.max-reader-splits", _positive, "1000"),  # held by a reader that reports
)
for _option, _read, _default in SOURCE_RUNTIME_BOUNDS:
    _env = "KEEL_SOURCE_RUNTIME_" + re.sub(r"[.-]", "_", _option).upper()
    ENGINE[f"source-runtime.{_option}"] = _read(_env, _default)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django": {"level": "WARNING"},
        "celery": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}

if PRODUCTION:
    SECURE_SSL_REDIRECT = os.environ.get("KEEL_SSL_REDIRECT", "1") == "1"
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("KEEL_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"
