"""A password inside a Jdbc URL (a pgJDBC or Connector/J parameter, or the userinfo) is a
secret like a ``password`` option: the stored config text never holds it."""

from __future__ import annotations

import pytest

from engine.connectors.jdbc_url import parse_jdbc_url
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


def test_a_password_with_a_slash_question_mark_or_at_sign_is_redacted_whole():
    for password in ("pa/ss", "pa?ss", "p@ss/w?rd"):
        text = f'url = "jdbc:mysql://bob:{password}@h:3306/db?useSSL=true"'
        assert redact_config(text) == f'url = "jdbc:mysql://bob:{REDACTED}@h:3306/db?useSSL=true"'


def test_no_part_of_an_unencoded_password_shows_in_a_url_error():
    for url in (
        "jdbc:postgresql://bob:pa/zq7@h:5432/db",
        "jdbc:postgresql://bob:pa?zq7@h:5432/db",
        "jdbc:postgresql://bob:12/zq7@h:5432/db",
        "jdbc:postgresql://bob:12?zq7@h:5432/db",
    ):
        with pytest.raises(ValueError) as caught:
            parse_jdbc_url(url)
        assert "percent-encode" in str(caught.value)
        assert "zq7" not in str(caught.value) and "bob" not in str(caught.value)
    # Without userinfo a bad port is still named.
    with pytest.raises(ValueError, match="bad port 'x5' of host 'h'"):
        parse_jdbc_url("jdbc:postgresql://h:x5/db")
