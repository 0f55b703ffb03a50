"""A password inside a Jdbc URL (a pgJDBC or Connector/J parameter, or the userinfo) is a
secret like a ``password`` option: the stored config text never holds it."""

from __future__ import annotations

from engine.redaction import REDACTED, redact_config


def test_url_parameters_that_are_secrets_are_redacted():
    text = 'url = "jdbc:postgresql://h:5432/db?user=a&password=s3cret&sslpassword=k3y&ssl=true"'
    assert redact_config(text) == (
        f'url = "jdbc:postgresql://h:5432/db?user=a&password={REDACTED}'
        f'&sslpassword={REDACTED}&ssl=true"'
    )


def test_a_urls_userinfo_password_is_redacted_and_the_user_kept():
    assert redact_config('url = "jdbc:mysql://bob:pw1@h:3306/db"') == (
        f'url = "jdbc:mysql://bob:{REDACTED}@h:3306/db"'
    )


def test_substitutions_and_urls_without_secrets_are_left_alone():
    text = 'url = "jdbc:mysql://h:3306/db?password=${PW}&useSSL=false"\nport = "h:1"'
    assert redact_config(text) == text
