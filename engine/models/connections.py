"""Named connections: credentials an admin stores so job configs need not carry them."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models.functions import Now


def _fernet() -> Fernet:
    """The key is derived from SECRET_KEY (a rotation of it needs the passwords set again)."""
    digest = hashlib.sha256(b"keel-connection-secrets:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


class Connection(models.Model):
    """A database a job may name (``connection = "warehouse"``): its URL, user and password.
    The password is encrypted at rest and never returned by the API."""

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[RegexValidator(r"^[A-Za-z0-9_.\-]+$", "letters, digits, '_', '.' or '-'")],
    )
    url = models.CharField(max_length=500, help_text="jdbc:postgresql://host:port/database")
    user = models.CharField(max_length=200)
    password_encrypted = models.TextField(blank=True, default="", editable=False)
    description = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_password(self, raw: str) -> None:
        self.password_encrypted = _fernet().encrypt(raw.encode()).decode() if raw else ""

    def password(self) -> str:
        if not self.password_encrypted:
            return ""
        try:
            return _fernet().decrypt(self.password_encrypted.encode()).decode()
        except InvalidToken:
            raise ValueError(
                f"the password of connection {self.name!r} cannot be decrypted (was the secret "
                "key changed?): set it again in the admin"
            ) from None
