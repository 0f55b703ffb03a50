#!/usr/bin/env python
"""Django's command-line utility for Keel."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
    from django.core.management import execute_from_command_line
    from django.db import OperationalError

    try:
        execute_from_command_line(sys.argv)
    except OperationalError as exc:
        # A service went away mid-command: one clear line, no traceback.
        from django.conf import settings

        from keel.services import EXIT_SERVICE_DOWN, mask_url

        reason = (str(exc).strip().splitlines() or ["database error"])[-1]
        print(f"error: PostgreSQL at {mask_url(settings.DATABASE_URL)}: {reason}", file=sys.stderr)
        sys.exit(EXIT_SERVICE_DOWN)


if __name__ == "__main__":
    main()
