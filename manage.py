#!/usr/bin/env python
"""Django's command-line utility for Keel."""

import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Run one command; a service that is down, or a bad setting, is one line and an exit code."""
    argv = sys.argv if argv is None else argv
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
    from django.conf import settings

    from engine import process

    if not settings.configured:  # else a fork server or a control process chose already
        process.role = process.role_for(argv)
    try:
        if argv[1:2] == ["cluster"] and not settings.configured:
            from devcluster.early import start_early

            start_early(argv)  # `cluster up|start`: their processes start while Django does
        from django.core.exceptions import ImproperlyConfigured
        from django.core.management import execute_from_command_line
        from django.db import InterfaceError, OperationalError
        from kombu.exceptions import OperationalError as BrokerError
        from redis.exceptions import ConnectionError as RedisConnectionError
    except BaseException:
        _abandon_early()  # (Ctrl-C before the command could take them over)
        raise

    try:
        try:
            execute_from_command_line(argv)
        except BaseException:
            _abandon_early()
            raise
    except ImproperlyConfigured as exc:
        print(f"error: configuration: {exc}", file=sys.stderr)
        sys.exit(2)
    except (OperationalError, InterfaceError) as exc:
        # A service went away mid-command: one clear line, no traceback.
        from engine.services import EXIT_SERVICE_DOWN, postgres_error_line

        print(postgres_error_line(settings.DATABASE_URL, exc), file=sys.stderr)
        sys.exit(EXIT_SERVICE_DOWN)
    except (BrokerError, RedisConnectionError) as exc:
        from engine.services import EXIT_SERVICE_DOWN, redis_error_line

        print(redis_error_line(settings.REDIS_URL, exc), file=sys.stderr)
        sys.exit(EXIT_SERVICE_DOWN)


def _abandon_early() -> None:
    """Stop what ``cluster up|start`` started before Django, if the command never took it over
    (devcluster.early)."""
    if "KEEL_CLUSTER_STARTED_EARLY" in os.environ:
        from devcluster.early import abandon

        abandon()


if __name__ == "__main__":
    main()
