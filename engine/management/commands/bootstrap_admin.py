"""``manage.py bootstrap_admin [--username admin] [--reset-password] [--reset-token]``: the
first login and API token of a fresh installation (docker compose's one-shot ``admin``
service), printed for whoever started it.

Idempotent: run again, it changes nothing and says so. A password is printed only when this
run set it (the user was created, or ``--reset-password``): an existing one is never read back,
and is not kept anywhere but as Django's hash. The API token is the user's current one (created
if missing, replaced with ``--reset-token``): it is printed every run, as it is what a client
needs and what ``./run cluster up`` keeps in ``.var/api-token``.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction
from rest_framework.authtoken.models import Token

from engine import roles


class Command(BaseCommand):
    help = "Create (or reset) the admin login and its API token, and print them"

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin", help="the admin's username (admin)")
        parser.add_argument(
            "--reset-password", action="store_true", help="set and print a new password"
        )
        parser.add_argument(
            "--reset-token", action="store_true", help="replace the API token with a new one"
        )

    def handle(self, *args, **opts):
        username = opts["username"]
        with transaction.atomic():
            roles.ensure_groups()
            user, created = get_user_model().objects.get_or_create(username=username)
            password = None
            if created or opts["reset_password"] or not user.has_usable_password():
                password = secrets.token_urlsafe(12)
                user.set_password(password)
            user.is_staff = user.is_superuser = user.is_active = True
            user.save()
            user.groups.add(Group.objects.get(name=roles.ADMIN))
            if opts["reset_token"]:
                Token.objects.filter(user=user).delete()
            token, new_token = Token.objects.get_or_create(user=user)
        self.stdout.write(f"Keel admin login: {username}")
        if password is not None:
            self.stdout.write(f"  password:  {password}   (set now: keep it)")
        else:
            self.stdout.write(
                "  password:  unchanged (not shown; --reset-password sets and prints a new one)"
            )
        state = "new" if new_token else "existing"
        self.stdout.write(f"  API token: {token.key}   ({state}; use as KEEL_API_TOKEN)")
